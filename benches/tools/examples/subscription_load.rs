//! Throughput of durable subscriptions: events/s for a no-op handler and a one-row-insert
//! handler, per-event vs batched checkpoints, on both lanes; against the database's own commit
//! rate measured in the same run (the ceiling for one checkpoint per event).
//!
//! ```sh
//! cargo run --release --example subscription_load
//! ORDO_PER_EVENT=2000 ORDO_BATCHED=20000 cargo run --release --example subscription_load
//! ```
//! Uses `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`) to create a
//! scratch database per case, dropped at the end.

use std::time::{Duration, Instant};

use anyhow::Result;
use ordo::{Batch, Delivery, HandlerError, JobConfig, Ordering, Outbox, OutboxConfig, Subscriber};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

#[path = "support/scratch.rs"]
mod scratch;

use scratch::Scratch;

#[derive(Serialize, Deserialize)]
struct Item {
    n: u64,
}

struct NoOp;

impl Subscriber<Item> for NoOp {
    async fn handle(
        &self,
        _tx: &mut PgConnection,
        _event: &Delivery<Item>,
    ) -> Result<(), HandlerError> {
        Ok(())
    }
}

struct InsertRow;

impl Subscriber<Item> for InsertRow {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        event: &Delivery<Item>,
    ) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO sink (sequence, n) VALUES ($1, $2)")
            .bind(event.sequence.get() as i64)
            .bind(event.payload.n as i64)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let per_event: i64 = env("ORDO_PER_EVENT", 5_000);
    let batched: i64 = env("ORDO_BATCHED", 50_000);
    let server = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());

    let commit_rate = baseline_commit_rate(&server, per_event).await?;
    println!("baseline: one-row UPDATE transactions on one connection: {commit_rate:.0} commits/s");
    println!(
        "{:<7} {:<10} {:<16} {:>8} {:>12} {:>10}",
        "lane", "handler", "checkpoint", "events", "events/s", "vs commits"
    );
    for ordering in [Ordering::Insert, Ordering::Commit] {
        for handler in ["no-op", "insert-row"] {
            for (label, batch, events) in [
                ("per event", Batch::PerEvent, per_event),
                ("batched 1000", Batch::UpTo(1_000), batched),
            ] {
                let rate = run_case(&server, ordering, handler, batch, events).await?;
                println!(
                    "{:<7} {:<10} {:<16} {:>8} {:>12.0} {:>9.2}x",
                    ordering.as_str(),
                    handler,
                    label,
                    events,
                    rate,
                    rate / commit_rate
                );
            }
        }
    }
    Ok(())
}

fn env(name: &str, default: i64) -> i64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn run_case(
    server: &str,
    ordering: Ordering,
    handler: &str,
    batch: Batch,
    events: i64,
) -> Result<f64> {
    let scratch = Scratch::create(server).await?;
    let pool = scratch.pool(8).await?;
    sqlx::query("CREATE TABLE sink (sequence BIGINT NOT NULL, n BIGINT NOT NULL)")
        .execute(&pool)
        .await?;
    // Events in transactions of ten (explicit commit_xid values above any real one).
    sqlx::query(
        "INSERT INTO ordo.events (commit_xid, payload)
         SELECT 1000000000000 + g / 10, jsonb_build_object('n', g) FROM generate_series(0, $1 - 1) AS g ORDER BY g",
    )
    .bind(events)
    .execute(&pool)
    .await?;
    let outbox = Outbox::<Item>::new(pool.clone(), OutboxConfig::default()).await?;
    if ordering == Ordering::Commit {
        while (outbox.commit_head().get() as i64) < events {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let config = JobConfig::new("load").ordering(ordering).batch(batch);
    let started = Instant::now();
    let handle = match handler {
        "no-op" => outbox.subscribe(config, NoOp).await?,
        _ => outbox.subscribe(config, InsertRow).await?,
    };
    let (status, done) = handle
        .wait_for(Duration::from_secs(600), |s| {
            s.position.get() as i64 >= events
        })
        .await;
    let elapsed = started.elapsed();
    anyhow::ensure!(done, "the subscription did not finish: {status:?}");
    handle.shutdown().await;
    outbox.shutdown().await;
    pool.close().await;
    scratch.drop_db().await?;
    Ok(events as f64 / elapsed.as_secs_f64())
}

/// What one connection sustains in one-row-update transactions: the ceiling for a subscription
/// that commits once per event.
async fn baseline_commit_rate(server: &str, transactions: i64) -> Result<f64> {
    let scratch = Scratch::create(server).await?;
    let pool = scratch.pool(1).await?;
    sqlx::raw_sql("CREATE TABLE counter (n BIGINT NOT NULL); INSERT INTO counter VALUES (0);")
        .execute(&pool)
        .await?;
    let started = Instant::now();
    for _ in 0..transactions {
        let mut tx = pool.begin().await?;
        sqlx::query("UPDATE counter SET n = n + 1")
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
    }
    let rate = transactions as f64 / started.elapsed().as_secs_f64();
    pool.close().await;
    scratch.drop_db().await?;
    Ok(rate)
}
