//! Load tool for the commit lane's tail, each figure beside a baseline measured in the same run
//! (these machines are noisy; runs alternate A, B, B, A where two variants are compared).
//!
//! ```sh
//! cargo run --release --example commit_lane_load                      # every phase (~2 min)
//! ORDO_PHASES=paced,lag,wal,cold cargo run --release --example commit_lane_load
//! ORDO_LOAD_SECONDS=5 ORDO_COLD_EVENTS=1000000 cargo run --release --example commit_lane_load
//! ```
//!
//! Phases:
//! - `paced`: one writer at 500 single-event transactions/s; commit → listener latency on the
//!   insert lane (the baseline) and on the commit lane, in the writer's process and in a second
//!   `Outbox` on its own pool (another process, as far as ordo can tell: both fold).
//! - `lag`: 8 writers of single-event transactions as fast as they go; commit → commit-lane
//!   listener latency beside the insert lane's, with 1 and with 3 outboxes folding (1, 3, 3, 1;
//!   `ORDO_LAG_FOLDERS` sets another list), each in a fresh database, and how far the fold
//!   trailed the insert lane.
//! - `wal`: 8 writers, raw `INSERT`s (each in its own transaction, as an application's would
//!   be) with nothing of ordo running against the same writers
//!   publishing through an `Outbox` that folds (raw, ordo, ordo, raw): events/s and WAL bytes
//!   per event (`pg_current_wal_insert_lsn()` deltas, which do not depend on machine noise), and
//!   on Linux with the server on this machine, CPU time per event of this process and of every
//!   `postgres` process (`/proc/*/stat`; less noisy than events/s, which swing by a fifth from
//!   one run to the next on a shared machine).
//! - `cold`: `ORDO_COLD_EVENTS` events (default 1,000,000) already in the table, in transactions
//!   of `ORDO_COLD_GROUP` events (default 1), folded from scratch, beside a paged read of the
//!   same rows.
//!
//! Diagnostics (defaults in brackets): `ORDO_FOLD_INTERVAL_MS` sets every outbox's
//! `fold_interval` [0]; `ORDO_PACED_PRELUDE` commits that many plain-SQL transactions before the
//! paced writer starts, which both outboxes race to append [0]; `ORDO_SECOND_FOLDS=0` runs the
//! paced phase's second outbox without a sequencer; `ORDO_WAL_FOLDS=0` publishes in `wal`
//! without one; `ORDO_WAL_DEBOUNCE_MS` sets the wake-up debounce there [2].
//!
//! Uses `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`) to create scratch
//! databases, dropped at the end. Prints one figure per line. WAL is cluster-wide: measure `wal`
//! on a server nothing else writes to (a private cluster: `pg_createcluster 15 bench -p 5433
//! --start -- --auth-local=trust --auth-host=trust`, then `DATABASE_URL=postgres://postgres@127.0.0.1:5433/postgres`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use futures::StreamExt;
use hdrhistogram::Histogram;
use ordo::{Outbox, OutboxConfig, Start};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

#[path = "support/scratch.rs"]
mod scratch;

use scratch::Scratch;

#[derive(Serialize, Deserialize)]
struct Tick {
    writer: u32,
    n: u64,
}

const WRITERS: u32 = 8;

/// The outbox configuration every phase starts from. Diagnostic: `ORDO_FOLD_INTERVAL_MS` sets
/// [`OutboxConfig::fold_interval`] (default 0), to weigh fewer appends against latency.
fn config() -> OutboxConfig {
    OutboxConfig::default().fold_interval(Duration::from_millis(env_or("ORDO_FOLD_INTERVAL_MS", 0)))
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() -> Result<()> {
    let seconds: u64 = env_or("ORDO_LOAD_SECONDS", 5);
    let cold_events: i64 = env_or("ORDO_COLD_EVENTS", 1_000_000);
    let cold_group: i64 = env_or("ORDO_COLD_GROUP", 1).max(1);
    let server = scratch::server_url();
    let phases = std::env::var("ORDO_PHASES").unwrap_or_else(|_| "paced,lag,wal,cold".into());
    println!("server settings: {}", settings(&server).await?);
    if phases.contains("paced") {
        let scratch = Scratch::create(&server).await?;
        paced(&scratch, seconds).await?;
        scratch.drop_db().await?;
    }
    if phases.contains("lag") {
        // ORDO_LAG_FOLDERS picks the sittings (default 1,3,3,1: outboxes folding in each).
        let sittings = std::env::var("ORDO_LAG_FOLDERS").unwrap_or_else(|_| "1,3,3,1".into());
        for folders in sittings.split(',') {
            let folders: usize = folders
                .trim()
                .parse()
                .map_err(|_| anyhow!("ORDO_LAG_FOLDERS takes counts such as 1,3,3,1"))?;
            let scratch = Scratch::create(&server).await?;
            lag(&scratch, seconds, folders).await?;
            scratch.drop_db().await?;
        }
    }
    if phases.contains("wal") {
        for ordo in [false, true, true, false] {
            let scratch = Scratch::create(&server).await?;
            wal(&scratch, seconds, ordo).await?;
            scratch.drop_db().await?;
        }
    }
    if phases.contains("cold") {
        let scratch = Scratch::create(&server).await?;
        cold(&scratch, cold_events, cold_group).await?;
        scratch.drop_db().await?;
    }
    Ok(())
}

/// The settings that decide these figures, as the server reports them.
async fn settings(server: &str) -> Result<String> {
    let pool = PgPool::connect(server).await?;
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, setting FROM pg_settings
         WHERE name IN ('server_version', 'jit', 'jit_above_cost', 'shared_buffers', 'synchronous_commit',
                        'wal_level', 'max_wal_size', 'plan_cache_mode', 'full_page_writes')
         ORDER BY name",
    )
    .fetch_all(&pool)
    .await?;
    pool.close().await;
    Ok(rows
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" "))
}

/// Commit times by (writer, n), joined with receive times at the end.
#[derive(Default)]
struct Clock {
    committed: std::sync::Mutex<std::collections::HashMap<(u32, u64), u64>>,
}

impl Clock {
    fn put(&self, writer: u32, n: u64, at: u64) {
        if let Ok(mut map) = self.committed.lock() {
            map.insert((writer, n), at);
        }
    }

    /// Microseconds from `commit()` returning to receipt, for every received event.
    fn latencies(&self, received: &[(u32, u64, u64)]) -> Result<Histogram<u64>> {
        let mut histogram = Histogram::<u64>::new(3)?;
        let map = self.committed.lock().map_err(|_| anyhow!("poisoned"))?;
        for (writer, n, at) in received {
            if let Some(committed) = map.get(&(*writer, *n)) {
                histogram.record(at.saturating_sub(*committed).max(1))?;
            }
        }
        Ok(histogram)
    }
}

fn line(label: &str, h: &Histogram<u64>) -> String {
    format!(
        "{label:<34} p50 {:>6} us  p99 {:>6} us  max {:>6} us  ({} events)",
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.max(),
        h.len()
    )
}

/// Receives `(writer, n, at)` from a lane for `window`.
fn receive_insert(
    outbox: &Outbox<Tick>,
    start: Instant,
    window: Duration,
) -> tokio::task::JoinHandle<Result<Vec<(u32, u64, u64)>>> {
    let mut lane = outbox.listen_inserted(Start::Now);
    tokio::spawn(async move {
        let mut received = Vec::new();
        let until = Instant::now() + window;
        while let Ok(Some(event)) = tokio::time::timeout_at(until.into(), lane.next()).await {
            let event = event?;
            let at = start.elapsed().as_micros() as u64;
            received.push((event.payload.writer, event.payload.n, at));
        }
        Ok(received)
    })
}

fn receive_commit(
    outbox: &Outbox<Tick>,
    start: Instant,
    window: Duration,
) -> tokio::task::JoinHandle<Result<Vec<(u32, u64, u64)>>> {
    let mut lane = outbox.listen_committed(Start::Now);
    tokio::spawn(async move {
        let mut received = Vec::new();
        let until = Instant::now() + window;
        while let Ok(Some(item)) = tokio::time::timeout_at(until.into(), lane.next()).await {
            let item = item?;
            let at = start.elapsed().as_micros() as u64;
            received.push((item.event.payload.writer, item.event.payload.n, at));
        }
        Ok(received)
    })
}

/// One writer at a paced 500 transactions/s.
async fn paced(scratch: &Scratch, seconds: u64) -> Result<()> {
    let outbox = Outbox::<Tick>::new(scratch.pool(6).await?, config()).await?;
    // Diagnostic: ORDO_SECOND_FOLDS=0 runs the second outbox without a sequencer.
    let second_folds = env_or("ORDO_SECOND_FOLDS", 1u8) != 0;
    let other =
        Outbox::<Tick>::new(scratch.pool(6).await?, config().sequencer(second_folds)).await?;
    // Diagnostic: ORDO_PACED_PRELUDE=N first commits N single-event transactions through plain
    // SQL from four connections. Both outboxes' sequencers race to append them, so either may
    // come out leading, as after a slow start or a pause (the writer's process leads when it
    // wins); they are not measured.
    let prelude: u32 = env_or("ORDO_PACED_PRELUDE", 0);
    if prelude > 0 {
        let pool = scratch.pool(4).await?;
        let mut tasks = Vec::new();
        for writer in 1..=4u32 {
            let pool = pool.clone();
            tasks.push(tokio::spawn(async move {
                for n in 0..u64::from(prelude / 4) {
                    sqlx::query("INSERT INTO ordo.events (payload) VALUES ($1)")
                        .bind(sqlx::types::Json(Tick { writer, n }))
                        .execute(&pool)
                        .await?;
                }
                anyhow::Ok(())
            }));
        }
        for task in tasks {
            task.await??;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let start = Instant::now();
    let clock = Arc::new(Clock::default());
    // Half a second of warm-up (connections, first plans) is not recorded.
    let warm = 250u64;
    let count = seconds * 500 + warm;
    let window = Duration::from_millis(count * 2 + 1000);
    let listeners = [
        (
            "insert lane, same process",
            receive_insert(&outbox, start, window),
        ),
        (
            "commit lane, same process",
            receive_commit(&outbox, start, window),
        ),
        (
            "insert lane, second outbox",
            receive_insert(&other, start, window),
        ),
        (
            "commit lane, second outbox",
            receive_commit(&other, start, window),
        ),
    ];
    let mut pace = tokio::time::interval(Duration::from_millis(2));
    for n in 0..count {
        pace.tick().await;
        let mut tx = outbox.begin().await?;
        tx.publish(Tick { writer: 0, n })?;
        tx.commit().await?;
        if n >= warm {
            clock.put(0, n, start.elapsed().as_micros() as u64);
        }
    }
    println!(
        "paced: one writer, 500 single-event transactions/s for {seconds} s; second outbox folds: {second_folds}; prelude {prelude}"
    );
    for (label, task) in listeners {
        println!("{}", line(label, &clock.latencies(&task.await??)?));
    }
    outbox.shutdown().await;
    other.shutdown().await;
    Ok(())
}

/// 8 writers as fast as they go, spread over `folders` outboxes that all fold.
async fn lag(scratch: &Scratch, seconds: u64, folders: usize) -> Result<()> {
    let mut outboxes = Vec::new();
    for _ in 0..folders {
        outboxes.push(Outbox::<Tick>::new(scratch.pool(10).await?, config()).await?);
    }
    let start = Instant::now();
    let clock = Arc::new(Clock::default());
    let stop = Arc::new(AtomicBool::new(false));
    let recording = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let outbox = outboxes[writer as usize % folders].clone();
        let (clock, stop, recording, written) = (
            Arc::clone(&clock),
            Arc::clone(&stop),
            Arc::clone(&recording),
            Arc::clone(&written),
        );
        writers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mut tx = outbox.begin().await?;
                tx.publish(Tick { writer, n })?;
                tx.commit().await?;
                if recording.load(Ordering::Relaxed) {
                    clock.put(writer, n, start.elapsed().as_micros() as u64);
                    written.fetch_add(1, Ordering::Relaxed);
                }
                n += 1;
            }
            anyhow::Ok(())
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await; // warm-up
    let window = Duration::from_secs(seconds);
    let insert = receive_insert(&outboxes[0], start, window);
    let commit = receive_commit(&outboxes[0], start, window);
    // How far the fold trails the insert lane in the listeners' outbox (no transaction rolls
    // back here, so every insert sequence gets a commit sequence): a commit lane that trails its
    // insert lane by much more than one append's worth is the fold falling behind, not the
    // listener.
    let behind = {
        let outbox = outboxes[0].clone();
        let folded_from = outbox.insert_frontier().get() as i64 - outbox.commit_head().get() as i64;
        tokio::spawn(async move {
            let mut worst = 0i64;
            let until = Instant::now() + window;
            while Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let gap = outbox.insert_frontier().get() as i64
                    - outbox.commit_head().get() as i64
                    - folded_from;
                worst = worst.max(gap);
            }
            worst
        })
    };
    recording.store(true, Ordering::Relaxed);
    let began = Instant::now();
    let insert = clock.latencies(&insert.await??)?;
    let commit = clock.latencies(&commit.await??)?;
    let behind = behind.await?;
    let rate = written.load(Ordering::Relaxed) as f64 / began.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await??;
    }
    println!("lag: {WRITERS} writers, {folders} outbox(es) folding, {rate:.0} tx/s, {seconds} s");
    println!("{}", line("  insert lane (baseline)", &insert));
    println!("{}", line("  commit lane", &commit));
    println!(
        "  commit lane p99 - insert lane p99: {} us",
        commit.value_at_quantile(0.99) as i64 - insert.value_at_quantile(0.99) as i64
    );
    println!("  fold behind the insert lane, worst of 100 ms samples: {behind} events");
    for outbox in outboxes {
        outbox.shutdown().await;
    }
    Ok(())
}

/// 8 writers for `seconds`: raw inserts with nothing of ordo running, or publishing through an
/// outbox that folds. Events per second and WAL bytes per event.
async fn wal(scratch: &Scratch, seconds: u64, ordo: bool) -> Result<()> {
    let pool = scratch.pool(12).await?;
    // Both variants start right after a checkpoint, so full-page images weigh the same in each
    // (needs a superuser or pg_checkpoint; without it the figures carry that noise).
    if let Err(error) = sqlx::query("CHECKPOINT").execute(&pool).await {
        println!("wal: CHECKPOINT refused ({error}); figures include checkpoint noise");
    }
    // Diagnostics, to tell the costs apart: ORDO_WAL_FOLDS=0 publishes without a sequencer,
    // ORDO_WAL_DEBOUNCE_MS sets the wake-up debounce (default 2).
    let config_folds = env_or("ORDO_WAL_FOLDS", 1u8) != 0;
    let config = config()
        .sequencer(config_folds)
        .notify_debounce(Duration::from_millis(env_or("ORDO_WAL_DEBOUNCE_MS", 2)));
    let outbox = match ordo {
        true => Some(Outbox::<Tick>::new(pool.clone(), config).await?),
        false => None,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let (pool, outbox) = (pool.clone(), outbox.clone());
        let (stop, written) = (Arc::clone(&stop), Arc::clone(&written));
        writers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                match &outbox {
                    Some(outbox) => {
                        let mut tx = outbox.begin().await?;
                        tx.publish(Tick { writer, n })?;
                        tx.commit().await?;
                    }
                    None => {
                        // The same shape as an application's: a transaction, one insert.
                        let mut tx = pool.begin().await?;
                        sqlx::query("INSERT INTO ordo.events (payload) VALUES ($1)")
                            .bind(sqlx::types::Json(Tick { writer, n }))
                            .execute(&mut *tx)
                            .await?;
                        tx.commit().await?;
                    }
                }
                written.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
            anyhow::Ok(())
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await; // warm-up
    let lsn = |pool: PgPool| async move {
        sqlx::query_scalar::<_, String>("SELECT pg_current_wal_insert_lsn()::text")
            .fetch_one(&pool)
            .await
    };
    let (w0, l0, t0, c0) = (
        written.load(Ordering::Relaxed),
        lsn(pool.clone()).await?,
        Instant::now(),
        cpu_ticks(),
    );
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let (w1, l1, t1, c1) = (
        written.load(Ordering::Relaxed),
        lsn(pool.clone()).await?,
        Instant::now(),
        cpu_ticks(),
    );
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await??;
    }
    let bytes: f64 = sqlx::query_scalar("SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::float8")
        .bind(&l1)
        .bind(&l0)
        .fetch_one(&pool)
        .await?;
    let events = (w1 - w0) as f64;
    let cpu = match (c0, c1) {
        (Some((client0, server0)), Some((client1, server1))) => {
            let per_event = |ticks: u64| ticks as f64 * 1e6 / TICKS_PER_SECOND / events;
            format!(
                "  CPU µs/event: client {:>5.1}, server {:>5.1}",
                per_event(client1.saturating_sub(client0)),
                per_event(server1.saturating_sub(server0))
            )
        }
        _ => String::new(),
    };
    println!(
        "wal: {WRITERS} writers, {:<28} {:>8.0} events/s  {:>6.0} WAL bytes/event{cpu}",
        match (ordo, config_folds) {
            (true, true) => "ordo (commit lane folding)",
            (true, false) => "ordo (no sequencer)",
            (false, _) => "raw INSERT (no ordo)",
        },
        events / (t1 - t0).as_secs_f64(),
        bytes / events
    );
    if let Some(outbox) = outbox {
        outbox.shutdown().await;
    }
    Ok(())
}

/// The kernel's unit for `/proc/*/stat` times (`USER_HZ`, 100 on every Linux this runs on).
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU time so far (user + system, in ticks) of this process and of every process named
/// `postgres` on the machine, or `None` where `/proc` cannot tell (not Linux). Backends that
/// exit between two readings take their time with them: the phases keep their pools open.
fn cpu_ticks() -> Option<(u64, u64)> {
    let ticks = |stat: &str| -> Option<(String, u64)> {
        // `pid (comm) state ...`: comm may hold spaces, so split after its closing parenthesis.
        let open = stat.find('(')?;
        let close = stat.rfind(')')?;
        let comm = stat.get(open + 1..close)?.to_owned();
        let fields: Vec<&str> = stat.get(close + 2..)?.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the line, 11 and 12 after the state.
        let utime: u64 = fields.get(11)?.parse().ok()?;
        let stime: u64 = fields.get(12)?.parse().ok()?;
        Some((comm, utime + stime))
    };
    let (_, client) = ticks(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
    let mut server = 0;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue; // not a process, or one that just ended
        };
        if let Some((comm, spent)) = ticks(&stat)
            && comm == "postgres"
        {
            server += spent;
        }
    }
    Some((client, server))
}

/// `events` already in the table in transactions of `group` events, folded from scratch.
async fn cold(scratch: &Scratch, events: i64, group: i64) -> Result<()> {
    let pool = scratch.pool(6).await?;
    let started = Instant::now();
    let mut written = 0i64;
    while written < events {
        let chunk = (events - written).min(200_000);
        // Explicit commit_xid values far above any real one, `group` events each.
        sqlx::query(
            "INSERT INTO ordo.events (commit_xid, payload)
             SELECT 1000000000000 + ($1 + g) / $3, '{\"writer\": 0, \"n\": 0}'::jsonb
             FROM generate_series(0, $2 - 1) AS g ORDER BY g",
        )
        .bind(written)
        .bind(chunk)
        .bind(group)
        .execute(&pool)
        .await?;
        written += chunk;
    }
    sqlx::query("ANALYZE ordo.events").execute(&pool).await?;
    let load = started.elapsed();
    let started = Instant::now();
    let outbox = Outbox::<Tick>::new(pool.clone(), config()).await?;
    while (outbox.commit_head().get() as i64) < events {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let folding = started.elapsed();
    outbox.shutdown().await;
    // Baseline in the same run: reading the same rows' (sequence, commit_xid) once, by pages.
    let started = Instant::now();
    let mut after = 0i64;
    loop {
        let page: Vec<(i64, Option<i64>)> = sqlx::query_as(
            "SELECT sequence, commit_xid FROM ordo.events WHERE sequence > $1 ORDER BY sequence LIMIT 5000",
        )
        .bind(after)
        .fetch_all(&pool)
        .await?;
        let Some(last) = page.last() else { break };
        after = last.0;
    }
    let read = started.elapsed();
    println!(
        "cold: {events} events in transactions of {group} (loaded in {:.1} s)",
        load.as_secs_f64()
    );
    println!(
        "  fold              {:>10.0} events/s ({:.2} s, start-up included)",
        events as f64 / folding.as_secs_f64(),
        folding.as_secs_f64()
    );
    println!(
        "  paged read (base) {:>10.0} rows/s   fold/read {:.2}",
        events as f64 / read.as_secs_f64(),
        read.as_secs_f64() / folding.as_secs_f64()
    );
    Ok(())
}
