//! Relay throughput and latency against NATS JetStream, next to the raw client in the same run.
//!
//! ```sh
//! cargo run --release --features nats --example relay_load
//! ```
//! Uses `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`, a scratch
//! database per run) and NATS at `NATS_URL` (default `nats://127.0.0.1:4222`, a stream per run,
//! deleted after).
//!
//! - **raw**: `ORDO_EVENTS` messages published with `async-nats`' JetStream client, pipelined
//!   (up to 1,024 acks outstanding), `Nats-Msg-Id` set: the ceiling a relay can reach.
//! - **relay**: the same number of events written to `ordo.events` first (single-event
//!   transactions), then a relay from the commit lane's start; events/s until its watermark
//!   reaches the last one.
//! - **latency**: single-event transactions committed at `ORDO_RATE`/s for `ORDO_SECONDS`,
//!   relayed as they come; for each, from just before its COMMIT to the stream message's arrival
//!   at a NATS subscriber (which follows the stream's ack), p50/p99/max.
//!
//! Runs alternate: raw, relay (one sink), relay x4 (`relay_with_sinks`, four sinks: four batches
//! in flight), the same backwards; then the latency phase twice. `ORDO_PHASES` (e.g.
//! `relay,raw`) picks other throughput runs, `ORDO_LATENCY_ROUNDS` the latency rounds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use async_nats::jetstream::{self, stream};
use futures::StreamExt;

use hdrhistogram::Histogram;
use ordo::relay::RelayConfig;
use ordo::relay::nats::NatsSink;
use ordo::{Keys, Outbox, OutboxConfig};
use serde::{Deserialize, Serialize};

#[path = "support/scratch.rs"]
mod scratch;

use scratch::Scratch;

#[derive(Serialize, Deserialize)]
struct Item {
    n: u64,
    key: u64,
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A stream of its own on `prefix.>`, deleted by [`TestStream::delete`].
struct TestStream {
    js: jetstream::Context,
    name: String,
    prefix: String,
}

impl TestStream {
    async fn create(nats: &str) -> Result<TestStream> {
        let js = jetstream::new(async_nats::connect(nats).await?);
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let (name, prefix) = (format!("ORDO_LOAD_{suffix}"), format!("ordo_load_{suffix}"));
        js.create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![format!("{prefix}.>")],
            ..Default::default()
        })
        .await?;
        Ok(TestStream { js, name, prefix })
    }

    async fn delete(self) -> Result<()> {
        self.js.delete_stream(&self.name).await?;
        Ok(())
    }
}

async fn raw(nats: &str, events: u64) -> Result<f64> {
    let stream = TestStream::create(nats).await?;
    let payload = serde_json::to_vec(&Item { n: 0, key: 0 })?;
    let started = Instant::now();
    let mut acks = std::collections::VecDeque::new();
    for _ in 0..events {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", uuid::Uuid::now_v7().to_string().as_str());
        let subject = format!("{}.Item", stream.prefix);
        let ack = stream
            .js
            .publish_with_headers(subject, headers, payload.clone().into())
            .await?;
        acks.push_back(std::future::IntoFuture::into_future(ack));
        if acks.len() >= 1024
            && let Some(oldest) = acks.pop_front()
        {
            oldest.await?;
        }
    }
    for ack in acks {
        ack.await?;
    }
    let rate = events as f64 / started.elapsed().as_secs_f64();
    stream.delete().await?;
    Ok(rate)
}

fn keys(event: &ordo::Envelope<Item>) -> Keys {
    Keys::one(event.payload.key.to_string())
}

async fn relay(server: &str, nats: &str, events: u64, sinks: usize) -> Result<f64> {
    let scratch = Scratch::create(server).await?;
    let pool = scratch.pool(8).await?;
    sqlx::query(
        "INSERT INTO ordo.events (commit_xid, payload)
         SELECT 1000000000000 + g, jsonb_build_object('n', g, 'key', g % 1000)
         FROM generate_series(0, $1 - 1) AS g ORDER BY g",
    )
    .bind(events as i64)
    .execute(&pool)
    .await?;
    let outbox = Outbox::<Item>::new(pool.clone(), OutboxConfig::default()).await?;
    while outbox.commit_head().get() < events {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stream = TestStream::create(nats).await?;
    let sinks = (0..sinks)
        .map(|_| {
            NatsSink::builder(nats)
                .subject_prefix(&stream.prefix)
                .build()
        })
        .collect::<ordo::Result<Vec<_>>>()?;
    let config = RelayConfig::new("load")
        .batch_size(500)
        .per_event_budget(Duration::from_millis(10));
    let started = Instant::now();
    let handle = outbox.relay_with_sinks(config, sinks, keys).await?;
    let (status, done) = handle
        .wait_for(Duration::from_secs(600), |s| s.position.get() >= events)
        .await;
    let elapsed = started.elapsed();
    anyhow::ensure!(done, "the relay did not finish: {status:?}");
    handle.shutdown().await;
    outbox.shutdown().await;
    pool.close().await;
    scratch.drop_db().await?;
    stream.delete().await?;
    Ok(events as f64 / elapsed.as_secs_f64())
}

/// Commit → arrival at a NATS subscriber, at `rate` single-event transactions per second.
async fn latency(server: &str, nats: &str, rate: u64, seconds: u64) -> Result<Histogram<u64>> {
    let scratch = Scratch::create(server).await?;
    let pool = scratch.pool(8).await?;
    let outbox = Outbox::<Item>::new(pool.clone(), OutboxConfig::default()).await?;
    let stream = TestStream::create(nats).await?;
    let client = async_nats::connect(nats).await?;
    let mut arrivals = client.subscribe(format!("{}.>", stream.prefix)).await?;
    let sent: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let sink = NatsSink::builder(nats)
        .subject_prefix(&stream.prefix)
        .build()?;
    let handle = outbox
        .relay(RelayConfig::new("latency"), sink, keys)
        .await?;
    let total = rate * seconds;
    let writer = {
        let (outbox, sent) = (outbox.clone(), Arc::clone(&sent));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate));
            for n in 0..total {
                tick.tick().await;
                let mut tx = outbox.begin().await?;
                tx.publish(Item { n, key: n % 1000 })?;
                if let Ok(mut sent) = sent.lock() {
                    sent.insert(n, Instant::now());
                }
                tx.commit().await?;
            }
            anyhow::Ok(())
        })
    };
    let mut seen = 0;
    while seen < total {
        let Ok(Some(message)) =
            tokio::time::timeout(Duration::from_secs(30), arrivals.next()).await
        else {
            anyhow::bail!("only {seen} of {total} arrived");
        };
        let item: Item = serde_json::from_slice(&message.payload)?;
        let at = sent.lock().ok().and_then(|sent| sent.get(&item.n).copied());
        if let Some(at) = at {
            histogram.record(at.elapsed().as_micros() as u64)?;
        }
        seen += 1;
    }
    writer.await??;
    handle.shutdown().await;
    outbox.shutdown().await;
    pool.close().await;
    scratch.drop_db().await?;
    stream.delete().await?;
    Ok(histogram)
}

#[tokio::main]
async fn main() -> Result<()> {
    let server = scratch::server_url();
    let nats = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let events = env("ORDO_EVENTS", 20_000);
    println!("throughput, {events} events, 1,000 keys");
    let phases = std::env::var("ORDO_PHASES")
        .unwrap_or_else(|_| "raw,relay,relay x4,relay x4,relay,raw".into());
    for phase in phases.split(',').map(str::trim) {
        let rate = match phase {
            "raw" => raw(&nats, events).await?,
            "relay" => relay(&server, &nats, events, 1).await?,
            _ => relay(&server, &nats, events, 4).await?,
        };
        println!("{phase:>9} {rate:>10.0} events/s");
    }
    let (rate, seconds) = (env("ORDO_RATE", 500), env("ORDO_SECONDS", 10));
    for _ in 0..env("ORDO_LATENCY_ROUNDS", 2) {
        let h = latency(&server, &nats, rate, seconds).await?;
        println!(
            "latency at {rate}/s for {seconds} s: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} events)",
            h.value_at_quantile(0.5) as f64 / 1000.0,
            h.value_at_quantile(0.99) as f64 / 1000.0,
            h.max() as f64 / 1000.0,
            h.len()
        );
    }
    Ok(())
}
