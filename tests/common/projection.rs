//! Two ordo databases end to end (`tests/inbox/relay_to_inbox.rs` over NATS JetStream,
//! `tests/inbox/kafka_to_inbox.rs` over Kafka): writers on A, A's relay sending its commit
//! lane, and B's inbox in watermark mode whose handler keeps a projection, one row per message
//! at its position. What the test checks at the end is the same whatever the broker: B's
//! projection is A's commit lane, each event once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ordo::HandlerError;
use ordo::inbox::{Inbox, InboxConfig, InboxHandler, InboxMessage, InboxMode};
use ordo::{Envelope, Keys, Outbox, OutboxConfig};
use sqlx::{PgConnection, PgPool};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinSet;

use super::keyed::Parcel;
use super::{TestDb, eventually};

const PATIENCE: Duration = Duration::from_secs(60);
/// The source A's relay names on every message, B's watermark's key.
pub const SOURCE: &str = "ordo-a";
/// B's inbox consumer.
pub const CONSUMER: &str = "b-projection";

/// One key for every event: the relay sends in commit order, as watermark mode wants.
pub fn in_commit_order(_: &Envelope<Parcel>) -> Keys {
    Keys::one("all")
}

/// B's handler: one projection row per message, at its position. With a gate, it stops at
/// that position, signals, and goes on when let go.
#[derive(Default)]
pub struct Project {
    pub gate: Option<(u64, mpsc::UnboundedSender<()>, Arc<Notify>)>,
}

impl InboxHandler for Project {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        message: &InboxMessage,
    ) -> Result<(), HandlerError> {
        let parcel: Parcel = message.payload_as()?;
        let position = message
            .position
            .ok_or("a watermark message has a position")?;
        sqlx::query("INSERT INTO projection (position, event_id, parcel) VALUES ($1, $2, $3)")
            .bind(i64::try_from(position)?)
            .bind(&message.id)
            .bind(i64::from(parcel.id))
            .execute(&mut *tx)
            .await?;
        if let Some((at, entered, go)) = &self.gate
            && *at == position
        {
            let _ = entered.send(());
            go.notified().await;
        }
        Ok(())
    }
}

/// B's projection table.
pub async fn create_projection(b: &PgPool) {
    sqlx::query(
        // No unique constraint: a handler run twice would show as a second row, not as an error.
        "CREATE TABLE projection (position BIGINT NOT NULL, event_id TEXT NOT NULL, parcel BIGINT NOT NULL)",
    )
    .execute(b)
    .await
    .expect("projection table");
}

pub fn b_inbox(pool: PgPool) -> Inbox {
    let config = InboxConfig::new(CONSUMER).mode(InboxMode::Watermark);
    Inbox::new(pool, config).expect("inbox")
}

pub async fn a_outbox(pool: PgPool) -> Outbox<Parcel> {
    Outbox::<Parcel>::new(pool, OutboxConfig::default())
        .await
        .expect("outbox A")
}

pub async fn projected(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM projection")
        .fetch_one(pool)
        .await
        .expect("count the projection")
}

/// Writers on A: `transactions` each of one or two parcels, every fifth rolled back.
pub async fn write(outbox: Outbox<Parcel>, writer: u32, transactions: u32) {
    for n in 0..transactions {
        let mut tx = outbox.begin().await.expect("begin");
        let id = writer * 10_000 + n * 2;
        tx.publish(Parcel::new(id, &["all"])).expect("publish");
        if n % 3 == 0 {
            tx.publish(Parcel::new(id + 1, &["all"])).expect("publish");
        }
        if n % 5 == 4 {
            tx.rollback().await.expect("rollback");
        } else {
            tx.commit().await.expect("commit");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Three writers on A, 120 transactions each, running until [`writers_done`].
pub fn start_writers(outbox: &Outbox<Parcel>) -> JoinSet<()> {
    let mut writers = JoinSet::new();
    for writer in 1..=3 {
        writers.spawn(write(outbox.clone(), writer, 120));
    }
    writers
}

/// Waits for the writers to finish; the number of events A then holds (its committed ones).
pub async fn writers_done(mut writers: JoinSet<()>, a: &TestDb) -> i64 {
    while let Some(written) = writers.join_next().await {
        written.expect("a writer");
    }
    sqlx::query_scalar("SELECT count(*) FROM ordo.events")
        .fetch_one(&a.pool)
        .await
        .expect("count A's events")
}

/// Stops an adapter (through `stop`) once B projected `committed` events, asserting that it
/// did within the patience: run it beside the adapter, whose stop signal `stop` sends.
pub async fn stop_once_projected(b: &PgPool, committed: i64, stop: oneshot::Sender<()>) {
    let all = eventually(PATIENCE, || async { projected(b).await >= committed }).await;
    assert!(all, "B projected every committed event of A");
    let _ = stop.send(());
}

/// Exactly A's `committed` events in B's projection, each once, each at its commit position on
/// A, and B's watermark for A at the last of them.
pub async fn assert_projection_is_a_commit_lane(a: &TestDb, b: &TestDb, committed: i64) {
    let on_a: BTreeMap<i64, String> = sqlx::query_as(
        "SELECT l.commit_seq, e.id::text FROM ordo.commit_log AS l JOIN ordo.events AS e ON e.sequence = l.sequence",
    )
    .fetch_all(&a.pool)
    .await
    .expect("A's commit lane")
    .into_iter()
    .collect();
    let rows: Vec<(i64, String)> = sqlx::query_as("SELECT position, event_id FROM projection")
        .fetch_all(&b.pool)
        .await
        .expect("B's projection");
    assert_eq!(rows.len() as i64, committed, "one projection row per event");
    let on_b: BTreeMap<i64, String> = rows.into_iter().collect();
    assert_eq!(on_a.len() as i64, committed);
    assert_eq!(on_b, on_a, "B's projection is A's commit lane, once each");
    let watermarks = ordo::inbox::list_watermarks(&b.pool, Some(CONSUMER))
        .await
        .expect("watermarks");
    assert_eq!(watermarks.len(), 1);
    assert_eq!(watermarks[0].source, SOURCE);
    assert_eq!(watermarks[0].position, committed as u64);
}
