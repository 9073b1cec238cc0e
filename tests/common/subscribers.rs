//! The subscribers the subscription tests run, and their setup: a `projection` table that each
//! handler writes one row per event into, in the handler's transaction, so that a test can
//! count how often each event took effect.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ordo::{Delivery, Envelope, HandlerError, Outbox, OutboxConfig, RetryPolicy, Subscriber};
use rand::Rng;
use sqlx::{PgConnection, PgPool};

use super::{Note, TestDb, eventually};

/// How long a test waits for a subscription to get somewhere.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Retries at once (1 ms doubling to 10 ms), up to `max_attempts`.
pub fn fast_retries(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(10),
    }
}

pub async fn projection_table(pool: &PgPool) {
    sqlx::query(
        "CREATE TABLE projection (sequence BIGINT NOT NULL, writer INT NOT NULL, n INT NOT NULL)",
    )
    .execute(pool)
    .await
    .expect("projection table");
}

/// The `projection` table in `db`, and an outbox on it with the default configuration.
pub async fn projected_outbox(db: &TestDb) -> Outbox<Note> {
    projection_table(&db.pool).await;
    Outbox::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox")
}

/// The projection write every test handler makes: one row per event.
pub async fn project(tx: &mut PgConnection, event: &Envelope<Note>) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO projection (sequence, writer, n) VALUES ($1, $2, $3)")
        .bind(event.sequence.get() as i64)
        .bind(event.payload.writer as i32)
        .bind(event.payload.n as i32)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Records the sequence of every event it handles, and does nothing else.
#[derive(Clone, Default)]
pub struct Seen(Arc<Mutex<Vec<u64>>>);

impl Seen {
    /// The sequences handled, in the order they were.
    pub fn sequences(&self) -> Vec<u64> {
        self.0.lock().map(|seen| seen.clone()).unwrap_or_default()
    }
}

impl Subscriber<Note> for Seen {
    async fn handle(
        &self,
        _tx: &mut PgConnection,
        event: &Delivery<Note>,
    ) -> Result<(), HandlerError> {
        if let Ok(mut seen) = self.0.lock() {
            seen.push(event.sequence.get());
        }
        Ok(())
    }
}

/// Inserts a projection row per event; fails (after writing) with probability `fail_rate`.
pub struct Project {
    pub fail_rate: f64,
}

impl Subscriber<Note> for Project {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        event: &Delivery<Note>,
    ) -> Result<(), HandlerError> {
        project(tx, event).await?;
        if self.fail_rate > 0.0 && rand::rng().random_bool(self.fail_rate) {
            return Err("injected failure after writing".into());
        }
        Ok(())
    }
}

/// Fails every time on events of writer 3 while `broken` is set; projects the others.
pub struct Poisoned {
    pub broken: Arc<AtomicBool>,
}

impl Subscriber<Note> for Poisoned {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        event: &Delivery<Note>,
    ) -> Result<(), HandlerError> {
        if event.payload.writer == 3 && self.broken.load(Ordering::SeqCst) {
            return Err("writer 3 is poison".into());
        }
        Project { fail_rate: 0.0 }.handle(tx, event).await
    }
}

/// Publishes `transactions` transactions of `per_transaction` notes each (`writer` the
/// transaction's number, `n` the note's within it).
pub async fn publish(outbox: &Outbox<Note>, transactions: u32, per_transaction: u32) {
    for n in 0..transactions {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish_all((0..per_transaction).map(|k| Note { writer: n, n: k }))
            .expect("publish");
        tx.commit().await.expect("commit");
    }
}

/// Every real event projected exactly once.
pub async fn assert_exactly_once(pool: &PgPool) {
    let (events, rows, distinct, missing): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM ordo.events WHERE payload IS NOT NULL),
                (SELECT count(*) FROM projection),
                (SELECT count(DISTINCT sequence) FROM projection),
                (SELECT count(*) FROM ordo.events e WHERE e.payload IS NOT NULL
                   AND NOT EXISTS (SELECT 1 FROM projection p WHERE p.sequence = e.sequence))",
    )
    .fetch_one(pool)
    .await
    .expect("projection counts");
    assert_eq!(
        rows, distinct,
        "an event was applied twice ({rows} rows, {distinct} events)"
    );
    assert_eq!(missing, 0, "{missing} events were never applied");
    assert_eq!(rows, events);
}

/// Waits until `count` projection rows are written.
pub async fn wait_projected(pool: &PgPool, count: i64) -> bool {
    eventually(PATIENCE, || async {
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM projection")
            .fetch_one(pool)
            .await
            .unwrap_or(0);
        rows >= count
    })
    .await
}
