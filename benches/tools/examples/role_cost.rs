//! What least privilege costs on the hot paths: publish throughput, cold fold throughput and
//! per-event checkpoints, each run **as a role granted `ordo grant --writer`** (neither owner
//! nor superuser, so the checks that restrict it run: column privileges, the verified
//! commit-log append, row security on subscriptions).
//!
//! ```sh
//! cargo run --release --example role_cost
//! ORDO_SECONDS=5 ORDO_FOLD_EVENTS=20000 ORDO_CHECKPOINTS=3000 cargo run --release --example role_cost
//! ```
//! The file builds against older ordo versions too (it uses only `Grants::writer`), so the same
//! tool measures two builds in one sitting: run them alternately (A, B, B, A) and compare.
//! Uses `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`, a superuser: it
//! creates a scratch database and a role per phase, dropped at the end). Prints one line per
//! phase.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as Atomic};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ordo::{Batch, Delivery, Grants, HandlerError, JobConfig, Outbox, OutboxConfig, Subscriber};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool};

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

#[tokio::main]
async fn main() -> Result<()> {
    let seconds = env("ORDO_SECONDS", 5);
    let fold_events = env("ORDO_FOLD_EVENTS", 20_000);
    let checkpoints = env("ORDO_CHECKPOINTS", 3_000);
    let server = scratch::server_url();
    let phases = std::env::var("ORDO_PHASES").unwrap_or_else(|_| "publish,fold,checkpoint".into());
    if phases.contains("publish") {
        let (scratch, role) = as_writer(&server).await?;
        // The role is dropped whether the phase succeeded or not (the database too).
        let rate = publish(&scratch, &role, seconds).await;
        finish(scratch, &server, &role).await?;
        let rate = rate?;
        println!("publish: 8 writers, single-event transactions, {seconds} s: {rate:.0} tx/s");
    }
    if phases.contains("fold") {
        let (scratch, role) = as_writer(&server).await?;
        let rate = fold(&scratch, &role, fold_events).await;
        finish(scratch, &server, &role).await?;
        let rate = rate?;
        println!("fold: {fold_events} single-event transactions, cold: {rate:.0} events/s");
    }
    if phases.contains("checkpoint") {
        let (scratch, role) = as_writer(&server).await?;
        let rate = checkpoint(&scratch, &role, checkpoints).await;
        finish(scratch, &server, &role).await?;
        let rate = rate?;
        println!(
            "checkpoint: {checkpoints} events, no-op handler, one checkpoint each (synchronous_commit off): {rate:.0} events/s ({:.0} us per event)",
            1e6 / rate
        );
    }
    Ok(())
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A scratch database (migrated by the superuser, who owns it) and a login role granted
/// `writer` in it.
async fn as_writer(server: &str) -> Result<(Scratch, String)> {
    let scratch = Scratch::create(server).await?;
    let role = format!(
        "ordo_cost_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let admin = scratch.pool(1).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE ROLE {role} LOGIN")))
        .execute(&admin)
        .await
        .context("create the writer role (DATABASE_URL must be a superuser)")?;
    ordo::admin::grant(&admin, &Grants::writer(&role)).await?;
    admin.close().await;
    Ok((scratch, role))
}

async fn finish(scratch: Scratch, server: &str, role: &str) -> Result<()> {
    scratch.drop_db().await?;
    let admin = PgPool::connect(server).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP ROLE IF EXISTS {role}")))
        .execute(&admin)
        .await?;
    admin.close().await;
    Ok(())
}

async fn pool_as(scratch: &Scratch, role: &str, size: u32) -> Result<PgPool> {
    let options = PgConnectOptions::from_str(scratch.url())?.username(role);
    Ok(PgPoolOptions::new()
        .max_connections(size)
        .connect_with(options)
        .await?)
}

/// Transactions per second of 8 writers publishing one event each, for `seconds`; the outbox
/// runs without a sequencer (the fold is measured apart).
async fn publish(scratch: &Scratch, role: &str, seconds: u64) -> Result<f64> {
    let pool = pool_as(scratch, role, 10).await?;
    let outbox = Arc::new(
        Outbox::<Item>::new(pool.clone(), OutboxConfig::default().sequencer(false)).await?,
    );
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for _ in 0..8 {
        let (outbox, stop, done) = (Arc::clone(&outbox), Arc::clone(&stop), Arc::clone(&done));
        writers.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Atomic::Relaxed) {
                let mut tx = outbox.begin().await?;
                tx.publish(Item { n })?;
                tx.commit().await?;
                n += 1;
                done.fetch_add(1, Atomic::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let count = done.load(Atomic::Relaxed);
    let elapsed = started.elapsed();
    stop.store(true, Atomic::Relaxed);
    for writer in writers {
        writer.await??;
    }
    if let Ok(outbox) = Arc::try_unwrap(outbox) {
        outbox.shutdown().await;
    }
    pool.close().await;
    Ok(count as f64 / elapsed.as_secs_f64())
}

/// Events per second of a cold fold: `events` single-event transactions stored (each its own
/// transaction, as the superuser), then an outbox of the writer role folds them all.
async fn fold(scratch: &Scratch, role: &str, events: u64) -> Result<f64> {
    let admin = scratch.pool(1).await?;
    let mut conn = admin.acquire().await?;
    sqlx::raw_sql("SET synchronous_commit = off")
        .execute(&mut *conn)
        .await?;
    // One statement on its own: a DO block may COMMIT only outside a transaction block, and
    // several statements in one query are one implicit transaction.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DO $$ BEGIN
             FOR i IN 1..{events} LOOP
                 INSERT INTO ordo.events (payload) VALUES (jsonb_build_object('n', i));
                 COMMIT;
             END LOOP;
         END $$"
    )))
    .execute(&mut *conn)
    .await?;
    drop(conn);
    admin.close().await;
    let pool = pool_as(scratch, role, 4).await?;
    let started = Instant::now();
    let outbox = Outbox::<Item>::new(pool.clone(), OutboxConfig::default()).await?;
    while outbox.commit_head().get() < events {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    outbox.shutdown().await;
    pool.close().await;
    Ok(events as f64 / elapsed.as_secs_f64())
}

/// Events per second of a subscription of the writer role that checkpoints after every event
/// (a no-op handler: the transaction is the checkpoint), over `events` stored events. The role
/// commits with `synchronous_commit = off`: with a WAL flush per checkpoint the figure is the
/// disk's flush rate, which on this machine's shared disk varied fivefold within a minute and
/// hid what the statements cost.
async fn checkpoint(scratch: &Scratch, role: &str, events: u64) -> Result<f64> {
    let admin = scratch.pool(1).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER ROLE {role} SET synchronous_commit = off"
    )))
    .execute(&admin)
    .await?;
    sqlx::query(
        "INSERT INTO ordo.events (payload)
         SELECT jsonb_build_object('n', g) FROM generate_series(1, $1) AS g ORDER BY g",
    )
    .bind(events as i64)
    .execute(&admin)
    .await?;
    admin.close().await;
    let pool = pool_as(scratch, role, 4).await?;
    let outbox =
        Outbox::<Item>::new(pool.clone(), OutboxConfig::default().sequencer(false)).await?;
    let config = JobConfig::new("cost").batch(Batch::PerEvent);
    let started = Instant::now();
    let handle = outbox.subscribe(config, NoOp).await?;
    let (status, done) = handle
        .wait_for(Duration::from_secs(600), |s| s.position.get() >= events)
        .await;
    let elapsed = started.elapsed();
    anyhow::ensure!(done, "the subscription did not finish: {status:?}");
    handle.shutdown().await;
    outbox.shutdown().await;
    pool.close().await;
    Ok(events as f64 / elapsed.as_secs_f64())
}
