//! A relay below the retention floor halts, visibly, instead of retrying a read that can never
//! succeed; the operator moves it to the floor and resumes it, and it delivers from there.
//!
//! The real paths below the floor: a forced retention run (`RetentionConfig::force`, `ordo
//! retention --apply --force`) drops the partitions a stopped relay still needs, and an
//! operator's `ordo relay replay --from` asks for a position retention already dropped. The
//! sink is the test's own implementation of the public `Sink` trait: it records every message.

use crate::common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::TestDb;
use common::keyed::{Parcel, publish};
use common::recording_sink::Recording;
use common::subscribers::PATIENCE;
use ordo::admin::run_retention;
use ordo::relay::RelayConfig;
use ordo::{
    Envelope, Keys, Outbox, OutboxConfig, RetentionConfig, RunStatus, SubscriptionHandle,
    SubscriptionState, SubscriptionStatus,
};

fn keys(event: &Envelope<Parcel>) -> Keys {
    event.payload.keys.iter().cloned().collect()
}

fn config() -> RelayConfig {
    RelayConfig::new("retained")
        .batch_size(20)
        .per_event_budget(Duration::from_millis(25))
        .batch_deadline(Duration::from_millis(600))
        .lease(Duration::from_secs(3))
        .backoff(Duration::from_millis(5), Duration::from_millis(50))
}

fn parcels(from: u32, count: u32) -> impl Iterator<Item = Parcel> {
    (from..from + count).map(|id| Parcel::new(id, &[&format!("k{}", id % 5)]))
}

async fn start(outbox: &Outbox<Parcel>, received: &Arc<Mutex<Vec<u64>>>) -> SubscriptionHandle {
    let sink = Recording(Arc::clone(received));
    outbox.relay(config(), sink, keys).await.expect("relay")
}

fn positions(received: &Arc<Mutex<Vec<u64>>>) -> Vec<u64> {
    received.lock().map(|r| r.clone()).unwrap_or_default()
}

/// The relay's row as `ordo subscriptions` reads it.
async fn row(db: &TestDb) -> SubscriptionStatus {
    ordo::admin::list_subscriptions(&db.pool)
        .await
        .expect("list")
        .into_iter()
        .find(|s| s.name == "retained")
        .expect("the relay's row")
}

/// Waits until the relay's handle reports it halted, then checks that every reader says so,
/// with the retention floor's message: the handle, `ordo subscriptions`, `Outbox::status` and
/// (with the CLI built) `ordo status`.
async fn assert_halted(
    db: &TestDb,
    outbox: &Outbox<Parcel>,
    relay: &SubscriptionHandle,
    requested: u64,
) {
    let message = format!(
        "the commit lane was read from position {requested}, below the retention floor 201"
    );
    let (status, halted) = relay
        .wait_for(PATIENCE, |s| s.state == SubscriptionState::Halted)
        .await;
    assert!(halted, "the relay did not halt: {status:?}");
    assert_eq!(status.status, RunStatus::Halted, "{status:?}");
    assert!(
        status
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains(&message)),
        "{status:?}"
    );
    let stored = row(db).await;
    assert_eq!(
        (stored.status, stored.state),
        (RunStatus::Halted, SubscriptionState::Halted),
        "{stored:?}"
    );
    assert!(
        stored
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains(&message)),
        "{stored:?}"
    );
    let report = outbox.status().await.expect("status");
    let listed = report
        .subscriptions
        .iter()
        .find(|s| s.name == "retained")
        .expect("listed");
    assert_eq!(listed.status, RunStatus::Halted, "{listed:?}");
    assert!(
        listed
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains(&message)),
        "{listed:?}"
    );
    #[cfg(feature = "cli")]
    {
        let (ok, table, err) = db.ordo(&["status"]);
        let line = table.lines().find(|l| l.starts_with("retained"));
        assert!(
            ok && line.is_some_and(|l| l.contains(" halted ") && l.contains(&message)),
            "{table}{err}"
        );
    }
}

/// The documented recovery: `ordo relay replay NAME --from FLOOR`, then `ordo relay resume
/// NAME` (the API when the CLI is not built).
#[cfg(feature = "cli")]
async fn recover(db: &TestDb, floor: u64) {
    let from = floor.to_string();
    let (ok, _, said) = db.ordo(&["relay", "replay", "retained", "--from", &from]);
    assert!(
        ok && said.contains("is halted: `ordo relay resume retained`"),
        "{said}"
    );
    let (ok, _, said) = db.ordo(&["relay", "resume", "retained"]);
    assert!(ok && said.contains("resumed"), "{said}");
}

#[cfg(not(feature = "cli"))]
async fn recover(db: &TestDb, floor: u64) {
    let to = ordo::Position::Commit(ordo::CommitSequence::new(floor - 1));
    ordo::admin::reset_subscription(&db.pool, "retained", to, false)
        .await
        .expect("replay");
    ordo::admin::resume_subscription(&db.pool, "retained")
        .await
        .expect("resume");
}

/// An operator's replay from a position retention dropped (the API when the CLI is not built).
#[cfg(feature = "cli")]
async fn replay(db: &TestDb, from: u64) {
    let from = from.to_string();
    let (ok, _, said) = db.ordo(&["relay", "replay", "retained", "--from", &from]);
    assert!(ok, "{said}");
}

#[cfg(not(feature = "cli"))]
async fn replay(db: &TestDb, from: u64) {
    let to = ordo::Position::Commit(ordo::CommitSequence::new(from - 1));
    ordo::admin::reset_subscription(&db.pool, "retained", to, false)
        .await
        .expect("replay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_below_the_retention_floor_halts_and_resumes_from_the_floor() {
    let db = TestDb::with_partition_size(Some(100)).await;
    let outbox = Outbox::<Parcel>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let received = Arc::new(Mutex::new(Vec::new()));

    // The relay delivers 1..=50 and stops; 51..=250 are written while it is stopped.
    let relay = start(&outbox, &received).await;
    publish(&outbox, parcels(0, 50)).await;
    let (status, done) = relay.wait_for(PATIENCE, |s| s.position.get() >= 50).await;
    assert!(done, "{status:?}");
    relay.shutdown().await;
    publish(&outbox, parcels(50, 200)).await;
    assert!(common::eventually(PATIENCE, || async { outbox.commit_head().get() >= 250 }).await);

    // A forced retention run drops what the stopped relay still needs: 1..=200.
    let forced = RetentionConfig::new().keep(Duration::ZERO).force(true);
    let report = run_retention(&db.pool, &forced).await.expect("retention");
    assert_eq!(
        (report.events_floor, report.commit_floor),
        (201, 200),
        "{report:#?}"
    );

    // Started again, it reads from 51, below the floor: it halts, sending nothing.
    received.lock().expect("received").clear();
    let relay = start(&outbox, &received).await;
    assert_halted(&db, &outbox, &relay, 51).await;
    assert_eq!(relay.status().position.get(), 50);
    assert!(
        positions(&received).is_empty(),
        "{:?}",
        positions(&received)
    );

    // Moved to the floor and resumed, it delivers from the floor on: 201..=250.
    recover(&db, 201).await;
    publish(&outbox, parcels(250, 10)).await;
    let (status, done) = relay
        .wait_for(PATIENCE, |s| {
            s.position.get() >= 260 && s.state == SubscriptionState::Running
        })
        .await;
    assert!(done, "the relay did not deliver from the floor: {status:?}");
    assert_eq!(
        (status.status, status.last_error.as_deref()),
        (RunStatus::Active, None),
        "{status:?}"
    );
    let delivered: BTreeSet<u64> = positions(&received).into_iter().collect();
    assert_eq!(delivered, (201..=260).collect::<BTreeSet<_>>());
    let stored = row(&db).await;
    assert_eq!(
        (stored.status, stored.last_error.as_deref()),
        (RunStatus::Active, None)
    );

    // A replay from a dropped position halts it again, rather than retrying for ever.
    replay(&db, 100).await;
    assert_halted(&db, &outbox, &relay, 100).await;
    relay.shutdown().await;
    outbox.shutdown().await;
}
