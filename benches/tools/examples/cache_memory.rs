//! Resident memory after large payloads: publishes three 100 MB events, receives each on a
//! live insert-lane listener and a commit-lane listener, drops them, and prints the process's
//! peak (`VmHWM`) and current (`VmRSS`) resident memory from `/proc/self/status`.
//!
//! ```sh
//! export DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres
//! cargo run --release --example cache_memory                       # default cache_bytes
//! cargo run --release --example cache_memory -- --cache-bytes 0    # no byte bound (count only)
//! ```
//!
//! Options: `--insert-lane-only` (no commit-lane listener), `--events N` (default 3), `--megabytes N` (payload size, default 100),
//! `--cache-bytes N` (the lane's byte budget; 0 means unbounded, i.e. bounded by count only,
//! as before the budget existed). Runs on a scratch database (`ordo_load_<random>`), dropped at
//! exit. Linux only (reads `/proc`).
//!
//! Measured here (debug build, 2 cores, PostgreSQL 15 on localhost), VmRSS after delivery /
//! VmHWM: before the byte budget and the buffer shrinking, 708 / 1,008 MiB (the cache held the
//! three payloads, and every pooled connection that wrote or read one kept a 100 MB buffer);
//! with them, 109 / 508 MiB, and 71 / 508 MiB with `--insert-lane-only`. The remaining 100 MB
//! is the buffer of the connection that served the commit lane's page read.

#[path = "support/resident.rs"]
mod resident;
#[path = "support/scratch.rs"]
mod scratch;

use std::time::Duration;

use anyhow::{Context, Result};
use futures::StreamExt;
use ordo::{Outbox, OutboxConfig, Start};
use resident::resident;
use scratch::Scratch;

#[derive(serde::Serialize, serde::Deserialize)]
struct Blob {
    n: u32,
    data: String,
}

fn option(name: &str) -> Option<usize> {
    let args: Vec<String> = std::env::args().collect();
    let at = args.iter().position(|arg| arg == name)?;
    args.get(at + 1)?.parse().ok()
}

#[tokio::main]
async fn main() -> Result<()> {
    let events = option("--events").unwrap_or(3);
    let megabytes = option("--megabytes").unwrap_or(100);
    let mut config = OutboxConfig::default();
    let budget = match option("--cache-bytes") {
        Some(0) => {
            config = config.cache_bytes(usize::MAX);
            "unbounded (count only)".to_owned()
        }
        Some(bytes) => {
            config = config.cache_bytes(bytes);
            format!("{bytes} bytes")
        }
        None => "default (64 MiB)".to_owned(),
    };
    let db = Scratch::create(&scratch::server_url()).await?;
    let pool = db.pool(4).await?;
    let outbox = Outbox::<Blob>::new(pool, config).await?;
    let mut inserted = outbox.listen_inserted(Start::Now);
    let with_commit_lane = !std::env::args().any(|arg| arg == "--insert-lane-only");
    let mut committed = outbox.listen_committed(Start::Now);
    let (_, baseline) = resident()?;

    for n in 0..events as u32 {
        {
            let mut tx = outbox.begin().await?;
            tx.publish(Blob {
                n,
                data: "x".repeat(megabytes * 1024 * 1024),
            })?;
            tx.commit().await?;
        }
        let event = tokio::time::timeout(Duration::from_secs(120), inserted.next())
            .await?
            .context("the outbox stopped")??;
        anyhow::ensure!(event.payload.n == n, "insert lane out of order");
        drop(event);
        if !with_commit_lane {
            continue;
        }
        let item = tokio::time::timeout(Duration::from_secs(120), committed.next())
            .await?
            .context("the outbox stopped")??;
        anyhow::ensure!(item.event.payload.n == n, "commit lane out of order");
    }
    let (peak, now) = resident()?;
    println!(
        "{events} x {megabytes} MB payloads published and delivered, cache_bytes {budget}: \
         VmRSS before {baseline} MiB, after {now} MiB; VmHWM {peak} MiB"
    );
    outbox.shutdown().await;
    db.drop_db().await?;
    Ok(())
}
