//! Load tool for the commit lane: how fast the sequencer folds, and how far behind the commit
//! lane runs, against the write rate measured in the same run.
//!
//! ```sh
//! cargo run --release --example fold_load            # full run (~1 minute)
//! ORDO_LOAD_SECONDS=3 cargo run --release --example fold_load
//! ```
//! Uses `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`) to create a
//! scratch database, dropped at the end. Prints one figure per line.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use dashmap::DashMap;
use futures::StreamExt;
use hdrhistogram::Histogram;
use ordo::{Outbox, OutboxConfig, Start};
use serde::{Deserialize, Serialize};

#[path = "support/scratch.rs"]
mod scratch;

use scratch::Scratch;

#[derive(Serialize, Deserialize)]
struct Tick {
    /// Nanoseconds since the run's start, taken when `commit()` returned is recorded apart.
    writer: u32,
    n: u64,
}

#[tokio::main]
async fn main() -> Result<()> {
    let seconds: u64 = std::env::var("ORDO_LOAD_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let server = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());

    // ORDO_PHASES picks phases (default all): writers,paced. The cold fold is measured by
    // `examples/commit_lane_load.rs` (`ORDO_PHASES=cold`, `ORDO_COLD_GROUP` events a group).
    let phases = std::env::var("ORDO_PHASES").unwrap_or_else(|_| "writers,paced".into());
    if phases.contains("writers") {
        let scratch = Scratch::create(&server).await?;
        writers_and_fold(&scratch, seconds).await?;
        scratch.drop_db().await?;
    }
    if phases.contains("paced") {
        let scratch = Scratch::create(&server).await?;
        paced_commit_lane_latency(&scratch, seconds.min(5)).await?;
        scratch.drop_db().await?;
    }
    Ok(())
}

/// 8 writers of single-event transactions as fast as they go, in three phases:
/// A. the writers' own outbox folds (the default deployment: every process runs a sequencer)
///    and listens on the commit lane: write rate, commit→commit-lane latency;
/// B. the writers switch to an outbox without a sequencer for two seconds, then a fresh folder
///    catches up with the moving head: the fold's capacity while writers write, as a ratio to
///    the write rate;
/// C. writers stop: how long until the log holds every event (the lag).
async fn writers_and_fold(scratch: &Scratch, seconds: u64) -> Result<()> {
    let writer_pool = scratch.pool(10).await?;
    let folding_writers = Outbox::<Tick>::new(writer_pool.clone(), OutboxConfig::default()).await?;
    let plain_writers =
        Outbox::<Tick>::new(writer_pool, OutboxConfig::default().sequencer(false)).await?;
    let current = Arc::new(std::sync::RwLock::new(folding_writers.clone()));
    let committed_at = Arc::new(CommitTimes::default());
    let start = Instant::now();

    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for writer in 0..8u32 {
        let current = Arc::clone(&current);
        let (stop, written, committed_at) = (
            Arc::clone(&stop),
            Arc::clone(&written),
            Arc::clone(&committed_at),
        );
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let outbox = current
                    .read()
                    .map_err(|_| anyhow::anyhow!("poisoned"))?
                    .clone();
                let mut tx = outbox.begin().await?;
                tx.publish(Tick { writer, n })?;
                tx.commit().await?;
                committed_at.put(writer, n, start.elapsed().as_micros() as u64);
                written.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
            anyhow::Ok(())
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await; // warm-up

    // A: steady state; the writers' outbox folds and listens on the commit lane.
    let mut lane = folding_writers.listen_committed(Start::Now);
    let phase_a = Duration::from_secs(seconds);
    let listening = tokio::spawn(async move {
        // Joined with commit times afterwards: a listener in this process may see an event
        // before its writer has recorded `commit()` returning.
        let mut received = Vec::new();
        let until = Instant::now() + phase_a;
        while Instant::now() < until {
            let Ok(Some(item)) = tokio::time::timeout_at(until.into(), lane.next()).await else {
                break;
            };
            let item = item?;
            received.push((
                item.event.payload.writer,
                item.event.payload.n,
                start.elapsed().as_micros() as u64,
            ));
        }
        anyhow::Ok(received)
    });
    // The insert lane in the same moments, to tell the lanes' shares of the latency apart.
    let mut inserted = folding_writers.listen_inserted(Start::Now);
    let insert_listening = tokio::spawn(async move {
        let mut received = Vec::new();
        let until = Instant::now() + phase_a;
        while Instant::now() < until {
            let Ok(Some(event)) = tokio::time::timeout_at(until.into(), inserted.next()).await
            else {
                break;
            };
            let event = event?;
            received.push((
                event.payload.writer,
                event.payload.n,
                start.elapsed().as_micros() as u64,
            ));
        }
        anyhow::Ok(received)
    });
    let (w1, t1) = (written.load(Ordering::Relaxed), Instant::now());
    let received = listening.await??;
    let insert_histogram = committed_at.latencies(&insert_listening.await??)?;
    let (w2, t2) = (written.load(Ordering::Relaxed), Instant::now());
    let write_rate = (w2 - w1) as f64 / (t2 - t1).as_secs_f64();
    let histogram = committed_at.latencies(&received)?;
    *current.write().map_err(|_| anyhow::anyhow!("poisoned"))? = plain_writers.clone();
    folding_writers.shutdown().await;

    // B: a backlog builds for two seconds, then a fresh folder catches up with the moving head.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let catching_up = Instant::now();
    let folder = Outbox::<Tick>::new(scratch.pool(6).await?, OutboxConfig::default()).await?;
    let from = folder.commit_head().get();
    let mut behind_at_start = None;
    loop {
        let head = folder.commit_head().get();
        let total = written.load(Ordering::Relaxed);
        behind_at_start.get_or_insert(total.saturating_sub(head));
        // Caught up: within what the writers commit in 20 ms (a fold round or two).
        if total.saturating_sub(head) as f64 <= (write_rate * 0.02).max(50.0) {
            break;
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    let catch_up = catching_up.elapsed();
    let fold_rate = (folder.commit_head().get() - from) as f64 / catch_up.as_secs_f64();

    // C: writers stop; the lag is until the log holds every committed event.
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await??;
    }
    let stopped = Instant::now();
    let total = written.load(Ordering::Relaxed);
    while folder.commit_head().get() < total {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let lag = stopped.elapsed();

    println!("8 writers of single-event transactions, {seconds}s steady state");
    println!("write rate             {write_rate:>9.0} events/s (= transactions/s)");
    println!(
        "commit->insert lane    p50 {} us  p99 {} us  max {} us  ({} events, while writing)",
        insert_histogram.value_at_quantile(0.5),
        insert_histogram.value_at_quantile(0.99),
        insert_histogram.max(),
        insert_histogram.len()
    );
    println!(
        "commit->commit lane    p50 {} us  p99 {} us  max {} us  ({} events, while writing)",
        histogram.value_at_quantile(0.5),
        histogram.value_at_quantile(0.99),
        histogram.max(),
        histogram.len()
    );
    println!(
        "fold capacity          {fold_rate:>9.0} events/s = groups/s, catching up {} events in {:.0} ms while writers write; ratio fold/write {:.2}",
        behind_at_start.unwrap_or(0),
        catch_up.as_secs_f64() * 1e3,
        fold_rate / write_rate
    );
    println!("lag after writers stop {:>9.1} ms", lag.as_secs_f64() * 1e3);
    plain_writers.shutdown().await;
    folder.shutdown().await;
    Ok(())
}

/// One writer at a paced 500 transactions/s, one outbox that folds and listens in-process.
async fn paced_commit_lane_latency(scratch: &Scratch, seconds: u64) -> Result<()> {
    let mut config = OutboxConfig::default();
    // Diagnostic: ORDO_FOLD_INTERVAL_US overrides the sequencer's fold interval.
    if let Some(us) = std::env::var("ORDO_FOLD_INTERVAL_US")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        config = config.fold_interval(Duration::from_micros(us));
    }
    let outbox = Outbox::<Tick>::new(scratch.pool(6).await?, config).await?;
    let mut lane = outbox.listen_committed(Start::Now);
    let mut insert_lane = outbox.listen_inserted(Start::Now);
    let start = Instant::now();
    let committed_at = CommitTimes::default();
    let inserted_at = CommitTimes::default();
    let count = seconds * 500 + 250;
    let insert_side = tokio::spawn(async move {
        let mut received = Vec::new();
        for _ in 0..count {
            let Some(event) = insert_lane.next().await else {
                break;
            };
            received.push((0, event?.payload.n, start.elapsed().as_micros() as u64));
        }
        anyhow::Ok(received)
    });
    let commit_side = tokio::spawn(async move {
        let mut received = Vec::new();
        for _ in 0..count {
            let Some(item) = lane.next().await else { break };
            received.push((0, item?.event.payload.n, start.elapsed().as_micros() as u64));
        }
        anyhow::Ok(received)
    });
    let mut pace = tokio::time::interval(Duration::from_millis(2));
    for n in 0..count {
        pace.tick().await;
        let mut tx = outbox.begin().await?;
        tx.publish(Tick { writer: 0, n })?;
        tx.commit().await?;
        // The first half second is warm-up (connections, first plans) and is not recorded.
        if n >= 250 {
            let at = start.elapsed().as_micros() as u64;
            committed_at.put(0, n, at);
            inserted_at.put(0, n, at);
        }
    }
    let insert_histogram = inserted_at.latencies(&insert_side.await??)?;
    let commit_histogram = committed_at.latencies(&commit_side.await??)?;
    println!("paced 500 tx/s for {seconds}s after 0.5 s of warm-up, in-process listeners");
    for (lane, h) in [
        ("insert lane", insert_histogram),
        ("commit lane", commit_histogram),
    ] {
        println!(
            "{lane}: commit->listener p50 {} us  p99 {} us  p999 {} us  max {} us",
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.value_at_quantile(0.999),
            h.max()
        );
    }
    outbox.shutdown().await;
    Ok(())
}

/// Commit times by (writer, n), joined with receive times at the end: every writer task
/// records into one concurrent map.
#[derive(Default)]
struct CommitTimes {
    at: DashMap<(u32, u64), u64>,
}

impl CommitTimes {
    fn put(&self, writer: u32, n: u64, at: u64) {
        self.at.insert((writer, n), at);
    }

    /// Microseconds from commit returning to receipt, for every received event.
    fn latencies(&self, received: &[(u32, u64, u64)]) -> Result<Histogram<u64>> {
        let mut histogram = Histogram::<u64>::new(3)?;
        for (writer, n, at) in received {
            if let Some(committed) = self.at.get(&(*writer, *n)) {
                histogram.record(at.saturating_sub(*committed).max(1))?;
            }
        }
        Ok(histogram)
    }
}
