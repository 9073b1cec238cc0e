//! Load tool for the insert-ordered lane: delivery latency in process and across processes,
//! and catch-up speed, each next to a raw PostgreSQL baseline measured in the same run.
//!
//! ```sh
//! export DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres
//! cargo run --release --example insert_latency                 # 5 s per latency phase
//! cargo run --release --example insert_latency -- --seconds 2  # or ORDO_LATENCY_SECONDS=2
//! ```
//!
//! Options: `--seconds N` (latency phase length, default 5, env `ORDO_LATENCY_SECONDS`),
//! `--rate N` (transactions per second, default 500), `--events N` (catch-up events, default
//! 50,000), `--rounds N` (catch-up repetitions, default 3), `--no-diagnostics` (skip the
//! diagnostic phases).
//!
//! Phases, all on one fresh database (`ordo_load_<random>`, made by `examples/support/scratch.rs`,
//! dropped `WITH (FORCE)` at exit):
//! 1. Baselines: `SELECT 1` round trips; a raw `pg_notify` → `LISTEN` hop at the same pace.
//! 2. Catch-up: `--events` events are inserted by ordo in transactions of 100. Then, for each
//!    round, a raw paged `SELECT sequence, payload::text ... ORDER BY sequence` read of them
//!    (with and without decoding the payload) and a fresh `Outbox` (own pool) listening from
//!    `Start::Beginning` until it has received every one. The table holds nothing else.
//! 3. In-process latency: one `Outbox`, a listener from `Start::Now`, a writer committing
//!    single-event transactions at `--rate`. Latency runs from `commit()` returning to the
//!    listener task receiving the event; both instants are taken from one monotonic clock and
//!    joined on the event's sequence afterwards, so recording never races delivery.
//! 4. Cross-process latency: the same, with the listener on a second `Outbox` with its own
//!    `PgPool` (the wake-up travels by `pg_notify`, the data by the table).
//! 5. Diagnostics (skip with `--no-diagnostics`): phases 3 and 4 again with one setting changed
//!    (wake-ups off, sequencer off, no notify debounce), to tell where latency comes from.
//!
//! The first half second of each latency phase is warm-up and is not recorded. The catch-up
//! rounds run twice: on the freshly filled table, which PostgreSQL has no statistics for yet
//! (as after any bulk insert, until autovacuum's analyze comes round), and after `ANALYZE`.
//! Each round also times ordo's own page statement run by hand, as a diagnostic.

use std::collections::HashMap;

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use hdrhistogram::Histogram;
use ordo::{Outbox, OutboxConfig, Start};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgListener;
use sqlx::{PgPool, Row};
use tokio::time::{MissedTickBehavior, timeout};

/// Events per transaction while filling the table for the catch-up phase.
const FILL_BATCH: usize = 100;
/// Rows per page of the raw catch-up read: ordo's default `page_size`.
const RAW_PAGE: i64 = 2_000;
/// Un-recorded warm-up at the start of each latency phase.
const WARM_UP: Duration = Duration::from_millis(500);
/// How long any phase may wait for its last event before the tool gives up.
const PATIENCE: Duration = Duration::from_secs(60);

/// About 100 bytes of JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Event {
    n: u64,
    last: bool,
    customer_id: u64,
    sku: String,
    total_cents: u64,
    currency: String,
}

impl Event {
    fn new(n: u64, last: bool) -> Event {
        Event {
            n,
            last,
            customer_id: 500_000 + n % 997,
            sku: format!("SKU-{:05}-BLUE-XL", n % 10_000),
            total_cents: 1_299 + n % 10_000,
            currency: "EUR".to_owned(),
        }
    }
}

struct Settings {
    seconds: f64,
    rate: u32,
    events: usize,
    rounds: usize,
    diagnostics: bool,
}

impl Settings {
    fn parse() -> Result<Settings> {
        let mut settings = Settings {
            seconds: match std::env::var("ORDO_LATENCY_SECONDS") {
                Ok(value) => value
                    .parse()
                    .context("ORDO_LATENCY_SECONDS is not a number")?,
                Err(_) => 5.0,
            },
            rate: 500,
            events: 50_000,
            rounds: 3,
            diagnostics: true,
        };
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            if flag == "--no-diagnostics" {
                settings.diagnostics = false;
                continue;
            }
            let value = args
                .next()
                .with_context(|| format!("{flag} needs a value"))?;
            let bad = || format!("{flag} {value}: not a valid number");
            match flag.as_str() {
                "--seconds" => settings.seconds = value.parse().with_context(bad)?,
                "--rate" => settings.rate = value.parse().with_context(bad)?,
                "--events" => settings.events = value.parse().with_context(bad)?,
                "--rounds" => settings.rounds = value.parse().with_context(bad)?,
                _ => bail!(
                    "unknown option {flag} (known: --seconds, --rate, --events, --rounds, \
                     --no-diagnostics)"
                ),
            }
        }
        if settings.seconds <= 0.0 || settings.rate == 0 || settings.events == 0 {
            bail!("--seconds, --rate and --events must be positive");
        }
        settings.rounds = settings.rounds.max(1);
        Ok(settings)
    }
}

#[path = "support/scratch.rs"]
mod scratch;

use scratch::Scratch;

#[tokio::main]
async fn main() -> Result<()> {
    let settings = Settings::parse()?;
    let db = Scratch::create(&scratch::server_url()).await?;
    println!(
        "insert_latency: database {}, {} s per latency phase at {} tx/s, catch-up of {} events \
         x {} rounds, {} CPUs",
        db.name(),
        settings.seconds,
        settings.rate,
        settings.events,
        settings.rounds,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    let outcome = run(&db, &settings).await;
    db.drop_db().await?;
    outcome
}

async fn run(db: &Scratch, settings: &Settings) -> Result<()> {
    println!("\n== baselines (raw PostgreSQL, this run) ==");
    let pool = db.pool(10).await?;
    let select_one = select_one_round_trips(&pool, 5_000).await?;
    print_latency("SELECT 1 round trip", &select_one, 0);
    let notify = raw_notify_hops(db, settings).await?;
    print_latency("raw pg_notify -> LISTEN (other pool)", &notify, 0);

    println!("\n== catch-up: {} events ==", settings.events);
    fill(&pool, settings.events).await?;
    catch_up(db, &pool, settings).await?;
    println!("-- again after ANALYZE ordo.events --");
    sqlx::query("ANALYZE ordo.events").execute(&pool).await?;
    catch_up(db, &pool, settings).await?;

    println!("\n== delivery latency, commit() returned -> listener received ==");
    let default = OutboxConfig::default;
    let local = in_process(&pool, default(), settings).await?;
    print_latency("in-process (same Outbox)", &local.histogram, local.early);
    let remote = cross_process(db, &pool, default(), settings).await?;
    print_latency(
        "cross-process (Outbox on its own pool)",
        &remote.histogram,
        remote.early,
    );

    if settings.diagnostics {
        diagnostics(db, &pool, settings).await?;
    }
    pool.close().await;
    Ok(())
}

/// The latency phases again with one part of ordo changed, to tell where the latency comes from.
async fn diagnostics(db: &Scratch, pool: &PgPool, settings: &Settings) -> Result<()> {
    println!("\n== diagnostics: the same phases with one setting changed ==");
    let default = OutboxConfig::default;
    let in_process_variants = [
        (
            "in-process, cross_process_wakeups off",
            default().cross_process_wakeups(false),
        ),
        ("in-process, sequencer off", default().sequencer(false)),
    ];
    for (label, config) in in_process_variants {
        let latency = in_process(pool, config, settings).await?;
        print_latency(label, &latency.histogram, latency.early);
    }
    let cross_variants = [
        (
            "cross-process, notify_debounce 0",
            default().notify_debounce(Duration::ZERO),
        ),
        (
            "cross-process, sequencer off (both)",
            default().sequencer(false),
        ),
    ];
    for (label, config) in cross_variants {
        let latency = cross_process(db, pool, config, settings).await?;
        print_latency(label, &latency.histogram, latency.early);
    }
    Ok(())
}

async fn in_process(pool: &PgPool, config: OutboxConfig, settings: &Settings) -> Result<Latency> {
    let outbox = Outbox::<Event>::new(pool.clone(), config).await?;
    let latency = latency_phase(&outbox, &outbox, settings).await;
    outbox.shutdown().await;
    latency
}

/// The writer's outbox on `pool`; the listener's on a pool of its own, with the same `config`.
async fn cross_process(
    db: &Scratch,
    pool: &PgPool,
    config: OutboxConfig,
    settings: &Settings,
) -> Result<Latency> {
    let writer = Outbox::<Event>::new(pool.clone(), config.clone()).await?;
    let other_pool = db.pool(10).await?;
    let other = Outbox::<Event>::new(other_pool.clone(), config).await?;
    let latency = latency_phase(&writer, &other, settings).await;
    writer.shutdown().await;
    other.shutdown().await;
    other_pool.close().await;
    latency
}

fn histogram() -> Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 600_000_000_000, 3)?)
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos())
        .unwrap_or(u64::MAX)
        .max(1)
}

fn ms(nanos: u64) -> f64 {
    nanos as f64 / 1e6
}

fn print_latency(label: &str, h: &Histogram<u64>, early: u64) {
    let early = if early > 0 {
        format!(", {early} delivered before commit() returned (counted as 0)")
    } else {
        String::new()
    };
    println!(
        "{label:<40} n={:<6} p50 {:.3} ms  p99 {:.3} ms  p999 {:.3} ms  max {:.3} ms{early}",
        h.len(),
        ms(h.value_at_quantile(0.50)),
        ms(h.value_at_quantile(0.99)),
        ms(h.value_at_quantile(0.999)),
        ms(h.max()),
    );
}

async fn select_one_round_trips(pool: &PgPool, count: usize) -> Result<Histogram<u64>> {
    let mut conn = pool.acquire().await?;
    let mut h = histogram()?;
    for i in 0..count + 100 {
        let start = Instant::now();
        let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&mut *conn).await?;
        let elapsed = start.elapsed();
        anyhow::ensure!(one == 1, "SELECT 1 returned {one}");
        if i >= 100 {
            h.record(nanos(elapsed))?;
        }
    }
    Ok(h)
}

/// The floor under cross-process delivery: an autocommitted `pg_notify` on one pool, paced like
/// the latency phases, until a `LISTEN` connection of another pool receives it.
async fn raw_notify_hops(db: &Scratch, settings: &Settings) -> Result<Histogram<u64>> {
    let sender = db.pool(2).await?;
    let receiver_pool = db.pool(2).await?;
    let mut listener = PgListener::connect_with(&receiver_pool).await?;
    listener.listen("insert_latency_raw").await?;
    let total = phase_transactions(settings);
    let warm_up = warm_up_transactions(settings);
    let receiving = tokio::spawn(async move {
        let mut received = HashMap::with_capacity(total);
        while received.len() < total {
            let notification = listener.recv().await?;
            let n: usize = notification.payload().parse()?;
            received.insert(n, Instant::now());
        }
        anyhow::Ok(received)
    });
    let mut sent = Vec::with_capacity(total);
    let mut pace = pacer(settings);
    for n in 0..total {
        pace.tick().await;
        sqlx::query("SELECT pg_notify('insert_latency_raw', $1)")
            .bind(n.to_string())
            .execute(&sender)
            .await?;
        sent.push(Instant::now());
    }
    let received = timeout(PATIENCE, receiving)
        .await
        .context("raw notifications did not all arrive")???;
    let mut h = histogram()?;
    for (n, at) in sent.iter().enumerate().skip(warm_up) {
        let got = received.get(&n).context("a raw notification was lost")?;
        h.record(nanos(got.saturating_duration_since(*at)))?;
    }
    sender.close().await;
    receiver_pool.close().await;
    Ok(h)
}

fn phase_transactions(settings: &Settings) -> usize {
    warm_up_transactions(settings) + (settings.seconds * f64::from(settings.rate)).ceil() as usize
}

fn warm_up_transactions(settings: &Settings) -> usize {
    (WARM_UP.as_secs_f64() * f64::from(settings.rate)).ceil() as usize
}

fn pacer(settings: &Settings) -> tokio::time::Interval {
    let mut pace = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(settings.rate)));
    // Keep the offered rate: a late tick is made up at once, as a real arrival process would.
    pace.set_missed_tick_behavior(MissedTickBehavior::Burst);
    pace
}

struct Latency {
    histogram: Histogram<u64>,
    /// Events the listener had before `commit()` returned to the writer.
    early: u64,
}

/// Paced single-event transactions on `writer`; latency to a `Start::Now` listener on `reader`.
async fn latency_phase(
    writer: &Outbox<Event>,
    reader: &Outbox<Event>,
    settings: &Settings,
) -> Result<Latency> {
    let total = phase_transactions(settings);
    let warm_up = warm_up_transactions(settings);
    let mut stream = reader.listen_inserted(Start::Now);
    let receiving = tokio::spawn(async move {
        let mut received: HashMap<u64, Instant> = HashMap::with_capacity(total + 1);
        while let Some(item) = stream.next().await {
            let at = Instant::now();
            let event = item?;
            received.insert(event.sequence.get(), at);
            if event.payload.last {
                return Ok(received);
            }
        }
        bail!("the listener stream ended before the last event")
    });
    let mut committed: Vec<(u64, Instant)> = Vec::with_capacity(total);
    let mut pace = pacer(settings);
    let started = Instant::now();
    for n in 0..=total {
        pace.tick().await;
        let mut tx = writer.begin().await?;
        tx.publish(Event::new(n as u64, n == total))?;
        let sequences = tx.commit().await?;
        let at = Instant::now();
        let sequence = sequences.first().context("commit returned no sequence")?;
        committed.push((sequence.get(), at));
    }
    let offered = started.elapsed();
    let received = timeout(PATIENCE, receiving)
        .await
        .context("the listener did not receive every event in time")???;
    let mut histogram = histogram()?;
    let mut early = 0;
    // The last transaction only tells the listener to stop.
    for (sequence, at) in committed.iter().take(total).skip(warm_up) {
        let got = received
            .get(sequence)
            .with_context(|| format!("event {sequence} was never delivered"))?;
        match got.checked_duration_since(*at) {
            Some(latency) => histogram.record(nanos(latency))?,
            None => {
                early += 1;
                histogram.record(1)?;
            }
        }
    }
    println!(
        "  ({} transactions in {:.2} s: {:.0} tx/s achieved)",
        total + 1,
        offered.as_secs_f64(),
        (total + 1) as f64 / offered.as_secs_f64()
    );
    Ok(Latency { histogram, early })
}

async fn fill(pool: &PgPool, events: usize) -> Result<()> {
    let filler = Outbox::<Event>::new(pool.clone(), OutboxConfig::default()).await?;
    let start = Instant::now();
    let mut n = 0;
    while n < events {
        let mut tx = filler.begin().await?;
        for _ in 0..FILL_BATCH.min(events - n) {
            tx.publish(Event::new(n as u64, false))?;
            n += 1;
        }
        tx.commit().await?;
    }
    let fill = start.elapsed();
    // Let the filler's sequencer finish folding, so that no catch-up round shares the server
    // with a fold still in progress.
    let folded = Instant::now();
    loop {
        let cursor: i64 =
            sqlx::query_scalar("SELECT logged_through_sequence FROM ordo.sequencer_state")
                .fetch_one(pool)
                .await?;
        if cursor >= events as i64 {
            break;
        }
        anyhow::ensure!(
            folded.elapsed() < PATIENCE,
            "the sequencer did not fold the fill"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let folded = folded.elapsed();
    filler.shutdown().await;
    println!(
        "inserted {events} events by ordo in transactions of {FILL_BATCH}: {:.2} s ({:.0} events/s); \
         the sequencer finished folding {:.0} ms after the last commit",
        fill.as_secs_f64(),
        events as f64 / fill.as_secs_f64(),
        listen_ms(folded)
    );
    Ok(())
}

/// Whether PostgreSQL has statistics for `ordo.events` (the page statements' plans depend on it).
async fn statistics(pool: &PgPool) -> Result<&'static str> {
    let analyzed: Option<bool> = sqlx::query_scalar(
        "SELECT last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL \
         FROM pg_stat_user_tables WHERE schemaname = 'ordo' AND relname = 'events'",
    )
    .fetch_optional(pool)
    .await?;
    Ok(if analyzed == Some(true) {
        "analyzed"
    } else {
        "never analyzed"
    })
}

/// `--rounds` rounds of every read of the whole table; prints them and the medians.
async fn catch_up(db: &Scratch, pool: &PgPool, settings: &Settings) -> Result<()> {
    let events = settings.events;
    let reads = [
        RawRead::Fetch,
        RawRead::FetchDecode,
        RawRead::OrdoPage,
        RawRead::OrdoPageClamped,
    ];
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); reads.len() + 1];
    for round in 1..=settings.rounds {
        let stats = statistics(pool).await?;
        let mut line = format!("round {round} (table {stats}):");
        for (i, read) in reads.iter().enumerate() {
            let took = raw_read(db, events, *read).await?;
            line.push_str(&format!(" {} {:.1} ms,", read.short(), listen_ms(took)));
            times[i].push(took);
        }
        let (startup, listen) = ordo_read(db, events).await?;
        line.push_str(&format!(
            " ordo {:.1} ms (+ Outbox::new {:.1} ms)",
            listen_ms(listen),
            listen_ms(startup)
        ));
        times[reads.len()].push(listen);
        println!("{line}");
    }
    let medians: Vec<Duration> = times.into_iter().map(median).collect();
    let ours = medians[reads.len()];
    let rate = |d: Duration| events as f64 / d.as_secs_f64();
    println!("median of {} rounds:", settings.rounds);
    for (read, took) in reads.iter().zip(&medians) {
        println!(
            "  {:<58} {:>9.0} events/s  (ordo/this time ratio {:.2})",
            read.label(),
            rate(*took),
            ours.as_secs_f64() / took.as_secs_f64()
        );
    }
    println!(
        "  {:<58} {:>9.0} events/s",
        "ordo listener, fresh Outbox, Start::Beginning",
        rate(ours)
    );
    Ok(())
}

fn listen_ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

/// Raw paged reads of the whole table by pages of `RAW_PAGE`, on a fresh pool.
#[derive(Clone, Copy)]
enum RawRead {
    /// The baseline: `SELECT sequence, payload::text ... WHERE sequence > $1 ORDER BY sequence`.
    Fetch,
    /// The baseline, decoding each payload into the event type as ordo's listener does.
    FetchDecode,
    /// Diagnostic: ordo's own page statement (all columns, `sequence > $1 AND sequence <= $2`)
    /// with `$2` the last sequence, as the listener binds it (the frontier).
    OrdoPage,
    /// Diagnostic: the same statement with `$2` clamped to `$1 + page size`.
    OrdoPageClamped,
}

impl RawRead {
    fn short(self) -> &'static str {
        match self {
            RawRead::Fetch => "raw",
            RawRead::FetchDecode => "raw+decode",
            RawRead::OrdoPage => "ordo-stmt",
            RawRead::OrdoPageClamped => "ordo-stmt-clamped",
        }
    }

    fn label(self) -> &'static str {
        match self {
            RawRead::Fetch => "raw paged read (baseline)",
            RawRead::FetchDecode => "raw paged read + serde decode",
            RawRead::OrdoPage => "diagnostic: ordo's page statement, upper bound = frontier",
            RawRead::OrdoPageClamped => "diagnostic: ordo's page statement, bound = after + page",
        }
    }
}

/// The page statement of ordo's insert lane, copied, for the diagnostics.
const ORDO_PAGE: &str = "SELECT sequence, commit_xid, id, payload::text AS payload, \
     headers::text AS headers, recorded_at FROM ordo.events \
     WHERE sequence > $1 AND sequence <= $2 ORDER BY sequence LIMIT $3";

async fn raw_read(db: &Scratch, events: usize, read: RawRead) -> Result<Duration> {
    let pool = db.pool(4).await?;
    let frontier = events as i64;
    let start = Instant::now();
    let mut after = 0_i64;
    let mut seen = 0_usize;
    loop {
        let last = match read {
            RawRead::Fetch | RawRead::FetchDecode => {
                let rows: Vec<(i64, String)> = sqlx::query_as(
                    "SELECT sequence, payload::text FROM ordo.events WHERE sequence > $1 \
                     ORDER BY sequence LIMIT $2",
                )
                .bind(after)
                .bind(RAW_PAGE)
                .fetch_all(&pool)
                .await?;
                if matches!(read, RawRead::FetchDecode) {
                    for (_, payload) in &rows {
                        let event: Event = serde_json::from_str(payload)?;
                        std::hint::black_box(event);
                    }
                }
                seen += rows.len();
                rows.last().map(|(sequence, _)| *sequence)
            }
            RawRead::OrdoPage | RawRead::OrdoPageClamped => {
                let upto = match read {
                    RawRead::OrdoPageClamped => frontier.min(after + RAW_PAGE),
                    _ => frontier,
                };
                let rows = sqlx::query(ORDO_PAGE)
                    .bind(after)
                    .bind(upto)
                    .bind(RAW_PAGE)
                    .fetch_all(&pool)
                    .await?;
                seen += rows.len();
                match rows.last() {
                    Some(row) => Some(row.try_get::<i64, _>("sequence")?),
                    None => None,
                }
            }
        };
        match last {
            Some(last) => after = last,
            None => break,
        }
    }
    let elapsed = start.elapsed();
    pool.close().await;
    anyhow::ensure!(
        seen == events,
        "raw read saw {seen} rows, expected {events}"
    );
    Ok(elapsed)
}

/// A fresh `Outbox` on a fresh pool, listening from the beginning until it has every event.
/// Returns how long `Outbox::new` took and how long the listener took.
async fn ordo_read(db: &Scratch, events: usize) -> Result<(Duration, Duration)> {
    let pool = db.pool(10).await?;
    let start = Instant::now();
    let outbox = Outbox::<Event>::new(pool.clone(), OutboxConfig::default()).await?;
    let startup = start.elapsed();
    let start = Instant::now();
    let mut stream = outbox.listen_inserted(Start::Beginning);
    let mut seen = 0;
    while seen < events {
        let item = timeout(PATIENCE, stream.next())
            .await
            .context("catch-up stalled")?
            .context("the listener stream ended early")?;
        let event = item?;
        std::hint::black_box(&event.payload);
        seen += 1;
    }
    let elapsed = start.elapsed();
    drop(stream);
    outbox.shutdown().await;
    pool.close().await;
    Ok((startup, elapsed))
}
