//! A stale relay's marks: a relay whose lease is taken over while its batch is at the sink
//! records nothing (its marks are dropped), and the events are sent again by the owner, so the
//! receiver, deduplicating by message id, takes each exactly once. The sink here is the test's
//! own implementation of the public `Sink` trait: it records every message and holds a batch
//! until the test lets it go.

use crate::common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::keyed::{Parcel, publish};
use common::subscribers::PATIENCE;
use common::{TestDb, eventually};
use ordo::relay::{Message, Outcomes, RelayConfig, SendError, Sink};
use ordo::{Envelope, Keys, Outbox, OutboxConfig, SubscriptionState};
use tokio::sync::watch;

/// Records every message it is handed; while `open` is false it holds the batch in `send`.
struct GateSink {
    received: Arc<Mutex<Vec<Message>>>,
    open: watch::Receiver<bool>,
}

impl Sink for GateSink {
    async fn send(&mut self, batch: &[Message], outcomes: &mut Outcomes) -> Result<(), SendError> {
        if let Ok(mut received) = self.received.lock() {
            received.extend(batch.iter().cloned());
        }
        let _ = self.open.wait_for(|open| *open).await;
        (0..batch.len()).for_each(|index| outcomes.delivered(index));
        Ok(())
    }

    async fn reset(&mut self) -> Result<(), SendError> {
        Ok(())
    }

    fn describe(&self) -> String {
        "gate (test)".to_owned()
    }
}

fn keys(event: &Envelope<Parcel>) -> Keys {
    event.payload.keys.iter().cloned().collect()
}

async fn done_rows(db: &TestDb) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM ordo.subscription_progress WHERE state = 'done'")
        .fetch_one(&db.pool)
        .await
        .expect("progress")
}

async fn stored_position(db: &TestDb) -> i64 {
    sqlx::query_scalar("SELECT position FROM ordo.subscriptions WHERE name = 'gated'")
        .fetch_one(&db.pool)
        .await
        .expect("position")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_lost_its_lease_mid_batch_records_nothing_and_the_owner_resends() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Parcel>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let received = Arc::new(Mutex::new(Vec::new()));
    let (open, gate) = watch::channel(false);
    let sink = GateSink {
        received: Arc::clone(&received),
        open: gate,
    };
    let config = RelayConfig::new("gated")
        .batch_size(10)
        .per_event_budget(Duration::from_millis(100))
        .batch_deadline(Duration::from_secs(1))
        .lease(Duration::from_secs(3))
        .backoff(Duration::from_millis(5), Duration::from_millis(50));
    let relay = outbox.relay(config, sink, keys).await.expect("relay");
    let count = || received.lock().map(|r| r.len()).unwrap_or(0);
    publish(
        &outbox,
        (0..10).map(|id| Parcel::new(id, &[&format!("k{id}")])),
    )
    .await;
    assert!(eventually(PATIENCE, || async { count() > 0 }).await);

    // The batch is at the sink; another owner takes the lease before the relay records it.
    sqlx::query(
        "UPDATE ordo.subscriptions SET lease_owner = gen_random_uuid(), lease_expires_at = now() + interval '1 hour'",
    )
    .execute(&db.pool)
    .await
    .expect("take the lease");
    let first_sends = count();
    open.send_replace(true);
    let (status, stood_by) = relay
        .wait_for(PATIENCE, |s| s.state == SubscriptionState::Standby)
        .await;
    assert!(stood_by, "{status:?}");
    assert_eq!(
        done_rows(&db).await,
        0,
        "a relay without the lease recorded a delivery"
    );
    assert_eq!(
        stored_position(&db).await,
        0,
        "a relay without the lease moved the stored watermark"
    );

    // The lease comes free: the relay claims it and sends what it could not record again.
    sqlx::query("UPDATE ordo.subscriptions SET lease_owner = NULL, lease_expires_at = NULL")
        .execute(&db.pool)
        .await
        .expect("free the lease");
    let (status, delivered) = relay.wait_for(PATIENCE, |s| s.position.get() >= 10).await;
    assert!(delivered, "{status:?}");
    relay.shutdown().await;
    let received = received.lock().map(|r| r.clone()).unwrap_or_default();
    assert!(
        received.len() >= first_sends + 10,
        "the unrecorded batch was not sent again"
    );
    let distinct: HashSet<_> = received.iter().map(|m| m.id).collect();
    assert_eq!(
        distinct.len(),
        10,
        "after dedup by id, each event exactly once"
    );
}

/// Records every message; the batch holding lane position 1 waits for `open`, every other
/// batch goes through at once.
struct HoldFirst {
    received: Arc<Mutex<Vec<Message>>>,
    open: watch::Receiver<bool>,
}

impl Sink for HoldFirst {
    async fn send(&mut self, batch: &[Message], outcomes: &mut Outcomes) -> Result<(), SendError> {
        if let Ok(mut received) = self.received.lock() {
            received.extend(batch.iter().cloned());
        }
        if batch.iter().any(|message| message.position == 1) {
            let _ = self.open.wait_for(|open| *open).await;
        }
        (0..batch.len()).for_each(|index| outcomes.delivered(index));
        Ok(())
    }

    async fn reset(&mut self) -> Result<(), SendError> {
        Ok(())
    }

    fn describe(&self) -> String {
        "hold-first (test)".to_owned()
    }
}

/// Batches that land ahead of an earlier one are stored as completion rows (the watermark cannot
/// pass the batch still out); once that batch lands, the watermark covers them all and the rows
/// go. No batch is sent twice: the relay never took its own moved watermark for a lost lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_landing_out_of_order_are_stored_as_rows_then_covered_by_the_watermark() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Parcel>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    publish(
        &outbox,
        (0..20).map(|id| Parcel::new(id, &[&format!("k{id}")])),
    )
    .await;
    let folded = eventually(PATIENCE, || async { outbox.commit_head().get() >= 20 }).await;
    assert!(folded, "the commit lane holds the 20 events");

    let received = Arc::new(Mutex::new(Vec::new()));
    let (open, gate) = watch::channel(false);
    let sink = || HoldFirst {
        received: Arc::clone(&received),
        open: gate.clone(),
    };
    // The held batch must stay within the batch deadline, or it would be released and resent.
    let config = RelayConfig::new("gated")
        .batch_size(5)
        .per_event_budget(Duration::from_secs(1))
        .batch_deadline(Duration::from_secs(30))
        .lease(Duration::from_secs(60));
    let relay = outbox
        .relay_with_sinks(config, vec![sink(), sink()], keys)
        .await
        .expect("relay");

    // The batch of positions 1-5 is held; the other sink delivers 6-20, stored as rows.
    let rows = eventually(PATIENCE, || async { done_rows(&db).await == 15 }).await;
    assert!(
        rows,
        "the later batches were stored as completion rows: {} rows",
        done_rows(&db).await
    );
    assert_eq!(
        stored_position(&db).await,
        0,
        "the watermark passed a batch still out"
    );

    open.send_replace(true);
    let (status, delivered) = relay.wait_for(PATIENCE, |s| s.position.get() >= 20).await;
    assert!(delivered, "{status:?}");
    // The status reports what is stored: the landing batch's write moved the watermark to 20
    // and took the rows below it away, in one statement.
    assert_eq!(
        stored_position(&db).await,
        20,
        "the watermark covers every batch"
    );
    assert_eq!(
        done_rows(&db).await,
        0,
        "the rows the watermark covers are gone"
    );
    relay.shutdown().await;
    let received = received.lock().map(|r| r.clone()).unwrap_or_default();
    let distinct: HashSet<_> = received.iter().map(|m| m.id).collect();
    assert_eq!(distinct.len(), 20, "every event delivered");
    assert_eq!(received.len(), 20, "no batch was sent twice");
}
