//! An operator's view of stuck keys' backlogs from the command line: `ordo status` in each of
//! its forms says what is stuck and how much waits behind it (`--check` fails while it does),
//! `ordo subscriptions backlog` lists it per key, and `skip-stalled` / `purge-backlog` ask for
//! a confirmation, drop exactly what they say, are recorded, and let the key flow again.
#![cfg(feature = "cli")]

use crate::common;

use common::keyed::{Ledger, Parcel, effects_table, publish};
use common::subscribers::{PATIENCE, fast_retries};
use common::{TestDb, eventually};
use ordo::{JobConfig, OnExhaustion, Outbox, OutboxConfig};

async fn effects_of(db: &TestDb, key: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM effects WHERE $1 = ANY(keys)")
        .bind(key)
        .fetch_one(&db.pool)
        .await
        .expect("effects")
}

async fn backlog_rows(db: &TestDb) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM ordo.key_backlogs")
        .fetch_one(&db.pool)
        .await
        .expect("backlog")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_see_a_stuck_keys_backlog_and_skip_or_purge_it_with_a_confirmation() {
    let db = TestDb::new().await;
    effects_table(&db.pool).await;
    let outbox: Outbox<Parcel> = Outbox::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let ledger = Ledger::default();
    ledger.behaviour.fail("bad", true);
    ledger.behaviour.fail("worse", true);
    let config = JobConfig::new("mailer")
        .keyed(2)
        .keyed_window(8)
        .retry(fast_retries(1))
        .on_exhaustion(OnExhaustion::Halt);
    let handle = outbox
        .subscribe(config, ledger.clone())
        .await
        .expect("subscribe");
    let parcels = (0..60).map(|id| {
        let key = ["bad", "worse", "good"][id as usize % 3];
        Parcel::new(id, &[key])
    });
    publish(&outbox, parcels).await;
    assert!(eventually(PATIENCE, || async { effects_of(&db, "good").await == 20 }).await);
    assert!(eventually(PATIENCE, || async { backlog_rows(&db).await == 40 }).await);

    // `ordo status`: one STUCK line naming the backlog; --check fails; JSON and Prometheus
    // carry the figures.
    let (ok, text, _) = db.ordo(&["status"]);
    assert!(ok);
    let stuck = text
        .lines()
        .find(|line| line.starts_with("STUCK subscription \"mailer\""))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        stuck.contains("with 40 event(s) of 2 key(s)")
            && stuck.contains("ordo subscriptions backlog mailer"),
        "{stuck}"
    );
    let (ok, _, said) = db.ordo(&["status", "--check"]);
    assert!(!ok && said.contains("status check failed"), "{said}");
    let (_, json, _) = db.ordo(&["status", "--json"]);
    let status: serde_json::Value = serde_json::from_str(json.trim()).expect("JSON");
    let mailer = &status["subscriptions"][0];
    assert_eq!(mailer["backlog"]["events"], 40, "{mailer}");
    assert_eq!(mailer["backlog"]["keys"], 2, "{mailer}");
    let (_, prometheus, _) = db.ordo(&["status", "--prometheus"]);
    assert!(
        prometheus.contains(
            "ordo_subscription_backlog_events{subscription=\"mailer\",lane=\"insert\"} 40"
        ),
        "{prometheus}"
    );
    let (ok, table, _) = db.ordo(&["subscriptions", "backlog", "mailer"]);
    assert!(ok);
    assert!(
        table
            .lines()
            .any(|line| line.starts_with("bad") && line.contains(" 20 ")),
        "{table}"
    );

    // Skip: refused without --yes, nothing dropped; with it, the stalled event goes, recorded,
    // and the rest of the key's backlog is delivered in order.
    ledger.behaviour.fail("bad", false);
    let (ok, _, said) = db.ordo(&["subscriptions", "skip-stalled", "mailer", "bad"]);
    assert!(
        !ok && said.contains("--yes") && said.contains("19 other event(s)"),
        "{said}"
    );
    assert_eq!(backlog_rows(&db).await, 40);
    let (ok, _, said) = db.ordo(&["subscriptions", "skip-stalled", "mailer", "bad", "--yes"]);
    assert!(ok && said.contains("1 event(s) dropped"), "{said}");
    assert!(eventually(PATIENCE, || async { effects_of(&db, "bad").await == 19 }).await);

    // Purge: the whole backlog of "worse" goes, recorded; its next event is delivered.
    let (ok, _, said) = db.ordo(&["subscriptions", "purge-backlog", "mailer", "worse"]);
    assert!(!ok && said.contains("all 20 event(s)"), "{said}");
    let (ok, _, said) = db.ordo(&["subscriptions", "purge-backlog", "mailer", "worse", "--yes"]);
    assert!(ok && said.contains("20 event(s) dropped"), "{said}");
    ledger.behaviour.fail("worse", false);
    publish(&outbox, [Parcel::new(60, &["worse"])]).await;
    let delivered = eventually(PATIENCE, || async { effects_of(&db, "worse").await == 1 }).await;
    if !delivered {
        let rows: Vec<(i64, Vec<String>)> =
            sqlx::query_as("SELECT position, keys FROM ordo.key_backlogs ORDER BY position")
                .fetch_all(&db.pool)
                .await
                .expect("rows");
        let progress: Vec<(i64, String, Option<chrono::DateTime<chrono::Utc>>)> = sqlx::query_as(
            "SELECT position, state, retry_requested_at FROM ordo.subscription_progress ORDER BY position",
        )
        .fetch_all(&db.pool)
        .await
        .expect("progress");
        panic!(
            "backlog {rows:?} progress {progress:?} status {:?}",
            handle.status()
        );
    }
    assert_eq!(backlog_rows(&db).await, 0);
    let (status, clear) = handle
        .wait_for(PATIENCE, |status| status.stalled.is_empty())
        .await;
    assert!(clear, "{status:?}");

    let (ok, table, _) = db.ordo(&["subscriptions", "backlog", "mailer"]);
    assert!(ok);
    assert!(
        table.contains("skip key \"bad\": 1 event(s)")
            && table.contains("purge key \"worse\": 20 event(s)"),
        "the actions are recorded: {table}"
    );
    assert!(
        eventually(PATIENCE, || async { db.ordo(&["status", "--check"]).0 }).await,
        "nothing is stuck any more"
    );
    handle.shutdown().await;
}
