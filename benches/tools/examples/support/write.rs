//! The writer loop the publish tools share (`examples/single_writer.rs` and `benches/peer`), so
//! that their "one writer" figures are the same loop over the same transactions: one order
//! written through a plain table (`INSERT` into `ordo.events`, `COMMIT`) or published through
//! ordo, and the flat-out loop that warms up and then times them back to back.
#![allow(dead_code)]

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::Result;
use hdrhistogram::Histogram;
use ordo::Outbox;
use sqlx::PgPool;
use sqlx::types::Json;

use crate::measure::{histogram, nanos};
use crate::order::{OrderPlaced, payload};

/// When a transaction's parts happened.
#[derive(Debug, Clone, Copy)]
pub struct Stamps {
    /// Just before its write: the plain table's `INSERT`, ordo's `commit()` (which sends the
    /// buffered publish and the `COMMIT`).
    pub before: Instant,
    /// Just before its `COMMIT` was sent (ordo's: the same as `before`).
    pub before_commit: Instant,
    /// When the commit returned.
    pub after: Instant,
}

/// What a user writes without ordo: `BEGIN`, the order as one `INSERT` into `ordo.events`,
/// `COMMIT`.
pub async fn plain(pool: &PgPool, n: u64) -> Result<Stamps> {
    let mut tx = pool.begin().await?;
    let before = Instant::now();
    sqlx::query("INSERT INTO ordo.events (payload) VALUES ($1)")
        .bind(Json(payload(n)))
        .execute(&mut *tx)
        .await?;
    let before_commit = Instant::now();
    tx.commit().await?;
    Ok(Stamps {
        before,
        before_commit,
        after: Instant::now(),
    })
}

/// The same order published through ordo: `begin`, `publish`, `commit`.
pub async fn through_ordo(outbox: &Outbox<OrderPlaced>, n: u64) -> Result<Stamps> {
    let mut tx = outbox.begin().await?;
    tx.publish(payload(n))?;
    let before = Instant::now();
    tx.commit().await?;
    Ok(Stamps {
        before,
        before_commit: before,
        after: Instant::now(),
    })
}

/// Runs `one(n)` back to back for `warm_up`, unrecorded, numbering from `*n` on.
pub async fn warm<F, Fut, T>(warm_up: Duration, n: &mut u64, mut one: F) -> Result<()>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let until = Instant::now() + warm_up;
    while Instant::now() < until {
        one(*n).await?;
        *n += 1;
    }
    Ok(())
}

/// What [`flat_out`] measured.
pub struct FlatOut {
    /// Transactions done.
    pub count: u64,
    /// Seconds they took.
    pub seconds: f64,
    /// Each transaction's time, from before `one` was called to its end.
    pub latencies: Histogram<u64>,
}

impl FlatOut {
    pub fn per_second(&self) -> f64 {
        self.count as f64 / self.seconds
    }
}

/// Runs `one(n)` back to back for `seconds`, numbering from `*n` on, each one timed.
pub async fn flat_out<F, Fut, T>(seconds: f64, n: &mut u64, mut one: F) -> Result<FlatOut>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut latencies = histogram()?;
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(seconds);
    let mut count = 0u64;
    while Instant::now() < until {
        let t = Instant::now();
        one(*n).await?;
        latencies.record(nanos(t.elapsed()))?;
        *n += 1;
        count += 1;
    }
    Ok(FlatOut {
        count,
        seconds: started.elapsed().as_secs_f64(),
        latencies,
    })
}
