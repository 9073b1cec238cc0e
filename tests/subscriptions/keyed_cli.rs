//! `ordo subscriptions` on a keyed subscription with a stalled key: the table and JSON show
//! it, `stalled` lists it, and `retry-keys` resumes it. `ordo dead-letters` on a keyed
//! subscription's dead letter: a pending retry is listed, and the runner takes it.
#![cfg(feature = "cli")]

use crate::common;

use std::time::Duration;

use common::keyed::{Ledger, Parcel, assert_once_each, effects, effects_table, publish};
use common::subscribers::{PATIENCE, fast_retries};
use common::{TestDb, eventually};
use ordo::{JobConfig, OnExhaustion, Outbox, OutboxConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_see_a_stalled_key_and_retry_it_from_the_command_line() {
    let db = TestDb::new().await;
    effects_table(&db.pool).await;
    let outbox = Outbox::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let ledger = Ledger::default();
    ledger.behaviour.fail("bob", true);
    let config = JobConfig::new("mailer").keyed(4).retry(fast_retries(2));
    let handle = outbox
        .subscribe(config, ledger.clone())
        .await
        .expect("subscribe");
    publish(
        &outbox,
        [
            Parcel::new(0, &["bob"]),
            Parcel::new(1, &["alice"]),
            Parcel::new(2, &["bob"]),
        ],
    )
    .await;
    let (status, stalled) = handle.wait_for(PATIENCE, |s| s.stalled.len() == 1).await;
    assert!(stalled, "{status:?}");
    assert!(eventually(PATIENCE, || async { effects(&db.pool).await.len() == 1 }).await);

    let (ok, table, _) = db.ordo(&["subscriptions"]);
    assert!(ok);
    let line = table
        .lines()
        .find(|l| l.starts_with("mailer"))
        .expect("mailer's row");
    assert!(
        line.contains("key \"bob\" stalled at 1: parcel 0 fails"),
        "{table}"
    );
    let (ok, listed, _) = db.ordo(&["subscriptions", "stalled", "mailer"]);
    assert!(
        ok && listed.lines().any(|l| l.starts_with("bob")),
        "{listed}"
    );
    let (_, json, _) = db.ordo(&["subscriptions", "stalled", "mailer", "--json"]);
    let key: serde_json::Value = serde_json::from_str(json.trim()).expect("one JSON key");
    assert_eq!(
        (key["key"].as_str(), key["attempts"].as_u64()),
        (Some("bob"), Some(2))
    );

    let (ok, _, error) = db.ordo(&["subscriptions", "retry-keys", "mailer"]);
    assert!(!ok, "a key or --all is required: {error}");
    ledger.behaviour.fail("bob", false);
    let (ok, _, said) = db.ordo(&["subscriptions", "retry-keys", "mailer", "bob"]);
    assert!(ok, "{said}");
    assert!(said.contains("1 stalled events"), "{said}");
    let (status, resumed) = handle
        .wait_for(PATIENCE, |s| s.position.get() == 3 && s.stalled.is_empty())
        .await;
    assert!(resumed, "{status:?}");
    // The stalled event, then its key's backlog.
    assert!(eventually(PATIENCE, || async { effects(&db.pool).await.len() == 3 }).await);
    handle.shutdown().await;
    let (ok, _, error) = db.ordo(&["subscriptions", "stalled", "nope"]);
    assert!(
        !ok && error.contains("no subscription or relay named \"nope\""),
        "{error}"
    );
}

/// The dead letters `ordo dead-letters --json` lists for `name`.
fn dead_letters_json(db: &TestDb, name: &str) -> Vec<serde_json::Value> {
    let (ok, json, error) = db.ordo(&["dead-letters", "list", "--subscription", name, "--json"]);
    assert!(ok, "{error}");
    json.lines()
        .map(|line| serde_json::from_str(line).expect("a JSON dead letter"))
        .collect()
}

/// A keyed subscription dead-letters a poisoned event of key `bob` and goes on with bob's next
/// one. Retried from the CLI while no runner runs, the request is listed as pending (table,
/// `--json`, `list_dead_letters`); a runner takes it on claiming. Retried while one runs, it is
/// taken within a third of the lease, as the serial runner's. Each event takes effect once and
/// the dead letters go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_dead_letter_retried_from_the_command_line_takes_effect_once() {
    let db = TestDb::new().await;
    effects_table(&db.pool).await;
    let outbox = Outbox::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let ledger = Ledger::default();
    ledger.behaviour.fail("poison", true);
    // The default lease: the promise is a third of it.
    let lease = Duration::from_secs(30);
    let config = || {
        JobConfig::new("mailer")
            .keyed(4)
            .lease(lease)
            .retry(fast_retries(2))
            .on_exhaustion(OnExhaustion::DeadLetter)
    };
    let handle = outbox
        .subscribe(config(), ledger.clone())
        .await
        .expect("subscribe");
    publish(
        &outbox,
        [
            Parcel::new(0, &["bob", "poison"]),
            Parcel::new(1, &["alice"]),
            Parcel::new(2, &["bob"]),
        ],
    )
    .await;
    let (status, passed) = handle.wait_for(PATIENCE, |s| s.position.get() == 3).await;
    assert!(
        passed,
        "bob's poisoned event is dead-lettered, the rest handled: {status:?}"
    );
    assert_eq!(effects(&db.pool).await.len(), 2);
    handle.shutdown().await;

    // Retried while no runner runs: pending, and shown as such.
    ledger.behaviour.fail("poison", false);
    let listed = dead_letters_json(&db, "mailer");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(listed[0]["retry_requested_at"].is_null());
    let id = listed[0]["id"].as_i64().expect("an id");
    let (ok, _, said) = db.ordo(&["dead-letters", "retry", &id.to_string()]);
    assert!(ok, "{said}");
    let (ok, table, error) = db.ordo(&["dead-letters"]);
    assert!(ok, "{error}");
    let line = table
        .lines()
        .find(|line| line.trim_start().starts_with(&id.to_string()))
        .expect("the dead letter's line");
    assert!(
        line.contains("pending"),
        "a pending retry is shown: {table}"
    );
    assert!(
        !dead_letters_json(&db, "mailer")[0]["retry_requested_at"].is_null(),
        "--json shows when the retry was asked for"
    );
    let letters = ordo::admin::list_dead_letters(&db.pool, Some("mailer"))
        .await
        .expect("list");
    assert!(letters[0].retry_requested_at.is_some(), "{letters:?}");

    // A runner takes it.
    let handle = outbox
        .subscribe(config(), ledger.clone())
        .await
        .expect("subscribe again");
    assert!(
        eventually(PATIENCE, || async {
            dead_letters_json(&db, "mailer").is_empty()
        })
        .await,
        "the runner took the pending retry"
    );
    assert_eq!(effects(&db.pool).await.len(), 3);

    // Retried while the runner runs: taken within a third of its lease (and some slack for a
    // loaded machine), where it used to stay pending for good.
    ledger.behaviour.fail("poison", true);
    publish(
        &outbox,
        [
            Parcel::new(3, &["carol", "poison"]),
            Parcel::new(4, &["carol"]),
        ],
    )
    .await;
    let (status, passed) = handle.wait_for(PATIENCE, |s| s.position.get() == 5).await;
    assert!(passed, "{status:?}");
    assert_eq!(dead_letters_json(&db, "mailer").len(), 1);
    ledger.behaviour.fail("poison", false);
    let (ok, _, said) = db.ordo(&["dead-letters", "retry", "--subscription", "mailer"]);
    assert!(ok && said.contains("1 dead letters"), "{said}");
    let promised = lease / 3 + Duration::from_secs(5);
    assert!(
        eventually(promised, || async {
            ordo::admin::list_dead_letters(&db.pool, Some("mailer"))
                .await
                .is_ok_and(|letters| letters.is_empty())
        })
        .await,
        "a running keyed runner takes a retry within a third of its lease"
    );
    handle.shutdown().await;
    assert_once_each(&db.pool).await;
    assert_eq!(
        handle.status().position.get(),
        5,
        "a retry moves no position"
    );
}
