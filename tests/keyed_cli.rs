//! `ordo subscriptions` on a keyed subscription with a stalled key: the table and JSON show
//! it, `stalled` lists it, and `retry-keys` resumes it.
#![cfg(feature = "cli")]

mod common;

use common::keyed::{Ledger, Parcel, effects, effects_table, publish};
use common::subscribers::{PATIENCE, fast_retries};
use common::{TestDb, eventually};
use ordo::{JobConfig, Outbox, OutboxConfig};

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
    assert_eq!(effects(&db.pool).await.len(), 3);
    handle.shutdown().await;
    let (ok, _, error) = db.ordo(&["subscriptions", "stalled", "nope"]);
    assert!(
        !ok && error.contains("no subscription or relay named \"nope\""),
        "{error}"
    );
}
