//! Resident memory of a relay holding events behind a parked one: one event
//! of key `a` is refused for good and parks, then `--events` events of `--megabytes` each are
//! published on the same key, so the relay holds them all behind it (`OnParked::HoldKeys`) as
//! far as its window lets it read. Prints the process's resident memory (`VmRSS`, `VmHWM` from
//! `/proc/self/status`) before and once it stopped growing.
//!
//! ```sh
//! export DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres
//! cargo build --release --example relay_window_memory
//! ./target/release/examples/relay_window_memory                      # default window: 64 MiB
//! ./target/release/examples/relay_window_memory --window-bytes 0     # no byte bound (count only)
//! ```
//!
//! Options: `--events N` (default 400), `--megabytes N` (default 1), `--window-bytes N` (the
//! relay's byte bound; 0 means unbounded, bounded by count only as before the bound existed).
//! The sink is in this process and delivers nothing but what it is sent: the memory is the
//! relay's, the outbox's and the pool's. Runs on a scratch database (`ordo_load_<random>`),
//! dropped at exit. Linux only (reads `/proc`).

#[path = "support/resident.rs"]
mod resident;
#[path = "support/scratch.rs"]
mod scratch;

use std::time::Duration;

use anyhow::Result;
use ordo::relay::{Message, Outcomes, RelayConfig, SendError, Sink};
use ordo::{Keys, Outbox, OutboxConfig};
use resident::resident;
use scratch::Scratch;

#[derive(serde::Serialize, serde::Deserialize)]
struct Blob {
    n: u32,
    data: String,
}

/// Refuses event `n = 0` for good, delivers every other.
struct RefuseFirst;

impl Sink for RefuseFirst {
    async fn send(&mut self, batch: &[Message], outcomes: &mut Outcomes) -> Result<(), SendError> {
        for (index, message) in batch.iter().enumerate() {
            if message.payload.starts_with(br#"{"n": 0,"#) {
                outcomes.failed(index, SendError::permanent("refused by the example"));
            } else {
                outcomes.delivered(index);
            }
        }
        Ok(())
    }

    async fn reset(&mut self) -> Result<(), SendError> {
        Ok(())
    }

    fn describe(&self) -> String {
        "refuse-first".to_owned()
    }
}

fn option(name: &str) -> Option<usize> {
    let args: Vec<String> = std::env::args().collect();
    let at = args.iter().position(|arg| arg == name)?;
    args.get(at + 1)?.parse().ok()
}

#[tokio::main]
async fn main() -> Result<()> {
    let events = option("--events").unwrap_or(400);
    let megabytes = option("--megabytes").unwrap_or(1);
    let (window_bytes, shown) = match option("--window-bytes") {
        Some(0) => (usize::MAX / 2, "unbounded (10,000 events)".to_owned()),
        Some(bytes) => (bytes, format!("{bytes} bytes")),
        None => (
            ordo::relay::DEFAULT_WINDOW_BYTES,
            "default (64 MiB)".to_owned(),
        ),
    };
    let db = Scratch::create(&scratch::server_url()).await?;
    let pool = db.pool(4).await?;
    let outbox = Outbox::<Blob>::new(pool, OutboxConfig::default()).await?;
    let config = RelayConfig::new("window-memory").window(ordo::DEFAULT_KEYED_WINDOW, window_bytes);
    let relay = outbox
        .relay(config, RefuseFirst, |_| Keys::one("a"))
        .await?;
    let publish = |n: u32, size: usize| {
        let outbox = outbox.clone();
        async move {
            let mut tx = outbox.begin().await?;
            tx.publish(Blob {
                n,
                data: "x".repeat(size),
            })?;
            tx.commit().await?;
            anyhow::Ok(())
        }
    };
    publish(0, 10).await?;
    let (_, parked) = relay
        .wait_for(Duration::from_secs(60), |status| !status.stalled.is_empty())
        .await;
    anyhow::ensure!(parked, "the first event was not parked");
    let (_, baseline) = resident()?;
    for n in 1..=events as u32 {
        publish(n, megabytes * 1024 * 1024).await?;
    }
    // The relay reads behind the publisher: wait until resident memory stops growing.
    let mut last = resident()?.1;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = resident()?.1;
        if now <= last {
            break;
        }
        last = now;
    }
    let (peak, now) = resident()?;
    println!(
        "{events} x {megabytes} MB events held behind a parked one, window {shown}: \
         VmRSS before {baseline} MiB, after {now} MiB; VmHWM {peak} MiB"
    );
    relay.shutdown().await;
    outbox.shutdown().await;
    db.drop_db().await?;
    Ok(())
}
