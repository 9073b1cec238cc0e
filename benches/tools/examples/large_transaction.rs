//! Memory of one very large transaction: the publishing process's peak resident set while it
//! publishes and commits N events in one transaction, then while its insert lane delivers them.
//!
//! ```sh
//! cargo run --release --example large_transaction                      # 1,000,000 events
//! cargo run --release --example large_transaction -- --events 200000
//! ```
//!
//! Uses `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`) to create a
//! scratch database, dropped at the end. The sequencer is off (`OutboxConfig::sequencer(false)`)
//! so the figures are the write side's and the insert lane's, not the commit lane's. The peak
//! is the kernel's high-water mark (`VmHWM` in `/proc/self/status`, Linux only).

use std::time::Instant;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use ordo::{Outbox, OutboxConfig, Start};
use serde::{Deserialize, Serialize};

#[path = "support/scratch.rs"]
mod scratch;

use scratch::Scratch;

#[derive(Serialize, Deserialize)]
struct Small {
    n: u32,
}

#[tokio::main]
async fn main() -> Result<()> {
    let events = events_arg()?;
    let server = scratch::server_url();
    let scratch = Scratch::create(&server).await?;
    let result = run(&scratch, events).await;
    scratch.drop_db().await?;
    result
}

fn events_arg() -> Result<u32> {
    let mut args = std::env::args().skip(1);
    let mut events = 1_000_000;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--events" => {
                events = args
                    .next()
                    .context("--events needs a number")?
                    .parse()
                    .context("--events needs a number")?;
            }
            other => bail!("unknown argument {other:?} (expected --events N)"),
        }
    }
    Ok(events)
}

async fn run(scratch: &Scratch, events: u32) -> Result<()> {
    let pool = scratch.pool(4).await?;
    let outbox = Outbox::<Small>::new(pool, OutboxConfig::default().sequencer(false)).await?;
    let mut lane = outbox.listen_inserted(Start::Now);
    println!("peak RSS at start:            {:>8} kB", peak_kb()?);

    let started = Instant::now();
    let mut tx = outbox.begin().await?;
    for n in 0..events {
        tx.publish(Small { n })?;
    }
    println!("peak RSS after publish:       {:>8} kB", peak_kb()?);
    let sequences = tx.commit().await?;
    println!(
        "peak RSS after commit:        {:>8} kB  ({} events committed in {:.1?})",
        peak_kb()?,
        sequences.len(),
        started.elapsed()
    );
    drop(sequences);

    let mut delivered = 0u32;
    while delivered < events {
        let event = lane.next().await.context("the lane ended")??;
        if event.payload.n != delivered {
            bail!(
                "event {} arrived where {delivered} was due",
                event.payload.n
            );
        }
        delivered += 1;
    }
    println!(
        "peak RSS after delivery:      {:>8} kB  (all {delivered} delivered in order, {:.1?} from begin)",
        peak_kb()?,
        started.elapsed()
    );
    outbox.shutdown().await;
    Ok(())
}

/// The process's peak resident set so far, in kB.
fn peak_kb() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status").context("read /proc/self/status")?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmHWM line in /proc/self/status")
}
