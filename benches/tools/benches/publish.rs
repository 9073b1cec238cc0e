//! Publish overhead of the write side: ordo's `begin` / `publish` × K / `commit` against a
//! hand-written transaction that inserts the same K payloads into `ordo.events` in one
//! statement, for one writer (K = 1 and K = 10) and for eight concurrent writers.
//!
//! ```sh
//! export DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres
//! cargo bench --bench publish
//! ```
//!
//! Every benchmark runs on its own fresh database (`ordo_load_<random>`, made by
//! `examples/support/scratch.rs`: migrated, dropped `WITH (FORCE)` at the end), so none inherits
//! another's table or index bloat.
//!
//! Two parts:
//! 1. **criterion**: `raw` against `ordo` (default configuration) in three groups,
//!    `publish_k1`, `publish_k10` and `writers8_k1` (total time of eight tasks each committing
//!    `TX_PER_WRITER` single-event transactions, `iter_custom`).
//! 2. **paired**: the machine is shared and noisy, and criterion measures one benchmark after
//!    the other, so a background burst lands on one side of a comparison only. This part keeps
//!    one database per variant open at once and runs short blocks of transactions round-robin
//!    (the starting variant rotating each round); each round yields a ratio to the `raw` block
//!    of the same round, and the median over the rounds is reported. An ordo block ends when its
//!    transactions are committed *and* the sequencer has folded them into the commit log, so
//!    the background work a transaction causes is paid inside its own block. That wait (the
//!    `fold wait` column, the median over the rounds) is also the commit lane's latency for the
//!    block's last transactions: with eight writers, whose block takes a few dozen
//!    milliseconds, it lowers the ratio beside what the sequencer costs, which the sustained
//!    measure of `examples/commit_lane_load.rs` (`ORDO_PHASES=wal`) does not.
//!
//! `ordo` is the default configuration: every `Outbox` also runs the wake-up notifier and
//! listener and the commit-lane sequencer, and their costs are part of what a user pays. The
//! diagnostic variants of the paired part turn one part off to show where the overhead is:
//! `ordo_fold_1ms` (`fold_interval(1 ms)`: the sequencer coalesces appends),
//! `ordo_no_wakeups` (`cross_process_wakeups(false)`), `ordo_no_sequencer` (`sequencer(false)`)
//! and `ordo_bare` (both off: the write path alone). For each variant the paired part also
//! prints what the server did per published transaction (`pg_stat_database` deltas).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, Throughput};
use ordo::{Outbox, OutboxConfig};
use sqlx::PgPool;
use sqlx::types::Json;
use tokio::runtime::Runtime;

#[path = "../examples/support/order.rs"]
mod order;
#[path = "../examples/support/scratch.rs"]
mod scratch;

use order::{OrderPlaced, payload};
use scratch::Scratch;

/// Criterion samples per benchmark (criterion's minimum is 10).
const SAMPLES: usize = 20;
/// Concurrent writer tasks in the scaling group.
const WRITERS: usize = 8;
/// Single-event transactions each writer commits per iteration of the criterion scaling group.
const TX_PER_WRITER: usize = 25;
/// Rounds of the paired part.
const PAIRED_ROUNDS: usize = 15;
/// Connections per pool: eight writers plus ordo's background tasks; six variants stay under the
/// server's 100 connections.
const POOL_SIZE: u32 = 12;

/// The hand-written baseline: the same payloads, one statement, the table's defaults.
const RAW_INSERT: &str = "INSERT INTO ordo.events (payload) SELECT * FROM unnest($1::jsonb[])";

/// Who writes: the hand-written statement, or ordo with its defaults or one part turned off.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Raw,
    Ordo,
    OrdoCoalesced,
    OrdoNoWakeups,
    OrdoNoSequencer,
    OrdoBare,
}

impl Kind {
    const ALL: [Kind; 6] = [
        Kind::Raw,
        Kind::Ordo,
        Kind::OrdoCoalesced,
        Kind::OrdoNoWakeups,
        Kind::OrdoNoSequencer,
        Kind::OrdoBare,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::Raw => "raw",
            Kind::Ordo => "ordo",
            Kind::OrdoCoalesced => "ordo_fold_1ms",
            Kind::OrdoNoWakeups => "ordo_no_wakeups",
            Kind::OrdoNoSequencer => "ordo_no_sequencer",
            Kind::OrdoBare => "ordo_bare",
        }
    }

    fn config(self) -> Option<OutboxConfig> {
        let config = OutboxConfig::default();
        match self {
            Kind::Raw => None,
            Kind::Ordo => Some(config),
            Kind::OrdoCoalesced => Some(config.fold_interval(std::time::Duration::from_millis(1))),
            Kind::OrdoNoWakeups => Some(config.cross_process_wakeups(false)),
            Kind::OrdoNoSequencer => Some(config.sequencer(false)),
            Kind::OrdoBare => Some(config.cross_process_wakeups(false).sequencer(false)),
        }
    }
}

#[derive(Clone)]
enum Writer {
    Raw(PgPool),
    Ordo {
        outbox: Outbox<OrderPlaced>,
        sequencer: bool,
    },
}

impl Writer {
    async fn start(kind: Kind, pool: &PgPool) -> Writer {
        let Some(config) = kind.config() else {
            return Writer::Raw(pool.clone());
        };
        let sequencer = !matches!(kind, Kind::OrdoNoSequencer | Kind::OrdoBare);
        let outbox = Outbox::new(pool.clone(), config)
            .await
            .expect("start the outbox");
        Writer::Ordo { outbox, sequencer }
    }

    /// One transaction that publishes `k` events.
    async fn transaction(&self, k: usize, seed: u64) {
        match self {
            Writer::Raw(pool) => {
                let mut tx = pool.begin().await.expect("begin");
                let payloads: Vec<Json<OrderPlaced>> =
                    (0..k as u64).map(|i| Json(payload(seed + i))).collect();
                sqlx::query(RAW_INSERT)
                    .bind(payloads)
                    .execute(&mut *tx)
                    .await
                    .expect("hand-written insert");
                tx.commit().await.expect("commit");
            }
            Writer::Ordo { outbox, .. } => {
                let mut tx = outbox.begin().await.expect("begin");
                for i in 0..k as u64 {
                    tx.publish(payload(seed + i)).expect("publish");
                }
                tx.commit().await.expect("commit");
            }
        }
    }

    /// `writers` concurrent tasks, each committing `per_writer` transactions of `k` events.
    async fn round(&self, writers: usize, per_writer: usize, k: usize) {
        if writers == 1 {
            for n in 0..per_writer as u64 {
                self.transaction(k, n * k as u64).await;
            }
            return;
        }
        let tasks: Vec<_> = (0..writers as u64)
            .map(|w| {
                let writer = self.clone();
                tokio::spawn(async move {
                    for n in 0..per_writer as u64 {
                        writer.transaction(k, w * 1_000_000 + n * k as u64).await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("writer task");
        }
    }

    /// The commit-log head this writer's sequencer has reached, if it runs one.
    fn folded(&self) -> Option<u64> {
        match self {
            Writer::Ordo {
                outbox,
                sequencer: true,
            } => Some(outbox.commit_head().get()),
            _ => None,
        }
    }

    /// Waits until the sequencer has folded `events` events past `from`.
    async fn drain(&self, from: Option<u64>, events: u64) {
        let Some(from) = from else { return };
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.folded().unwrap_or(u64::MAX) < from + events {
            assert!(Instant::now() < deadline, "the sequencer did not catch up");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    async fn stop(self) {
        if let Writer::Ordo { outbox, .. } = self {
            outbox.shutdown().await;
        }
    }
}

/// A database created for one benchmark (dropped by the shared scratch guard if a benchmark
/// panics first).
struct BenchDb {
    pool: PgPool,
    scratch: Scratch,
}

impl BenchDb {
    async fn create() -> BenchDb {
        // Migrated on a pool of its own whose backends have exited, so the migration's work is
        // in `pg_stat_database` before the benchmark's counters are first read.
        let scratch = Scratch::create(&scratch::server_url())
            .await
            .expect("a scratch database (DATABASE_URL: a role that may CREATE DATABASE)");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let pool = scratch
            .pool(POOL_SIZE)
            .await
            .expect("connect to the bench database");
        BenchDb { pool, scratch }
    }

    /// `xact_commit`, `tup_inserted`, `tup_updated` of this database: every transaction (reads
    /// included), rows inserted (events, commit-log rows), rows updated (the sequencer's state
    /// row, once per append).
    async fn server_counts(&self) -> [i64; 3] {
        let admin = PgPool::connect(&scratch::server_url())
            .await
            .expect("connect to the server");
        let row: (i64, i64, i64) = sqlx::query_as(
            "SELECT xact_commit, tup_inserted, tup_updated FROM pg_stat_database \
             WHERE datname = $1",
        )
        .bind(self.scratch.name())
        .fetch_one(&admin)
        .await
        .expect("read pg_stat_database");
        admin.close().await;
        [row.0, row.1, row.2]
    }

    /// Stops `writer`, closes the pool and returns the counters (backends flush their
    /// statistics as they exit).
    async fn finish(&self, writer: Writer) -> [i64; 3] {
        writer.stop().await;
        self.pool.close().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.server_counts().await
    }

    async fn drop_db(self) {
        self.pool.close().await;
        self.scratch
            .drop_db()
            .await
            .expect("drop the bench database");
    }
}

/// A workload: `writers` concurrent tasks committing transactions of `k` events.
#[derive(Clone, Copy)]
struct Scenario {
    name: &'static str,
    writers: usize,
    k: usize,
    /// Transactions per writer in one paired block.
    block: usize,
}

const SCENARIOS: [Scenario; 3] = [
    Scenario {
        name: "publish_k1",
        writers: 1,
        k: 1,
        block: 250,
    },
    Scenario {
        name: "publish_k10",
        writers: 1,
        k: 10,
        block: 150,
    },
    Scenario {
        name: "writers8_k1",
        writers: WRITERS,
        k: 1,
        block: 30,
    },
];

/// Every `(iterations, elapsed)` criterion asked for, per benchmark, for the summary.
static CALLS: Mutex<BTreeMap<String, Vec<(u64, Duration)>>> = Mutex::new(BTreeMap::new());

fn record(id: &str, iters: u64, elapsed: Duration) {
    if let Ok(mut calls) = CALLS.lock() {
        calls
            .entry(id.to_owned())
            .or_default()
            .push((iters, elapsed));
    }
}

/// Mean time per iteration over the measured samples (the last `SAMPLES` calls; the earlier
/// ones are criterion's warm-up).
fn mean_per_iter(id: &str) -> Option<Duration> {
    let calls = CALLS.lock().ok()?;
    let calls = calls.get(id)?;
    let measured = &calls[calls.len().saturating_sub(SAMPLES)..];
    let iters: u64 = measured.iter().map(|(i, _)| i).sum();
    let total: Duration = measured.iter().map(|(_, d)| *d).sum();
    (iters > 0).then(|| total / u32::try_from(iters).unwrap_or(u32::MAX))
}

/// Part 1: criterion, `raw` then `ordo`, each on a database of its own.
fn criterion_group(c: &mut Criterion, runtime: &Runtime, scenario: Scenario) {
    let mut group = c.benchmark_group(scenario.name);
    group
        .sample_size(SAMPLES)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    // One iteration: one transaction, or one round of the eight writers.
    let per_writer = if scenario.writers == 1 {
        1
    } else {
        group.sampling_mode(SamplingMode::Flat);
        TX_PER_WRITER
    };
    let events = scenario.writers * per_writer * scenario.k;
    group.throughput(Throughput::Elements(events as u64));
    for kind in [Kind::Raw, Kind::Ordo] {
        let db = runtime.block_on(BenchDb::create());
        let writer = runtime.block_on(Writer::start(kind, &db.pool));
        let id = format!("{}/{}", scenario.name, kind.name());
        group.bench_function(kind.name(), |b| {
            b.to_async(runtime).iter_custom(|iters| {
                let writer = writer.clone();
                let id = id.clone();
                async move {
                    let start = Instant::now();
                    for _ in 0..iters {
                        writer.round(scenario.writers, per_writer, scenario.k).await;
                    }
                    let elapsed = start.elapsed();
                    record(&id, iters, elapsed);
                    elapsed
                }
            });
        });
        runtime.block_on(writer.stop());
        runtime.block_on(db.drop_db());
    }
    group.finish();
}

/// What the paired part measured for one scenario.
struct Paired {
    /// Per kind (in `Kind::ALL` order), each round's block time.
    times: Vec<Vec<Duration>>,
    /// Per kind, each round's wait for the sequencer after the block's last commit (part of
    /// the block time; zero without a sequencer). With eight writers a block is a few dozen
    /// milliseconds, so the commit lane's latency for the last transactions weighs on the
    /// ratio by itself, beside what the sequencer costs.
    waits: Vec<Vec<Duration>>,
    /// Per kind, server counters per published transaction.
    server: Vec<[f64; 3]>,
}

impl Paired {
    /// Per round, `kind`'s block time over `raw`'s.
    fn ratios(&self, kind: usize) -> Vec<f64> {
        let raw = &self.times[0];
        let mut ratios: Vec<f64> = self.times[kind]
            .iter()
            .zip(raw)
            .map(|(ours, raw)| ours.as_secs_f64() / raw.as_secs_f64())
            .collect();
        ratios.sort_by(f64::total_cmp);
        ratios
    }
}

fn median_f64(sorted: &[f64]) -> f64 {
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Part 2: every kind on a database of its own, blocks round-robin.
async fn paired(scenario: Scenario, rounds: usize) -> Paired {
    let mut dbs = Vec::new();
    let mut writers = Vec::new();
    let mut before = Vec::new();
    for kind in Kind::ALL {
        let db = BenchDb::create().await;
        writers.push(Writer::start(kind, &db.pool).await);
        before.push(db.server_counts().await);
        dbs.push(db);
    }
    let events = (scenario.writers * scenario.block * scenario.k) as u64;
    let block = |writer: &Writer| {
        let writer = writer.clone();
        async move {
            let from = writer.folded();
            let start = Instant::now();
            writer
                .round(scenario.writers, scenario.block, scenario.k)
                .await;
            let written = Instant::now();
            writer.drain(from, events).await;
            (start.elapsed(), written.elapsed())
        }
    };
    // One untimed block each: connections, plans and caches warm.
    for writer in &writers {
        block(writer).await;
    }
    let mut times = vec![Vec::with_capacity(rounds); writers.len()];
    let mut waits = vec![Vec::with_capacity(rounds); writers.len()];
    for round in 0..rounds {
        for i in 0..writers.len() {
            let kind = (round + i) % writers.len();
            let (time, wait) = block(&writers[kind]).await;
            times[kind].push(time);
            waits[kind].push(wait);
        }
    }
    let transactions = ((rounds + 1) * scenario.writers * scenario.block) as f64;
    let mut server = Vec::new();
    for ((db, writer), before) in dbs.into_iter().zip(writers).zip(before) {
        let after = db.finish(writer).await;
        server.push(std::array::from_fn(|i| {
            (after[i] - before[i]) as f64 / transactions
        }));
        db.drop_db().await;
    }
    Paired {
        times,
        waits,
        server,
    }
}

fn print_criterion_summary() {
    println!("\n== part 1, criterion: ordo over raw (mean time per iteration) ==");
    for scenario in SCENARIOS {
        let ours = mean_per_iter(&format!("{}/ordo", scenario.name));
        let raw = mean_per_iter(&format!("{}/raw", scenario.name));
        if let (Some(ours), Some(raw)) = (ours, raw) {
            let r = ours.as_secs_f64() / raw.as_secs_f64();
            println!(
                "{:<12} ordo {ours:>9.1?} raw {raw:>9.1?}: time ratio {r:.3}, throughput {:.2}x of raw",
                scenario.name,
                1.0 / r
            );
        }
    }
}

fn print_paired(scenario: Scenario, paired: &Paired) {
    let tx = (scenario.writers * scenario.block) as f64;
    println!(
        "\n{} ({} writer(s) x {} tx of {} event(s) per block, {} rounds)",
        scenario.name,
        scenario.writers,
        scenario.block,
        scenario.k,
        paired.times[0].len()
    );
    println!(
        "  {:<18} {:>9} {:>22} {:>12} {:>10} {:>12} {:>13} {:>12}",
        "variant",
        "tx/s",
        "time / raw (min-max)",
        "throughput",
        "fold wait",
        "xact_commit",
        "tup_inserted",
        "tup_updated"
    );
    for (i, kind) in Kind::ALL.iter().enumerate() {
        let mut times = paired.times[i].clone();
        times.sort();
        let median = times.get(times.len() / 2).copied().unwrap_or_default();
        let ratios = paired.ratios(i);
        let r = median_f64(&ratios);
        let spread = format!(
            "{r:.3} ({:.2}-{:.2})",
            ratios.first().copied().unwrap_or(f64::NAN),
            ratios.last().copied().unwrap_or(f64::NAN)
        );
        let mut waits = paired.waits[i].clone();
        waits.sort();
        let wait = waits.get(waits.len() / 2).copied().unwrap_or_default();
        let [commits, inserted, updated] = paired.server[i];
        println!(
            "  {:<18} {:>9.0} {spread:>22} {:>11.2}x {:>7.1} ms {commits:>12.2} {inserted:>13.2} {updated:>12.2}",
            kind.name(),
            tx / median.as_secs_f64(),
            1.0 / r,
            wait.as_secs_f64() * 1e3,
        );
    }
}

/// Scaling from one writer to eight, each kind's relative to raw's: the ratio of the paired
/// throughput ratios, so that no comparison spans two moments of the machine.
fn print_scaling(one: &Paired, eight: &Paired) {
    println!("\n== scaling 1 -> {WRITERS} writers, K = 1 (paired medians) ==");
    for (i, kind) in Kind::ALL.iter().enumerate().skip(1) {
        let at_one = 1.0 / median_f64(&one.ratios(i));
        let at_eight = 1.0 / median_f64(&eight.ratios(i));
        println!(
            "  {:<18} throughput vs raw: {at_one:.2}x with 1 writer, {at_eight:.2}x with {WRITERS}; \
             scales {:.2}x as well as raw",
            kind.name(),
            at_eight / at_one
        );
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut criterion = Criterion::default().configure_from_args();
    for scenario in SCENARIOS {
        criterion_group(&mut criterion, &runtime, scenario);
    }
    criterion.final_summary();
    // `cargo bench -- --test` is a smoke test: criterion runs each benchmark once, and so do we.
    let test_mode = std::env::args().any(|arg| arg == "--test");
    let rounds = if test_mode { 1 } else { PAIRED_ROUNDS };
    print_criterion_summary();
    println!("\n== part 2, paired blocks round-robin: median over rounds of time / raw ==");
    let mut results = Vec::new();
    for scenario in SCENARIOS {
        let paired = runtime.block_on(paired(scenario, rounds));
        print_paired(scenario, &paired);
        results.push(paired);
    }
    if let [one, _, eight] = results.as_slice() {
        print_scaling(one, eight);
    }
}
