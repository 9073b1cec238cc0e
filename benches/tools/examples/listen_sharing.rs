//! Load tool for one question: does a wake-up arrive later when the `LISTEN` connection it
//! travels on also carries another channel's traffic? An outbox listens on two channels: its
//! wake-up channel (`ordo_events`) and, once a latest-value stream is open, `ordo_latest`.
//! This tool measures the wake-up hop with the two on separate connections (`split`) and on one
//! (`shared`), while a storm of latest-value notifications runs, alternating the two setups in
//! each sitting: split, shared, shared, split.
//!
//! ```sh
//! export DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres
//! cargo run --release --example listen_sharing
//! cargo run --release --example listen_sharing -- --seconds 5 --rate 500 --storm 4000 --sittings 2
//! ```
//!
//! Options: `--seconds N` (per phase, default 5), `--rate N` (wake-ups per second, default 500,
//! the pace of `examples/insert_latency.rs`), `--storm N` (latest-value notifications per second
//! on the other channel, default 2,000; 0 for none), `--sittings N` (default 2).
//!
//! The clock of a wake-up starts when the sender calls its autocommitted `pg_notify` (a
//! notification often arrives before the sender's own answer, so a clock started when the call
//! returns reads zero) and stops when the listening task holds the notification; both
//! instants come from one monotonic clock and are joined on the payload afterwards. The first
//! half second of a phase is warm-up and is not recorded. The storm is sent by two connections
//! of its own, paced; each phase prints how many storm notifications the listener received, so a
//! storm that did not run cannot pass for one that did.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hdrhistogram::Histogram;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::time::{MissedTickBehavior, timeout};

#[path = "support/scratch.rs"]
mod scratch;

use scratch::Scratch;

const WAKE: &str = "ordo_events";
const LATEST: &str = "ordo_latest";
const WARM_UP: Duration = Duration::from_millis(500);
const PATIENCE: Duration = Duration::from_secs(60);
/// Connections sending the storm.
const STORM_SENDERS: u64 = 2;

struct Settings {
    seconds: f64,
    rate: u32,
    storm: u32,
    sittings: u32,
}

impl Settings {
    fn parse() -> Result<Settings> {
        let mut settings = Settings {
            seconds: 5.0,
            rate: 500,
            storm: 2_000,
            sittings: 2,
        };
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let value = args
                .next()
                .with_context(|| format!("{flag} needs a value"))?;
            let bad = || format!("{flag} {value}: not a valid number");
            match flag.as_str() {
                "--seconds" => settings.seconds = value.parse().with_context(bad)?,
                "--rate" => settings.rate = value.parse().with_context(bad)?,
                "--storm" => settings.storm = value.parse().with_context(bad)?,
                "--sittings" => settings.sittings = value.parse().with_context(bad)?,
                _ => bail!("unknown option {flag} (known: --seconds, --rate, --storm, --sittings)"),
            }
        }
        if settings.seconds <= 0.0 || settings.rate == 0 || settings.sittings == 0 {
            bail!("--seconds, --rate and --sittings must be positive");
        }
        Ok(settings)
    }

    fn wake_ups(&self) -> usize {
        ((self.seconds + WARM_UP.as_secs_f64()) * f64::from(self.rate)).ceil() as usize
    }

    fn warm_up(&self) -> usize {
        (WARM_UP.as_secs_f64() * f64::from(self.rate)).ceil() as usize
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Setup {
    /// The wake-up channel and the latest-value channel on a connection each.
    Split,
    /// Both channels on one connection.
    Shared,
}

impl Setup {
    fn label(self) -> &'static str {
        match self {
            Setup::Split => "split (two connections)",
            Setup::Shared => "shared (one connection)",
        }
    }
}

struct Phase {
    latency: Histogram<u64>,
    storm_received: u64,
    storm_sent: u64,
}

#[tokio::main]
async fn main() -> Result<()> {
    let settings = Settings::parse()?;
    let db = Scratch::create(&scratch::server_url()).await?;
    println!(
        "listen_sharing: database {}, {} s per phase, {} wake-ups/s, a storm of {} latest-value \
         notifications/s, {} sittings of split, shared, shared, split; {} CPUs",
        db.name(),
        settings.seconds,
        settings.rate,
        settings.storm,
        settings.sittings,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    let outcome = run(&db, &settings).await;
    db.drop_db().await?;
    outcome
}

async fn run(db: &Scratch, settings: &Settings) -> Result<()> {
    for sitting in 1..=settings.sittings {
        println!("\n== sitting {sitting} ==");
        let mut p50 = HashMap::<&str, Vec<f64>>::new();
        let mut p99 = HashMap::<&str, Vec<f64>>::new();
        for setup in [Setup::Split, Setup::Shared, Setup::Shared, Setup::Split] {
            let phase = phase(db, settings, setup).await?;
            let h = &phase.latency;
            println!(
                "{:<26} n={:<6} p50 {:.3} ms  p99 {:.3} ms  p999 {:.3} ms  max {:.3} ms  \
                 storm received {} of {} sent",
                setup.label(),
                h.len(),
                ms(h.value_at_quantile(0.50)),
                ms(h.value_at_quantile(0.99)),
                ms(h.value_at_quantile(0.999)),
                ms(h.max()),
                phase.storm_received,
                phase.storm_sent,
            );
            p50.entry(setup.label())
                .or_default()
                .push(ms(h.value_at_quantile(0.50)));
            p99.entry(setup.label())
                .or_default()
                .push(ms(h.value_at_quantile(0.99)));
        }
        let mean = |values: &Vec<f64>| values.iter().sum::<f64>() / values.len() as f64;
        let ratio = |by: &HashMap<&str, Vec<f64>>| {
            mean(&by[Setup::Shared.label()]) / mean(&by[Setup::Split.label()])
        };
        println!(
            "shared / split, mean of the two phases each: p50 {:.2}x  p99 {:.2}x",
            ratio(&p50),
            ratio(&p99)
        );
    }
    Ok(())
}

/// One phase: the listener(s) of `setup`, the storm, and `settings.wake_ups()` paced wake-ups.
async fn phase(db: &Scratch, settings: &Settings, setup: Setup) -> Result<Phase> {
    let listen_pool = db.pool(2).await?;
    let storm_received = Arc::new(AtomicU64::new(0));
    let total = settings.wake_ups();

    let mut wake_listener = PgListener::connect_with(&listen_pool).await?;
    wake_listener.listen(WAKE).await?;
    let mut side = None;
    match setup {
        Setup::Shared => wake_listener.listen(LATEST).await?,
        Setup::Split => {
            let mut latest = PgListener::connect_with(&listen_pool).await?;
            latest.listen(LATEST).await?;
            side = Some(latest);
        }
    }
    let receiving = {
        let storm_received = Arc::clone(&storm_received);
        tokio::spawn(async move {
            let mut received = HashMap::with_capacity(total);
            while received.len() < total {
                let notification = wake_listener.recv().await?;
                if notification.channel() == WAKE {
                    let n: usize = notification.payload().parse()?;
                    received.insert(n, Instant::now());
                } else {
                    storm_received.fetch_add(1, Ordering::Relaxed);
                }
            }
            anyhow::Ok(received)
        })
    };
    let side_task = side.map(|mut latest| {
        let storm_received = Arc::clone(&storm_received);
        tokio::spawn(async move {
            loop {
                if latest.recv().await.is_err() {
                    return;
                }
                storm_received.fetch_add(1, Ordering::Relaxed);
            }
        })
    });

    let storming = Arc::new(AtomicBool::new(true));
    let storm_sent = Arc::new(AtomicU64::new(0));
    let storm_pool = db.pool(STORM_SENDERS as u32).await?;
    let mut storm = Vec::new();
    if settings.storm > 0 {
        for sender in 0..STORM_SENDERS {
            storm.push(tokio::spawn(storm_sender(
                storm_pool.clone(),
                f64::from(settings.storm) / STORM_SENDERS as f64,
                sender,
                Arc::clone(&storming),
                Arc::clone(&storm_sent),
            )));
        }
    }

    let sender = db.pool(1).await?;
    let mut sent = Vec::with_capacity(total);
    let mut pace = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(settings.rate)));
    pace.set_missed_tick_behavior(MissedTickBehavior::Delay);
    for n in 0..total {
        pace.tick().await;
        sent.push(Instant::now());
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(WAKE)
            .bind(n.to_string())
            .execute(&sender)
            .await?;
    }
    let received = timeout(PATIENCE, receiving)
        .await
        .context("wake-ups did not all arrive")???;
    storming.store(false, Ordering::Relaxed);
    for task in storm {
        task.await??;
    }
    if let Some(task) = side_task {
        task.abort();
    }

    let mut latency = Histogram::new_with_bounds(1, 600_000_000_000, 3)?;
    for (n, at) in sent.iter().enumerate().skip(settings.warm_up()) {
        let got = received.get(&n).context("a wake-up was lost")?;
        latency.record(nanos(got.saturating_duration_since(*at)))?;
    }
    sender.close().await;
    storm_pool.close().await;
    listen_pool.close().await;
    Ok(Phase {
        latency,
        storm_received: storm_received.load(Ordering::Relaxed),
        storm_sent: storm_sent.load(Ordering::Relaxed),
    })
}

/// Sends latest-value-shaped notifications (`<version> <type>`) at `rate` a second until told
/// to stop.
async fn storm_sender(
    pool: PgPool,
    rate: f64,
    sender: u64,
    storming: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
) -> Result<()> {
    let mut pace = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    pace.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut version = 0u64;
    while storming.load(Ordering::Relaxed) {
        pace.tick().await;
        version += 1;
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(LATEST)
            .bind(format!("{version} fx.rate.{sender}.{}", version % 64))
            .execute(&pool)
            .await?;
        sent.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos())
        .unwrap_or(u64::MAX)
        .max(1)
}

fn ms(nanos: u64) -> f64 {
    nanos as f64 / 1e6
}
