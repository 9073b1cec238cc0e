//! ordo beside the peer library, obix 0.16 (public API only), in one binary and one sitting:
//! the rows of `PERFORMANCE.md` that compare the two, each with its baseline measured in the same run.
//!
//! ```sh
//! export DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres
//! cd benches/peer && cargo run --release                 # both phases, 2 sittings (~3 min)
//! cargo run --release -- --phases single --seconds 3 --sittings 3
//! cargo run --release -- --phases lag --writers 8 --folders 1,3
//! ```
//!
//! Each run gets a fresh database (`ordo_load_<random>`, dropped at the end) holding both
//! schemas: ordo's (`ordo::migrate`) and obix's (its shipped migration, read from the obix
//! crate's sources in cargo's registry). Every pool has 10 connections and sqlx's defaults;
//! each library runs with its defaults (`OutboxConfig::default()`, `MailboxConfig::builder()`),
//! but for the switch named. Within a sitting the variants run in order and then in reverse
//! (A, B, C, C, B, A), so background load falls on both sides of a comparison.
//!
//! Phases:
//! - `single`: one writer, one event per transaction. Variants `raw` (`pool.begin()`, an
//!   `INSERT` into `ordo.events`, `commit()`), `ordo` (commit lane on), `ordo_off`
//!   (`sequencer(false)`), `obix` (`CommitLane::Disabled`, its default) and `obix_commit`
//!   (`CommitLane::Enabled`). First flat out for `--seconds`: transactions per second, as a
//!   ratio of the nearest `raw` run, and each transaction's latency from before it begins to
//!   its commit returning. Then paced at `--rate` with listeners in the writer's process, on the
//!   insert lane and (where it runs) the commit lane, both from now: latency from just before
//!   `commit()` is called (obix: `op.commit()`, which runs its insert hook) to the listener's
//!   task holding the event. `raw` has no listener: its paced figure is from before its
//!   `INSERT` to its `commit()` returning, the floor of either library.
//! - `lag`: `--writers` writers (default 8) as fast as they go for `--seconds`, through one
//!   outbox whose process also listens on the commit lane; latency from before `commit()` is
//!   called to that listener, and (`from commit() returning`) from `commit()` returning to
//!   it: the part the commit lane adds after the commit itself. With `--lag-rate N` the writers offer N transactions per second
//!   between them instead (each paced at its share; a tick a slow transaction missed is
//!   skipped), so both libraries can be compared at the same load: flat out, the faster
//!   publisher also loads the machine more. With `--folders` outboxes folding (default `1,3`): the extra ones
//!   are other processes on pools of their own (ordo: `Outbox` with its sequencer; obix: an
//!   `Outbox` with `CommitLane::Enabled`, which folds in every process that runs it). Variants
//!   `ordo` and `obix_commit`.
//!
//! - `turns`: `single`'s measurements with every variant's database, writer and listeners
//!   ready at once, the variants taking turns in slices of `--slice` milliseconds (default
//!   100), in order and then in reverse (A, B, C, C, B, A, A, …): first flat out until each
//!   has written for `--seconds`, then paced at `--rate` (one clock; each tick's transaction is
//!   the current variant's) until each has `--seconds` of ticks. A variant's rate is its
//!   transactions over its own slices; the first tenth of each paced slice is not recorded (a
//!   writer idle through the others' slices starts cold). On a machine whose load comes and
//!   goes, a burst falls
//!   on every variant alike, where `single`'s runs, one after another, each get their own
//!   (`benches/tools/examples/single_writer --interleave` does the same for ordo's variants alone). Listeners
//!   of the variants not taking their turn are idle, but each library's own tasks keep running.
//!
//! The first half second of every phase is warm-up and is not recorded. Options: `--phases
//! single,lag,turns`, `--seconds N` (3), `--sittings N` (2), `--rate N` (500), `--writers N`
//! (8), `--folders 1,3`, `--lag-rate N` (unset: flat out), `--slice MS` (100).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use hdrhistogram::Histogram;
use obix::{CommitLane, MailboxConfig};
use ordo::{OutboxConfig, Start};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::time::MissedTickBehavior;

#[path = "../../tools/examples/support/measure.rs"]
mod measure;
#[path = "../../tools/examples/support/order.rs"]
mod order;
#[path = "../../tools/examples/support/scratch.rs"]
mod scratch;
#[path = "../../tools/examples/support/write.rs"]
mod write;

use measure::{histogram, load, ms, nanos, quantiles};
use order::{OrderPlaced, payload};
use scratch::Scratch;

const WARM_UP: Duration = Duration::from_millis(500);
const POOL: u32 = 10;
const PATIENCE: Duration = Duration::from_secs(30);
const OBIX_VERSION: &str = "0.16.0";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    Raw,
    Ordo,
    OrdoOff,
    Obix,
    ObixCommit,
}

impl Variant {
    const ALL: [Variant; 5] = [
        Variant::Raw,
        Variant::Ordo,
        Variant::OrdoOff,
        Variant::Obix,
        Variant::ObixCommit,
    ];

    fn name(self) -> &'static str {
        match self {
            Variant::Raw => "raw",
            Variant::Ordo => "ordo",
            Variant::OrdoOff => "ordo_off",
            Variant::Obix => "obix",
            Variant::ObixCommit => "obix_commit",
        }
    }

    fn commit_lane(self) -> bool {
        matches!(self, Variant::Ordo | Variant::ObixCommit)
    }
}

struct Settings {
    phases: Vec<String>,
    seconds: f64,
    sittings: usize,
    rate: u32,
    writers: u32,
    folders: Vec<u32>,
    /// The lag phase's offered load, in transactions per second across all writers; `None`
    /// runs them flat out.
    lag_rate: Option<u32>,
    /// The `turns` phase's slice.
    slice: Duration,
}

fn settings() -> Result<Settings> {
    let mut s = Settings {
        phases: vec!["single".into(), "lag".into()],
        seconds: 3.0,
        sittings: 2,
        rate: 500,
        writers: 8,
        folders: vec![1, 3],
        lag_rate: None,
        slice: Duration::from_millis(100),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--phases" => s.phases = value()?.split(',').map(str::to_owned).collect(),
            "--seconds" => s.seconds = value()?.parse().context("--seconds")?,
            "--sittings" => s.sittings = value()?.parse().context("--sittings")?,
            "--rate" => s.rate = value()?.parse().context("--rate")?,
            "--writers" => s.writers = value()?.parse().context("--writers")?,
            "--lag-rate" => s.lag_rate = Some(value()?.parse().context("--lag-rate")?),
            "--folders" => {
                s.folders = value()?
                    .split(',')
                    .map(|f| f.parse().context("--folders"))
                    .collect::<Result<_>>()?;
            }
            "--slice" => {
                let ms: u64 = value()?.parse().context("--slice takes milliseconds")?;
                if !(1..=10_000).contains(&ms) {
                    bail!("--slice must be 1 to 10,000 milliseconds");
                }
                s.slice = Duration::from_millis(ms);
            }
            other => bail!(
                "unknown option {other:?} (--phases, --seconds, --sittings, --rate, --writers, --folders, --lag-rate, --slice)"
            ),
        }
    }
    if let Some(phase) = s
        .phases
        .iter()
        .find(|p| !["single", "lag", "turns"].contains(&p.as_str()))
    {
        bail!("unknown phase {phase:?} (single, lag, turns)");
    }
    if s.seconds.is_nan() || s.seconds <= 0.5 {
        bail!("--seconds must exceed 0.5");
    }
    if s.sittings == 0
        || s.rate == 0
        || s.writers == 0
        || s.folders.contains(&0)
        || s.lag_rate == Some(0)
    {
        bail!("--sittings, --rate, --writers, --lag-rate and each of --folders must be at least 1");
    }
    Ok(s)
}

/// obix's schema, from its sources in cargo's registry (where building this crate put them).
fn obix_setup_sql() -> Result<String> {
    let home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cargo")))
        .context("neither CARGO_HOME nor HOME is set")?;
    let sources = home.join("registry").join("src");
    let crate_dir = format!("obix-{OBIX_VERSION}");
    for index in
        std::fs::read_dir(&sources).with_context(|| format!("reading {}", sources.display()))?
    {
        let migrations = index?.path().join(&crate_dir).join("migrations");
        if let Ok(entries) = std::fs::read_dir(&migrations) {
            for entry in entries {
                let path = entry?.path();
                if path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.ends_with("_obix_setup.sql"))
                {
                    return std::fs::read_to_string(&path)
                        .with_context(|| format!("reading {}", path.display()));
                }
            }
        }
    }
    bail!(
        "obix {OBIX_VERSION}'s migration is not under {}: build this crate first (cargo build --release)",
        sources.display()
    )
}

/// A fresh database with both schemas, and the pools a run uses.
struct Db {
    scratch: Scratch,
    obix_sql: Arc<String>,
}

impl Db {
    async fn create(obix_sql: Arc<String>) -> Result<Self> {
        let scratch = Scratch::create(&scratch::server_url()).await?;
        let db = Self { scratch, obix_sql };
        let pool = db.obix_pool(1).await?;
        sqlx08::raw_sql(db.obix_sql.as_str())
            .execute(&pool)
            .await
            .context("obix's migration")?;
        pool.close().await;
        Ok(db)
    }

    async fn pool(&self, size: u32) -> Result<PgPool> {
        Ok(PgPoolOptions::new()
            .max_connections(size)
            .connect(self.scratch.url())
            .await?)
    }

    async fn obix_pool(&self, size: u32) -> Result<sqlx08::PgPool> {
        Ok(sqlx08::postgres::PgPoolOptions::new()
            .max_connections(size)
            .connect(self.scratch.url())
            .await?)
    }

    async fn drop(self) -> Result<()> {
        self.scratch.drop_db().await
    }
}

type Peer = obix::out::Outbox<OrderPlaced>;

/// One library's write path (and the process it runs in).
enum Writer {
    Raw(PgPool),
    Ordo(ordo::Outbox<OrderPlaced>, PgPool),
    Obix(Peer, sqlx08::PgPool),
}

impl Writer {
    async fn start(variant: Variant, db: &Db) -> Result<Self> {
        Ok(match variant {
            Variant::Raw => Writer::Raw(db.pool(POOL).await?),
            Variant::Ordo | Variant::OrdoOff => {
                let pool = db.pool(POOL).await?;
                let config = OutboxConfig::default().sequencer(variant == Variant::Ordo);
                Writer::Ordo(ordo::Outbox::new(pool.clone(), config).await?, pool)
            }
            Variant::Obix | Variant::ObixCommit => {
                let pool = db.obix_pool(POOL).await?;
                let lane = if variant == Variant::ObixCommit {
                    CommitLane::Enabled
                } else {
                    CommitLane::Disabled
                };
                let config = MailboxConfig::builder().commit_lane(lane).build();
                let outbox = Peer::init(&pool, config)
                    .await
                    .map_err(|e| anyhow::anyhow!("obix init: {e}"))?;
                Writer::Obix(outbox, pool)
            }
        })
    }

    /// One transaction publishing order `n`: just before its commit was called (for raw, just
    /// before its `INSERT`), and when the commit returned.
    async fn transaction(&self, n: u64) -> Result<(Instant, Instant)> {
        match self {
            Writer::Raw(pool) => {
                let stamps = write::plain(pool, n).await?;
                Ok((stamps.before, stamps.after))
            }
            Writer::Ordo(outbox, _) => {
                let stamps = write::through_ordo(outbox, n).await?;
                Ok((stamps.before, stamps.after))
            }
            Writer::Obix(outbox, _) => {
                let mut op = outbox.begin_op().await?;
                outbox.publish_persisted_in_op(&mut op, payload(n)).await?;
                let before = Instant::now();
                op.commit().await?;
                Ok((before, Instant::now()))
            }
        }
    }

    /// The numbers of the orders this process's listener gets on the insert lane (`commit`
    /// false) or the commit lane, from now on.
    fn listen(&self, commit: bool) -> Result<Option<Numbers>> {
        Ok(match self {
            Writer::Raw(_) => None,
            Writer::Ordo(outbox, _) if commit => Some(
                outbox
                    .listen_committed(Start::Now)
                    .map(|e| e.map(|e| e.event.payload.number()).map_err(Into::into))
                    .boxed(),
            ),
            Writer::Ordo(outbox, _) => Some(
                outbox
                    .listen_inserted(Start::Now)
                    .map(|e| e.map(|e| e.payload.number()).map_err(Into::into))
                    .boxed(),
            ),
            Writer::Obix(outbox, _) if commit => Some(
                outbox
                    .listen_commit_ordered(None)
                    .map_err(|e| anyhow::anyhow!("obix commit lane: {e}"))?
                    .map(obix_number)
                    .boxed(),
            ),
            Writer::Obix(outbox, _) => Some(outbox.listen_persisted(None).map(obix_number).boxed()),
        })
    }

    async fn shutdown(self) {
        match self {
            Writer::Raw(pool) => pool.close().await,
            Writer::Ordo(outbox, pool) => {
                outbox.shutdown().await;
                pool.close().await;
            }
            Writer::Obix(outbox, pool) => {
                drop(outbox);
                pool.close().await;
            }
        }
    }
}

type Numbers = futures::stream::BoxStream<'static, Result<u64>>;

fn obix_number<L: obix::out::Lane, E: std::fmt::Debug>(
    item: Result<obix::out::EventDelivery<OrderPlaced, L>, E>,
) -> Result<u64> {
    let delivery = item.map_err(|e| anyhow::anyhow!("obix: {e:?}"))?;
    delivery
        .payload
        .as_ref()
        .map(OrderPlaced::number)
        .context("an obix event without a payload")
}

/// When something happened to each order, by number.
type Times = Arc<Mutex<HashMap<u64, Instant>>>;

/// Notes when each order numbered at or above `first` reaches the listener, until `total` have
/// (or `stop`); `heard` counts them as they come.
fn listener(
    mut numbers: Numbers,
    first: u64,
    total: Option<u64>,
    heard: Arc<AtomicU64>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Listening {
    tokio::spawn(async move {
        let mut seen = HashMap::new();
        loop {
            let number = tokio::select! {
                number = numbers.next() => number,
                _ = stop.wait_for(|s| *s) => break,
            };
            let Some(number) = number else { break };
            let number = number?;
            let at = Instant::now();
            if number < first {
                continue;
            }
            seen.insert(number, at);
            let count = heard.fetch_add(1, Ordering::Relaxed) + 1;
            if total.is_some_and(|total| count >= total) {
                break;
            }
        }
        Ok(seen)
    })
}

/// `writer`'s listeners in its process, from now on: the insert lane's and, where `variant`
/// runs it, the commit lane's, each with the count of what it heard (see [`listener`]).
fn listeners(
    writer: &Writer,
    variant: Variant,
    first: u64,
    total: Option<u64>,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> Result<Vec<(Arc<AtomicU64>, Listening)>> {
    let mut listening = Vec::new();
    for commit in [false, true] {
        if commit && !variant.commit_lane() {
            continue;
        }
        if let Some(numbers) = writer.listen(commit)? {
            let heard = Arc::new(AtomicU64::new(0));
            let task = listener(numbers, first, total, Arc::clone(&heard), stop.clone());
            listening.push((heard, task));
        }
    }
    Ok(listening)
}

/// Each recorded start's latency to when the listener had it.
fn latencies(
    starts: &HashMap<u64, Instant>,
    seen: &HashMap<u64, Instant>,
) -> Result<Histogram<u64>> {
    let mut h = histogram()?;
    for (number, start) in starts {
        let at = seen
            .get(number)
            .with_context(|| format!("order {number} never reached the listener"))?;
        h.record(nanos(at.saturating_duration_since(*start)))?;
    }
    Ok(h)
}

struct Single {
    variant: Variant,
    tps: f64,
    tx: Histogram<u64>,
    inserted: Histogram<u64>,
    committed: Option<Histogram<u64>>,
}

async fn single(variant: Variant, settings: &Settings, obix_sql: &Arc<String>) -> Result<Single> {
    let db = Db::create(Arc::clone(obix_sql)).await?;
    let writer = Writer::start(variant, &db).await?;
    // Flat out.
    let mut n = 0u64;
    write::warm(WARM_UP, &mut n, |n| writer.transaction(n)).await?;
    let run = write::flat_out(settings.seconds, &mut n, |n| writer.transaction(n)).await?;
    let tx = run.latencies;
    let tps = run.count as f64 / run.seconds;
    // Paced, with listeners in this process.
    let first = 1 << 40;
    let total = (f64::from(settings.rate) * settings.seconds) as u64;
    let warm = (f64::from(settings.rate) * WARM_UP.as_secs_f64()) as u64;
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    let tasks = listeners(&writer, variant, first, Some(total), &stopped)?;
    // Let the streams start before the clock does.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(settings.rate)));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut floor = histogram()?;
    let mut starts = HashMap::new();
    for i in 0..total {
        tick.tick().await;
        let (before, _) = writer.transaction(first + i).await?;
        if i >= warm {
            starts.insert(first + i, before);
            floor.record(nanos(before.elapsed()))?;
        }
    }
    let mut heard = Vec::new();
    for (_, task) in tasks {
        let seen = tokio::time::timeout(PATIENCE, task)
            .await
            .context("a listener did not receive every event in time")???;
        heard.push(latencies(&starts, &seen)?);
    }
    writer.shutdown().await;
    db.drop().await?;
    let mut heard = heard.into_iter();
    Ok(Single {
        variant,
        tps,
        tx,
        inserted: heard.next().unwrap_or(floor),
        committed: heard.next(),
    })
}

fn print_single(run: &Single, raw: Option<&Single>) {
    let ratio = raw.map_or(String::from("-"), |raw| {
        format!("{:.2}x", run.tps / raw.tps)
    });
    let over = raw.map_or(String::from("-"), |raw| {
        format!(
            "{:+.0}",
            (run.tx.value_at_quantile(0.5) as f64 - raw.tx.value_at_quantile(0.5) as f64) / 1e3
        )
    });
    let what = if run.variant == Variant::Raw {
        "INSERT+COMMIT"
    } else {
        "insert lane"
    };
    println!(
        "  {:<11} {:>6.0} tx/s {:>6} of raw | tx p50 {:.3} ms ({} us over raw) p99 {:.3} | paced: {what} {}{}",
        run.variant.name(),
        run.tps,
        ratio,
        ms(run.tx.value_at_quantile(0.5)),
        over,
        ms(run.tx.value_at_quantile(0.99)),
        quantiles(&run.inserted),
        run.committed.as_ref().map_or(String::new(), |h| format!(
            " | commit lane {}",
            quantiles(h)
        )),
    );
}

async fn single_sitting(settings: &Settings, obix_sql: &Arc<String>) -> Result<()> {
    let mut order = Variant::ALL.to_vec();
    let mut back = order.clone();
    back.reverse();
    order.extend(back);
    let mut runs = Vec::new();
    for variant in order {
        runs.push(single(variant, settings, obix_sql).await?);
    }
    // Each half beside its own raw run.
    let half = runs.len() / 2;
    for part in [&runs[..half], &runs[half..]] {
        let raw = part.iter().find(|r| r.variant == Variant::Raw);
        for run in part {
            print_single(run, raw.filter(|_| run.variant != Variant::Raw));
        }
    }
    Ok(())
}

/// One variant of a `turns` sitting: its writer, its listeners and what it measured.
struct Turn {
    variant: Variant,
    writer: Writer,
    db: Db,
    tx: Histogram<u64>,
    count: u64,
    time: Duration,
    /// Paced: when each of its transactions was about to commit, by number (after warm-up).
    starts: HashMap<u64, Instant>,
    /// Paced: before its `INSERT` to `commit()` returning (raw's floor).
    floor: Histogram<u64>,
    /// Its insert-lane listener and, where it runs one, its commit-lane listener.
    listeners: Vec<(Arc<AtomicU64>, Listening)>,
}

/// A [`listener`]'s task: when each order reached it, by number.
type Listening = tokio::task::JoinHandle<Result<HashMap<u64, Instant>>>;

/// The slices of one round: every variant in order, then in reverse.
fn round(k: usize) -> Vec<usize> {
    (0..k).chain((0..k).rev()).collect()
}

/// The `turns` phase (see the module's docs).
async fn turns_sitting(settings: &Settings, obix_sql: &Arc<String>) -> Result<()> {
    let first = 1u64 << 40;
    let (stop_tx, stopped) = tokio::sync::watch::channel(false);
    let mut turns = Vec::new();
    let mut n = 0u64;
    for variant in Variant::ALL {
        let db = Db::create(Arc::clone(obix_sql)).await?;
        let writer = Writer::start(variant, &db).await?;
        let warm = Instant::now() + WARM_UP;
        while Instant::now() < warm {
            writer.transaction(n).await?;
            n += 1;
        }
        let listeners = listeners(&writer, variant, first, None, &stopped)?;
        turns.push(Turn {
            variant,
            writer,
            db,
            tx: histogram()?,
            count: 0,
            time: Duration::ZERO,
            starts: HashMap::new(),
            floor: histogram()?,
            listeners,
        });
    }
    // Let the streams start before the clock does.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let each = Duration::from_secs_f64(settings.seconds);
    let order = round(turns.len());
    // Flat out.
    while turns.iter().any(|turn| turn.time < each) {
        for &i in &order {
            let turn = &mut turns[i];
            let started = Instant::now();
            let until = started + settings.slice;
            while Instant::now() < until {
                let t = Instant::now();
                turn.writer.transaction(n).await?;
                turn.tx.record(nanos(t.elapsed()))?;
                n += 1;
                turn.count += 1;
            }
            turn.time += started.elapsed();
        }
    }
    // Paced: one clock, each tick's transaction the current slice's variant's.
    let per_slice =
        ((f64::from(settings.rate) * settings.slice.as_secs_f64()).round() as u64).max(1);
    let total = (f64::from(settings.rate) * settings.seconds) as u64;
    let warm = (f64::from(settings.rate) * WARM_UP.as_secs_f64()) as u64;
    // A writer idle through the other variants' slices starts its own cold (its connection's
    // backend, the caches): the first tenth of each slice is not recorded.
    let slice_warm = per_slice / 10;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(settings.rate)));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut paced = vec![0u64; turns.len()];
    let mut number = first;
    while paced.iter().any(|&done| done < total + warm) {
        for &i in &order {
            let turn = &mut turns[i];
            for k in 0..per_slice {
                tick.tick().await;
                let (before, _) = turn.writer.transaction(number).await?;
                if paced[i] >= warm && k >= slice_warm {
                    turn.starts.insert(number, before);
                    turn.floor.record(nanos(before.elapsed()))?;
                }
                paced[i] += 1;
                number += 1;
            }
        }
    }
    // Every listener has every paced event of its variant, then all stop.
    let deadline = Instant::now() + PATIENCE;
    for (turn, &sent) in turns.iter().zip(&paced) {
        for (heard, _) in &turn.listeners {
            while heard.load(Ordering::Relaxed) < sent {
                if Instant::now() > deadline {
                    bail!(
                        "{}: a listener heard {} of {sent} paced events within {PATIENCE:?}",
                        turn.variant.name(),
                        heard.load(Ordering::Relaxed)
                    );
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    let _ = stop_tx.send(true);
    let mut runs = Vec::new();
    for turn in turns {
        let mut heard = Vec::new();
        for (_, task) in turn.listeners {
            heard.push(latencies(&turn.starts, &task.await??)?);
        }
        turn.writer.shutdown().await;
        turn.db.drop().await?;
        let mut heard = heard.into_iter();
        runs.push(Single {
            variant: turn.variant,
            tps: turn.count as f64 / turn.time.as_secs_f64(),
            tx: turn.tx,
            inserted: heard.next().unwrap_or(turn.floor),
            committed: heard.next(),
        });
    }
    let raw = runs.iter().find(|run| run.variant == Variant::Raw);
    for run in &runs {
        print_single(run, raw.filter(|_| run.variant != Variant::Raw));
    }
    Ok(())
}

/// `writers` writers through one outbox, flat out or together at `--lag-rate` (each paced at its
/// share, their ticks staggered), `folders` outboxes folding in all; the commit-lane latency a
/// listener in the writers' process sees.
async fn lag(
    variant: Variant,
    writers: u32,
    folders: u32,
    settings: &Settings,
    obix_sql: &Arc<String>,
) -> Result<(f64, Histogram<u64>, Histogram<u64>)> {
    let db = Db::create(Arc::clone(obix_sql)).await?;
    let writer = Arc::new(Writer::start(variant, &db).await?);
    let mut others = Vec::new();
    for _ in 1..folders {
        others.push(Writer::start(variant, &db).await?);
    }
    let starts: Times = Arc::default();
    let returns: Times = Arc::default();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let numbers = writer.listen(true)?.context("no commit lane")?;
    let heard = Arc::new(AtomicU64::new(0));
    let listening = listener(numbers, 0, None, Arc::clone(&heard), stop);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let warm = Instant::now() + WARM_UP;
    let until = warm + Duration::from_secs_f64(settings.seconds);
    // Each writer's share of the offered load: one transaction per `period`, the writers'
    // ticks spread over it. A tick missed (a transaction slower than the period) is skipped,
    // not made up in a burst: the run reports the rate it reached.
    let period = settings
        .lag_rate
        .map(|rate| Duration::from_secs_f64(f64::from(writers) / f64::from(rate)));
    let mut tasks = Vec::new();
    for w in 0..writers {
        let writer = Arc::clone(&writer);
        let starts = Arc::clone(&starts);
        let returns = Arc::clone(&returns);
        let mut tick = period.map(|period| {
            let first =
                tokio::time::Instant::now() + period.mul_f64(f64::from(w) / f64::from(writers));
            let mut tick = tokio::time::interval_at(first, period);
            tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
            tick
        });
        tasks.push(tokio::spawn(async move {
            let mut all = 0u64;
            while Instant::now() < until {
                if let Some(tick) = tick.as_mut() {
                    tick.tick().await;
                }
                let number = (u64::from(w) << 32) + all;
                let recorded = Instant::now() >= warm;
                let (before, returned) = writer.transaction(number).await?;
                if recorded && let Ok(mut starts) = starts.lock() {
                    starts.insert(number, before);
                }
                if recorded && let Ok(mut returns) = returns.lock() {
                    returns.insert(number, returned);
                }
                all += 1;
            }
            anyhow::Ok(all)
        }));
    }
    let mut all = 0;
    for task in tasks {
        all += task.await??;
    }
    let starts = std::mem::take(&mut *starts.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    let tps = starts.len() as f64 / settings.seconds;
    let deadline = Instant::now() + PATIENCE;
    while heard.load(Ordering::Relaxed) < all {
        if Instant::now() > deadline {
            bail!(
                "the commit-lane listener heard {} of {all} events within {PATIENCE:?}",
                heard.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop_tx.send(true);
    let seen = listening.await??;
    let returns = std::mem::take(&mut *returns.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    // The part of the lag after `commit()` returned: what the commit lane itself adds.
    let after_commit = latencies(&returns, &seen)?;
    let latencies = latencies(&starts, &seen)?;
    if let Ok(writer) = Arc::try_unwrap(writer) {
        writer.shutdown().await;
    }
    for other in others {
        other.shutdown().await;
    }
    db.drop().await?;
    Ok((tps, latencies, after_commit))
}

async fn lag_sitting(settings: &Settings, obix_sql: &Arc<String>) -> Result<()> {
    for &folders in &settings.folders {
        for variant in [
            Variant::Ordo,
            Variant::ObixCommit,
            Variant::ObixCommit,
            Variant::Ordo,
        ] {
            let (tps, latencies, after_commit) =
                lag(variant, settings.writers, folders, settings, obix_sql).await?;
            let offered = settings
                .lag_rate
                .map_or_else(|| "flat out".to_owned(), |rate| format!("offered {rate}"));
            println!(
                "  {:<11} {} writers ({offered}), {folders} folding: {:>6.0} tx/s | commit lane {} | from commit() returning {}",
                variant.name(),
                settings.writers,
                tps,
                quantiles(&latencies),
                quantiles(&after_commit)
            );
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let settings = settings()?;
    let obix_sql = Arc::new(obix_setup_sql()?);
    println!(
        "ordo beside obix {OBIX_VERSION}: {} s per phase, paced at {} tx/s, {} sittings",
        settings.seconds, settings.rate, settings.sittings
    );
    for sitting in 1..=settings.sittings {
        if settings.phases.iter().any(|p| p == "single") {
            println!(
                "sitting {sitting}, one writer (load {} at its start):",
                load()
            );
            single_sitting(&settings, &obix_sql).await?;
        }
        if settings.phases.iter().any(|p| p == "turns") {
            println!(
                "sitting {sitting}, one writer, the variants in turns of {} ms (load {} at its start):",
                settings.slice.as_millis(),
                load()
            );
            turns_sitting(&settings, &obix_sql).await?;
        }
        if settings.phases.iter().any(|p| p == "lag") {
            println!(
                "sitting {sitting}, commit-lane lag (load {} at its start):",
                load()
            );
            lag_sitting(&settings, &obix_sql).await?;
        }
        println!("  (load {} at its end)", load());
    }
    Ok(())
}
