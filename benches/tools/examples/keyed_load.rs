//! Throughput of keyed subscriptions: a handler that waits 5 ms of I/O per event, keyed over
//! 1,000 keys, at concurrency 1, 8, 32 and 128 (each as a ratio to concurrency 1 measured in
//! the same run); and a no-op handler keyed (concurrency 1, 8, 32) vs unkeyed. Runs are alternated (A B B A) so drift
//! of the machine shows up as disagreement between the two runs of a case.
//!
//! ```sh
//! cargo run --release --example keyed_load
//! ORDO_PHASES=io ORDO_IO_SECONDS=4 cargo run --release --example keyed_load
//! ```
//! Uses `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`) to create a
//! scratch database per run, dropped at the end. Events are on the insert lane, written before
//! the subscription starts; a run ends when the subscription's watermark reaches the last one.
//! Each handler holds a pool connection while it waits, so the pool is sized to the
//! concurrency, capped by `ORDO_MAX_POOL` (default 90: the server's stock `max_connections` is
//! 100).

use std::time::{Duration, Instant};

use anyhow::Result;
use ordo::{Delivery, Envelope, HandlerError, JobConfig, Keys, Outbox, OutboxConfig, Subscriber};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

#[path = "support/scratch.rs"]
mod scratch;

use scratch::Scratch;

#[derive(Serialize, Deserialize)]
struct Item {
    n: u64,
    key: u64,
}

/// Waits `io` per event (inside its transaction, as a handler calling a service would), keyed
/// by the event's `key`.
struct Handler {
    io: Duration,
}

impl Subscriber<Item> for Handler {
    async fn handle(
        &self,
        _tx: &mut PgConnection,
        _event: &Delivery<Item>,
    ) -> Result<(), HandlerError> {
        if !self.io.is_zero() {
            tokio::time::sleep(self.io).await;
        }
        Ok(())
    }

    fn keys(&self, event: &Envelope<Item>) -> Keys {
        Keys::one(event.payload.key.to_string())
    }
}

/// One measured case: `concurrency` `None` is an unkeyed (serial) subscription.
#[derive(Clone, Copy)]
struct Case {
    concurrency: Option<usize>,
    io: Duration,
    events: u64,
}

#[tokio::main]
async fn main() -> Result<()> {
    let server = scratch::server_url();
    let phases = std::env::var("ORDO_PHASES").unwrap_or_else(|_| "io,noop".into());
    let max_pool: u32 = env("ORDO_MAX_POOL", 90) as u32;
    if phases.contains("io") {
        io_phase(&server, max_pool).await?;
    }
    if phases.contains("noop") {
        noop_phase(&server, max_pool).await?;
    }
    Ok(())
}

/// Concurrency 1, 8, 32, 128, then back down: each run sized to last about `ORDO_IO_SECONDS`.
async fn io_phase(server: &str, max_pool: u32) -> Result<()> {
    let seconds = env("ORDO_IO_SECONDS", 3) as f64;
    let io = Duration::from_millis(5);
    println!("I/O-bound handler: 5 ms per event, 1,000 keys, insert lane");
    println!(
        "{:>11} {:>5} {:>8} {:>10} {:>10}",
        "concurrency", "pool", "events", "events/s", "vs c=1"
    );
    let order = [1, 8, 32, 128, 128, 32, 8, 1];
    let mut base: Vec<f64> = Vec::new();
    let mut results = Vec::new();
    for concurrency in order {
        // Enough events for about `seconds` at the ideal rate (capped for the large ones).
        let ideal = concurrency as f64 / io.as_secs_f64();
        let events = ((ideal * seconds) as u64).clamp(200, 40_000);
        let case = Case {
            concurrency: Some(concurrency),
            io,
            events,
        };
        let (rate, pool) = run(server, case, max_pool).await?;
        if concurrency == 1 {
            base.push(rate);
        }
        results.push((concurrency, pool, events, rate));
    }
    let base = base.iter().sum::<f64>() / base.len().max(1) as f64;
    for (concurrency, pool, events, rate) in results {
        println!(
            "{concurrency:>11} {pool:>5} {events:>8} {rate:>10.0} {:>9.1}x",
            rate / base
        );
    }
    Ok(())
}

/// A no-op handler, unkeyed and keyed (concurrency 1, 8 and 32), in the order A B C D D C B A.
async fn noop_phase(server: &str, max_pool: u32) -> Result<()> {
    let events = env("ORDO_NOOP_EVENTS", 5_000) as u64;
    println!("no-op handler, {events} events, 1,000 keys, insert lane");
    println!("{:>11} {:>8} {:>10}", "mode", "events", "events/s");
    for concurrency in [
        None,
        Some(1),
        Some(8),
        Some(32),
        Some(32),
        Some(8),
        Some(1),
        None,
    ] {
        let case = Case {
            concurrency,
            io: Duration::ZERO,
            events,
        };
        let (rate, _) = run(server, case, max_pool).await?;
        let mode = concurrency.map_or("unkeyed".to_owned(), |c| format!("keyed {c}"));
        println!("{mode:>11} {events:>8} {rate:>10.0}");
    }
    Ok(())
}

fn env(name: &str, default: i64) -> i64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Events/s from the subscription's start until its watermark reaches the last event, and the
/// pool size used.
async fn run(server: &str, case: Case, max_pool: u32) -> Result<(f64, u32)> {
    let scratch = Scratch::create(server).await?;
    let pool_size = (case.concurrency.unwrap_or(1) as u32 + 6).min(max_pool);
    let pool = scratch.pool(pool_size).await?;
    sqlx::query(
        "INSERT INTO ordo.events (commit_xid, payload)
         SELECT 1000000000000 + g, jsonb_build_object('n', g, 'key', g % 1000)
         FROM generate_series(0, $1 - 1) AS g ORDER BY g",
    )
    .bind(case.events as i64)
    .execute(&pool)
    .await?;
    let outbox =
        Outbox::<Item>::new(pool.clone(), OutboxConfig::default().sequencer(false)).await?;
    let mut config = JobConfig::new("load");
    if let Some(concurrency) = case.concurrency {
        config = config.keyed(concurrency);
    }
    let started = Instant::now();
    let handle = outbox.subscribe(config, Handler { io: case.io }).await?;
    let (status, done) = handle
        .wait_for(Duration::from_secs(600), |s| {
            s.position.get() >= case.events
        })
        .await;
    let elapsed = started.elapsed();
    anyhow::ensure!(done, "the subscription did not finish: {status:?}");
    handle.shutdown().await;
    outbox.shutdown().await;
    pool.close().await;
    scratch.drop_db().await?;
    Ok((case.events as f64 / elapsed.as_secs_f64(), pool_size))
}
