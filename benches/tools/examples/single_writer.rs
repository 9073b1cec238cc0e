//! One writer, one event per transaction, measured where a user's clock runs: what ordo adds
//! to a transaction next to a raw `INSERT` transaction on the same pool settings, and how soon
//! a listener in the writer's process has the event, counted from before `commit()` is called.
//!
//! ```sh
//! export DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres
//! cargo run --release --example single_writer                     # 2 sittings, ~1 min
//! cargo run --release --example single_writer -- --seconds 3 --sittings 3 --variants raw,ordo
//! ```
//!
//! Options: `--seconds N` (each run, default 3), `--sittings N` (default 2), `--rate N` (the
//! paced phase's transactions per second, default 500), `--variants a,b` (default every one),
//! `--interleave MS` (the flat-out phase only, every variant's writer ready at once, taking
//! turns in slices of MS milliseconds: see below).
//!
//! Variants, each run on a fresh database (`ordo_load_<random>`, migrated, dropped at the end)
//! with a pool of 10 connections, sqlx's defaults otherwise:
//! - `raw`: `pool.begin()`, `INSERT INTO ordo.events (payload) VALUES ($1)`, `commit()`.
//! - `raw_1rt`: `pool.begin()`, then the `INSERT` (its payload as hex digits), `COMMIT` and a
//!   `BEGIN` in one simple query (one round trip), the transaction dropped: the floor of a
//!   commit that sends its insert and its `COMMIT` together.
//! - `ordo`: `Outbox::new` with `OutboxConfig::default()` (commit lane on), `begin()`,
//!   `publish()`, `commit()`.
//! - `no_seq`: the same with `sequencer(false)` (the commit lane off).
//! - `bare`: `sequencer(false)` and `cross_process_wakeups(false)`: the write path alone.
//! - `ordo_f0`, `ordo_f1`, `ordo_f2`: `ordo` with `fold_interval` 0 (the default), 1 or 2 ms.
//! - `ordo_u0`: `ordo` with `unwatched_append_spacing(0)`: the sequencer appends as if someone
//!   waited for the log (with nobody listening, `ordo` gathers its appends 1 s apart).
//! - `ordo_u<N>`, e.g. `ordo_u250`: `ordo` with `unwatched_append_spacing` of N milliseconds
//!   (at most 60,000; `ordo_u60000` appends nothing during a run, which tells what the appends
//!   cost the writer from what the sequencer's work in the process costs it).
//!
//! Within a sitting the variants run in order and then in reverse (A, B, C, C, B, A), so a
//! burst of background load falls on both sides of a comparison. Each run has two phases:
//! 1. **flat out**: back to back for `--seconds`. Transactions per second, and each
//!    transaction's latency from before `begin()` to `commit()` returning. Also what the run
//!    cost: CPU of this process and of the whole machine (`/proc`), and transactions the
//!    server committed (`pg_stat_database.xact_commit`, every database), per transaction.
//! 2. **paced** at `--rate`, with listeners in the same process (`listen_inserted` and, with
//!    the sequencer on, `listen_committed`, both from `Start::Now`). Latency from before
//!    `commit()` is called to the listener's task holding the event. The raw variant has no
//!    listener: its figures are from before its `INSERT` to `commit()` returning (in the
//!    `insert lane` column: the floor a listener told after the commit cannot beat, since
//!    ordo's `commit()` sends the `INSERT` too), and from before its `COMMIT` alone.
//!
//! The first half second of each phase is warm-up and is not recorded.
//!
//! **Interleaved** (`--interleave MS`): a background load that comes and goes (a neighbour's
//! build, the host's other guests) moves a 3-second run's rate by more than the difference
//! being measured, even with the runs ordered A, B, B, A. In this mode every variant gets its
//! fresh database and its writer first, and each is warmed up; then the writers take turns flat
//! out, one slice of MS milliseconds each, in order and then in reverse (A, B, B, A, A, B, …),
//! until each has written for `--seconds` in all. A variant's rate is its transactions over the
//! time of its own slices, so a burst of load falls on every variant alike. Printed per variant:
//! the rate against the first variant's, the spread of that ratio over each A, B, B, A round
//! (min, p10, median, p90, max), and the transaction's p50 and p99. The same variant may be
//! named twice (`--variants raw,raw`): the ratio of raw to itself says how much of a difference
//! the machine's noise alone makes. The writers that are not taking their turn are idle, but an
//! outbox's own tasks keep running (its gathered append, due at most
//! `unwatched_append_spacing` after its last commit, may fall in another variant's slice).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use hdrhistogram::Histogram;
use ordo::{Outbox, OutboxConfig, Start};
use sqlx::PgPool;
use tokio::sync::Mutex;
use tokio::time::MissedTickBehavior;

#[path = "support/measure.rs"]
mod measure;
#[path = "support/order.rs"]
mod order;
#[path = "support/scratch.rs"]
mod scratch;
#[path = "support/write.rs"]
mod write;

use measure::{histogram, load, ms, nanos, quantiles};
use order::{OrderPlaced, payload};
use scratch::Scratch;

const WARM_UP: Duration = Duration::from_millis(500);
const POOL: u32 = 10;
const PATIENCE: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    Raw,
    /// `raw` with its `INSERT` and `COMMIT` sent as one simple query: one round trip.
    RawOneTrip,
    Ordo,
    NoSeq,
    Bare,
    /// `ordo` with `fold_interval(0)`: an append as soon as a transaction is met.
    Fold0,
    /// `ordo` with `fold_interval(1 ms)`.
    Fold1,
    /// `ordo` with `fold_interval(2 ms)`.
    Fold2,
    /// `ordo` with `unwatched_append_spacing(0)`: appends as if someone waited for the log.
    Watched,
    /// `ordo` with `unwatched_append_spacing` of this many milliseconds.
    Spaced(u64),
}

impl Variant {
    const ALL: [Variant; 9] = [
        Variant::Raw,
        Variant::RawOneTrip,
        Variant::Ordo,
        Variant::NoSeq,
        Variant::Bare,
        Variant::Fold0,
        Variant::Fold1,
        Variant::Fold2,
        Variant::Watched,
    ];

    fn name(self) -> String {
        let name = match self {
            Variant::Raw => "raw",
            Variant::RawOneTrip => "raw_1rt",
            Variant::Ordo => "ordo",
            Variant::NoSeq => "no_seq",
            Variant::Bare => "bare",
            Variant::Fold0 => "ordo_f0",
            Variant::Fold1 => "ordo_f1",
            Variant::Fold2 => "ordo_f2",
            Variant::Watched => "ordo_u0",
            Variant::Spaced(ms) => return format!("ordo_u{ms}"),
        };
        name.to_owned()
    }

    fn parse(name: &str) -> Result<Self> {
        if let Some(ms) = name.strip_prefix("ordo_u").filter(|ms| *ms != "0") {
            let ms: u64 = ms
                .parse()
                .with_context(|| format!("variant {name:?}: ordo_u<milliseconds>"))?;
            if ms > 60_000 {
                bail!("variant {name:?}: the spacing is at most 60000 ms");
            }
            return Ok(Variant::Spaced(ms));
        }
        Self::ALL
            .into_iter()
            .find(|v| v.name() == name)
            .with_context(|| {
                format!(
                    "unknown variant {name:?} (raw, raw_1rt, ordo, no_seq, bare, ordo_f0, ordo_f1, ordo_f2, ordo_u0, ordo_u<ms>)"
                )
            })
    }

    fn config(self) -> Option<OutboxConfig> {
        let config = OutboxConfig::default();
        match self {
            Variant::Raw | Variant::RawOneTrip => None,
            Variant::Ordo => Some(config),
            Variant::NoSeq => Some(config.sequencer(false)),
            Variant::Bare => Some(config.sequencer(false).cross_process_wakeups(false)),
            Variant::Fold0 => Some(config.fold_interval(Duration::ZERO)),
            Variant::Fold1 => Some(config.fold_interval(Duration::from_millis(1))),
            Variant::Fold2 => Some(config.fold_interval(Duration::from_millis(2))),
            Variant::Watched => Some(config.unwatched_append_spacing(Duration::ZERO)),
            Variant::Spaced(ms) => Some(config.unwatched_append_spacing(Duration::from_millis(ms))),
        }
    }
}

struct Settings {
    seconds: f64,
    sittings: usize,
    rate: u32,
    variants: Vec<Variant>,
    interleave: Option<Duration>,
}

fn settings() -> Result<Settings> {
    let mut s = Settings {
        seconds: 3.0,
        sittings: 2,
        rate: 500,
        variants: Variant::ALL[..4].to_vec(),
        interleave: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--seconds" => s.seconds = value()?.parse().context("--seconds")?,
            "--sittings" => s.sittings = value()?.parse().context("--sittings")?,
            "--rate" => s.rate = value()?.parse().context("--rate")?,
            "--variants" => {
                s.variants = value()?
                    .split(',')
                    .map(Variant::parse)
                    .collect::<Result<_>>()?;
            }
            "--interleave" => {
                let ms: u64 = value()?
                    .parse()
                    .context("--interleave takes milliseconds")?;
                if !(1..=10_000).contains(&ms) {
                    bail!("--interleave must be 1 to 10,000 milliseconds");
                }
                s.interleave = Some(Duration::from_millis(ms));
            }
            other => bail!(
                "unknown option {other:?} (--seconds, --sittings, --rate, --variants, --interleave)"
            ),
        }
    }
    if s.seconds.is_nan()
        || s.seconds <= 0.5
        || s.sittings == 0
        || s.rate == 0
        || s.variants.is_empty()
    {
        bail!("--seconds must exceed 0.5, --sittings, --rate and --variants must be non-empty");
    }
    Ok(s)
}

/// CPU jiffies: this process's (user + system) and the machine's busy total.
fn cpu() -> (u64, u64) {
    let own = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            // Fields after the command name's closing parenthesis; utime and stime are the
            // 14th and 15th fields of the line.
            let rest = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0);
    let machine = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|stat| {
            let line = stat.lines().next()?;
            let v: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|f| f.parse().ok())
                .collect();
            // user nice system idle iowait irq softirq steal
            Some(v.iter().take(8).sum::<u64>() - v.get(3)? - v.get(4)?)
        })
        .unwrap_or(0);
    (own, machine)
}

async fn commits(pool: &PgPool) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT sum(xact_commit)::bigint FROM pg_stat_database")
            .fetch_one(pool)
            .await?,
    )
}

/// What one run of one variant measured.
struct Run {
    variant: Variant,
    tps: f64,
    tx: Histogram<u64>,
    own_cpu_us: f64,
    machine_cpu_us: f64,
    server_commits: f64,
    inserted: Histogram<u64>,
    committed: Option<Histogram<u64>>,
}

enum Writer {
    Raw(PgPool),
    RawOneTrip(PgPool),
    Ordo(Outbox<OrderPlaced>),
}

impl Writer {
    async fn start(variant: Variant, pool: PgPool) -> Result<Self> {
        Ok(match variant.config() {
            None if variant == Variant::RawOneTrip => Writer::RawOneTrip(pool),
            None => Writer::Raw(pool),
            Some(config) => Writer::Ordo(Outbox::new(pool, config).await?),
        })
    }

    /// One transaction; returns the instant just before `commit()` was called (for raw, just
    /// before its `INSERT`) and, for raw, the instant just before its `COMMIT`.
    async fn transaction(&self, n: u64) -> Result<(Instant, Option<Instant>)> {
        match self {
            Writer::Raw(pool) => {
                let stamps = write::plain(pool, n).await?;
                Ok((stamps.before, Some(stamps.before_commit)))
            }
            Writer::RawOneTrip(pool) => {
                let mut tx = pool.begin().await?;
                let json = serde_json::to_string(&payload(n))?;
                let hex: String = json.bytes().map(|b| format!("{b:02x}")).collect();
                let before = Instant::now();
                // The payload as hex digits: nothing of it can end the literal. The trailing
                // BEGIN gives the dropped transaction's queued ROLLBACK an empty one to close.
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO ordo.events (payload) VALUES \
                     (convert_from(decode('{hex}', 'hex'), 'UTF8')::jsonb); COMMIT; BEGIN"
                )))
                .execute(&mut *tx)
                .await?;
                drop(tx);
                Ok((before, None))
            }
            Writer::Ordo(outbox) => Ok((write::through_ordo(outbox, n).await?.before, None)),
        }
    }
}

async fn flat_out(
    writer: &Writer,
    pool: &PgPool,
    seconds: f64,
) -> Result<(f64, Histogram<u64>, [f64; 3])> {
    let mut n = 0u64;
    write::warm(WARM_UP, &mut n, |n| writer.transaction(n)).await?;
    let (own0, machine0) = cpu();
    let commits0 = commits(pool).await?;
    let run = write::flat_out(seconds, &mut n, |n| writer.transaction(n)).await?;
    let (own1, machine1) = cpu();
    // One of the commits counted is this query's own transaction; negligible.
    let commits1 = commits(pool).await?;
    let jiffy_us = 1e6 / 100.0;
    let per = |d: u64| d as f64 * jiffy_us / run.count as f64;
    let per_transaction = [
        per(own1 - own0),
        per(machine1 - machine0),
        (commits1 - commits0) as f64 / run.count as f64,
    ];
    Ok((run.per_second(), run.latencies, per_transaction))
}

type Received = Arc<Mutex<HashMap<u64, Instant>>>;

/// Notes when each of `total` events from `first` on reaches a listener, by its order's
/// [`number`](OrderPlaced::number).
fn record<S>(
    mut numbers: S,
    first: u64,
    total: u64,
    seen: Received,
) -> tokio::task::JoinHandle<Result<()>>
where
    S: futures::Stream<Item = ordo::Result<u64>> + Send + Unpin + 'static,
{
    tokio::spawn(async move {
        while let Some(number) = numbers.next().await {
            let number = number?;
            let at = Instant::now();
            if number < first {
                // A flat-out event the lane still delivers: not this phase's.
                continue;
            }
            let mut seen = seen.lock().await;
            seen.insert(number, at);
            if seen.len() as u64 == total {
                break;
            }
        }
        Ok(())
    })
}

/// Paced transactions; the listeners note when each event reaches them, by its order's
/// number.
async fn paced(
    writer: &Writer,
    rate: u32,
    seconds: f64,
    first: u64,
    commit_lane: bool,
) -> Result<(Histogram<u64>, Option<Histogram<u64>>)> {
    let total = (f64::from(rate) * seconds) as u64;
    let warm = (f64::from(rate) * WARM_UP.as_secs_f64()) as u64;
    let inserted: Received = Arc::default();
    let committed: Received = Arc::default();
    let mut tasks = Vec::new();
    if let Writer::Ordo(outbox) = writer {
        let events = outbox
            .listen_inserted(Start::Now)
            .map(|event| event.map(|event| event.payload.number()));
        tasks.push(record(events, first, total, Arc::clone(&inserted)));
        if commit_lane {
            let events = outbox
                .listen_committed(Start::Now)
                .map(|event| event.map(|event| event.event.payload.number()));
            tasks.push(record(events, first, total, Arc::clone(&committed)));
        }
        // Let the streams start before the clock does.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut before = Vec::with_capacity(total as usize);
    let mut floor = histogram()?;
    let mut commit_only = histogram()?;
    for i in 0..total {
        tick.tick().await;
        let (at, before_commit) = writer.transaction(first + i).await?;
        if i >= warm {
            floor.record(nanos(at.elapsed()))?;
            if let Some(before_commit) = before_commit {
                commit_only.record(nanos(before_commit.elapsed()))?;
            }
        }
        before.push(at);
    }
    if tasks.is_empty() {
        let commit_only = (!commit_only.is_empty()).then_some(commit_only);
        return Ok((floor, commit_only));
    }
    for task in tasks {
        tokio::time::timeout(PATIENCE, task)
            .await
            .context("a listener did not receive every event")???;
    }
    let latencies = |seen: &HashMap<u64, Instant>| -> Result<Histogram<u64>> {
        let mut h = histogram()?;
        for (i, at) in before.iter().enumerate().skip(warm as usize) {
            let got = seen
                .get(&(first + i as u64))
                .context("an event never reached its listener")?;
            h.record(nanos(got.saturating_duration_since(*at)))?;
        }
        Ok(h)
    };
    let inserted = latencies(&*inserted.lock().await)?;
    let committed = if committed.lock().await.is_empty() {
        None
    } else {
        Some(latencies(&*committed.lock().await)?)
    };
    Ok((inserted, committed))
}

async fn run(variant: Variant, settings: &Settings) -> Result<Run> {
    let db = Scratch::create(&scratch::server_url()).await?;
    let pool = db.pool(POOL).await?;
    let stats = db.pool(1).await?;
    let writer = Writer::start(variant, pool.clone()).await?;
    let (tps, tx, [own_cpu_us, machine_cpu_us, server_commits]) =
        flat_out(&writer, &stats, settings.seconds).await?;
    let (inserted, committed) = paced(
        &writer,
        settings.rate,
        settings.seconds,
        1 << 40,
        !matches!(
            variant,
            Variant::Raw | Variant::RawOneTrip | Variant::NoSeq | Variant::Bare
        ),
    )
    .await?;
    if let Writer::Ordo(outbox) = writer {
        outbox.shutdown().await;
    }
    pool.close().await;
    stats.close().await;
    db.drop_db().await?;
    Ok(Run {
        variant,
        tps,
        tx,
        own_cpu_us,
        machine_cpu_us,
        server_commits,
        inserted,
        committed,
    })
}

/// One variant's share of an interleaved sitting.
struct Turns {
    variant: Variant,
    writer: Writer,
    pool: PgPool,
    db: Scratch,
    tx: Histogram<u64>,
    count: u64,
    time: Duration,
    /// Transactions and time in the current round (A, B, B, A).
    round: (u64, Duration),
    /// Each finished round's rate.
    rates: Vec<f64>,
}

/// The interleaved flat-out phase of one sitting (see the module's docs).
async fn interleaved(settings: &Settings, slice: Duration) -> Result<()> {
    let mut turns = Vec::with_capacity(settings.variants.len());
    for &variant in &settings.variants {
        let db = Scratch::create(&scratch::server_url()).await?;
        let pool = db.pool(POOL).await?;
        let writer = Writer::start(variant, pool.clone()).await?;
        turns.push(Turns {
            variant,
            writer,
            pool,
            db,
            tx: histogram()?,
            count: 0,
            time: Duration::ZERO,
            round: (0, Duration::ZERO),
            rates: Vec::new(),
        });
    }
    let mut n = 0u64;
    for turn in &turns {
        let warm = Instant::now() + WARM_UP;
        while Instant::now() < warm {
            turn.writer.transaction(n).await?;
            n += 1;
        }
    }
    let each = Duration::from_secs_f64(settings.seconds);
    let forward: Vec<usize> = (0..turns.len()).collect();
    let backward: Vec<usize> = forward.iter().rev().copied().collect();
    while turns.iter().any(|turn| turn.time < each) {
        for &i in forward.iter().chain(&backward) {
            let turn = &mut turns[i];
            let started = Instant::now();
            let until = started + slice;
            while Instant::now() < until {
                let t = Instant::now();
                turn.writer.transaction(n).await?;
                turn.tx.record(nanos(t.elapsed()))?;
                n += 1;
                turn.round.0 += 1;
            }
            turn.round.1 += started.elapsed();
        }
        for turn in &mut turns {
            let (count, time) = std::mem::take(&mut turn.round);
            turn.count += count;
            turn.time += time;
            turn.rates.push(count as f64 / time.as_secs_f64());
        }
    }
    let rate = |turn: &Turns| turn.count as f64 / turn.time.as_secs_f64();
    let base = rate(&turns[0]);
    let base_p50 = turns[0].tx.value_at_quantile(0.5) as f64;
    for (i, turn) in turns.iter().enumerate() {
        let mut ratios: Vec<f64> = turn
            .rates
            .iter()
            .zip(&turns[0].rates)
            .map(|(rate, base)| rate / base)
            .collect();
        ratios.sort_by(f64::total_cmp);
        let at = |q: f64| ratios[((ratios.len() - 1) as f64 * q).round() as usize];
        let spread = if i == 0 {
            String::from("(the baseline)")
        } else {
            format!(
                "rounds: min {:.2}x p10 {:.2}x median {:.2}x p90 {:.2}x max {:.2}x",
                at(0.0),
                at(0.1),
                at(0.5),
                at(0.9),
                at(1.0)
            )
        };
        println!(
            "  {:<7} {:>7.0} tx/s {:>5.2}x of {} | {} rounds of {} ms slices, {} | tx p50 {:.3} ms ({:+.0} us) p99 {:.3}",
            turn.variant.name(),
            rate(turn),
            rate(turn) / base,
            turns[0].variant.name(),
            turn.rates.len(),
            slice.as_millis(),
            spread,
            ms(turn.tx.value_at_quantile(0.5)),
            (turn.tx.value_at_quantile(0.5) as f64 - base_p50) / 1e3,
            ms(turn.tx.value_at_quantile(0.99)),
        );
    }
    for turn in turns {
        if let Writer::Ordo(outbox) = turn.writer {
            outbox.shutdown().await;
        }
        turn.pool.close().await;
        turn.db.drop_db().await?;
    }
    Ok(())
}

fn print(run: &Run, raw: Option<&Run>) {
    let ratio = raw.map_or(String::from("-"), |raw| {
        format!("{:.2}x", run.tps / raw.tps)
    });
    let p50_over = raw.map_or(String::from("-"), |raw| {
        format!(
            "{:+.0}",
            (run.tx.value_at_quantile(0.5) as f64 - raw.tx.value_at_quantile(0.5) as f64) / 1e3
        )
    });
    let lane = quantiles;
    println!(
        "  {:<7} {:>7.0} tx/s {:>6} of raw | tx p50 {:.3} ms ({} us over raw) p99 {:.3} | cpu/tx own {:>4.0} us machine {:>4.0} us | server commits/tx {:.2} | paced: insert lane {}{}",
        run.variant.name(),
        run.tps,
        ratio,
        ms(run.tx.value_at_quantile(0.5)),
        p50_over,
        ms(run.tx.value_at_quantile(0.99)),
        run.own_cpu_us,
        run.machine_cpu_us,
        run.server_commits,
        lane(&run.inserted),
        run.committed.as_ref().map_or(String::new(), |h| {
            let what = if run.variant == Variant::Raw {
                "COMMIT alone"
            } else {
                "commit lane"
            };
            format!(" | {what} {}", lane(h))
        }),
    );
}

#[tokio::main]
async fn main() -> Result<()> {
    let settings = settings()?;
    println!(
        "single writer, 1 event per transaction: {} s per phase, paced at {} tx/s, {} sittings",
        settings.seconds, settings.rate, settings.sittings
    );
    for sitting in 1..=settings.sittings {
        let mut order = settings.variants.clone();
        let mut back = order.clone();
        back.reverse();
        order.extend(back);
        println!("sitting {sitting} (load {} at its start):", load());
        if let Some(slice) = settings.interleave {
            interleaved(&settings, slice).await?;
            println!("  (load {} at its end)", load());
            continue;
        }
        let mut raw_runs: Vec<Run> = Vec::new();
        let mut runs = Vec::new();
        for variant in order {
            let run = run(variant, &settings).await?;
            if variant == Variant::Raw {
                raw_runs.push(run);
            } else {
                runs.push(run);
            }
        }
        // Compare each run with the raw run nearest it in the order (the first raw for the
        // first half, the second for the second).
        let half = runs.len() / 2;
        for (i, raw) in raw_runs.iter().enumerate() {
            print(raw, None);
            let part = if i == 0 { &runs[..half] } else { &runs[half..] };
            for run in part {
                print(run, Some(raw));
            }
        }
        if raw_runs.is_empty() {
            for run in &runs {
                print(run, None);
            }
        }
        println!("  (load {} at its end)", load());
    }
    Ok(())
}
