//! Inbox-deduplicated consumption: messages/s and space per million messages, row-per-message
//! mode against watermark mode, with a no-op handler (the figures are the inbox's own cost).
//!
//! ```sh
//! cargo run --release --example inbox_load
//! ORDO_MESSAGES=100000 ORDO_RECEIVERS=8 cargo run --release --example inbox_load
//! ```
//! Uses `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`) to create a
//! scratch database per mode, dropped at the end. Each of `ORDO_RECEIVERS` tasks receives its
//! share of `ORDO_MESSAGES` (row mode: distinct ids; watermark mode: one source per task,
//! positions in order), then every message once more (the redelivery pass, all duplicates).
//! Space is `pg_total_relation_size` of the mode's table (indexes and TOAST included) after
//! the run and after `VACUUM FULL`, scaled to one million messages.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use ordo::HandlerError;
use ordo::inbox::{Inbox, InboxConfig, InboxHandler, InboxMessage, InboxMode, Receipt};
use sqlx::{PgConnection, PgPool};

#[path = "support/scratch.rs"]
mod scratch;

use scratch::Scratch;

struct NoOp;

impl InboxHandler for NoOp {
    async fn handle(
        &self,
        _tx: &mut PgConnection,
        _message: &InboxMessage,
    ) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One message of receiver `task`: its `n`-th (1-based).
fn message(mode: InboxMode, task: u64, n: u64) -> InboxMessage {
    let id = format!(
        "{:08x}-{task:04}-{n:010}",
        n.wrapping_mul(2_654_435_761) as u32
    );
    let payload = format!(r#"{{"task":{task},"n":{n}}}"#);
    match mode {
        InboxMode::Watermark => {
            InboxMessage::new(id, payload).with_source(format!("source-{task}"), n)
        }
        _ => InboxMessage::new(id, payload),
    }
}

/// Every receiver delivers its `per_task` messages in order; returns the elapsed time.
async fn pass(
    inbox: &Inbox,
    mode: InboxMode,
    receivers: u64,
    per_task: u64,
    expect: Receipt,
) -> Result<Duration> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..receivers {
        let inbox = inbox.clone();
        let expect = expect.clone();
        tasks.push(tokio::spawn(async move {
            for n in 1..=per_task {
                let receipt = inbox.receive(&message(mode, task, n), &NoOp).await?;
                if receipt != expect {
                    bail!("message {n} of receiver {task}: {receipt:?}, expected {expect:?}");
                }
            }
            Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(started.elapsed())
}

async fn size(pool: &PgPool, table: &str) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT pg_total_relation_size($1::regclass)")
            .bind(table)
            .fetch_one(pool)
            .await?,
    )
}

async fn run(mode: InboxMode, messages: u64, receivers: u64) -> Result<()> {
    let scratch = Scratch::create(&scratch::server_url()).await?;
    let pool = scratch.pool(u32::try_from(receivers)? + 2).await?;
    let inbox = Inbox::new(pool.clone(), InboxConfig::new("load").mode(mode))?;
    let per_task = messages / receivers;
    let total = per_task * receivers;
    let first = pass(&inbox, mode, receivers, per_task, Receipt::Handled).await?;
    let again = pass(&inbox, mode, receivers, per_task, Receipt::Duplicate).await?;
    let table = match mode {
        InboxMode::Watermark => "ordo.inbox_watermarks",
        _ => "ordo.inbox",
    };
    let as_left = size(&pool, table).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM FULL {table}")))
        .execute(&pool)
        .await?;
    let compact = size(&pool, table).await?;
    // Row mode grows with the messages kept (for its retention); watermark mode is one row per
    // source whatever the count, so scaling it would mislead.
    let per_million = match mode {
        InboxMode::Watermark => format!("{compact} B flat"),
        _ => format!(
            "{:.1} MiB",
            compact as f64 * 1e6 / total as f64 / (1024.0 * 1024.0)
        ),
    };
    println!(
        "{:<14} {:>8} {:>10.0} {:>10.0} {:>12} {:>12} {:>14}",
        format!("{mode:?}"),
        total,
        total as f64 / first.as_secs_f64(),
        total as f64 / again.as_secs_f64(),
        as_left,
        compact,
        per_million,
    );
    pool.close().await;
    scratch.drop_db().await
}

#[tokio::main]
async fn main() -> Result<()> {
    let messages = env("ORDO_MESSAGES", 20_000);
    let receivers = env("ORDO_RECEIVERS", 8).max(1);
    println!("{messages} messages, {receivers} receivers, no-op handler");
    println!(
        "{:<14} {:>8} {:>10} {:>10} {:>12} {:>12} {:>14}",
        "mode", "messages", "new msg/s", "dup msg/s", "bytes left", "bytes vacuum", "per million"
    );
    // A B B A: drift of the machine shows as disagreement between a mode's two runs.
    for mode in [
        InboxMode::RowPerMessage,
        InboxMode::Watermark,
        InboxMode::Watermark,
        InboxMode::RowPerMessage,
    ] {
        run(mode, messages, receivers).await?;
    }
    Ok(())
}
