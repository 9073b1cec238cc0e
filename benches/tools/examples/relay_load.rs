//! Relay throughput and latency against NATS JetStream, next to the raw client in the same run.
//!
//! ```sh
//! cargo run --release --example relay_load
//! ```
//! Uses `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`, a scratch
//! database per run) and NATS at `NATS_URL` (default `nats://127.0.0.1:4222`, a stream per run,
//! deleted after).
//!
//! - **raw**: `ORDO_EVENTS` messages published with `async-nats`' JetStream client, pipelined
//!   (up to 1,024 acks outstanding), `Nats-Msg-Id` set: the ceiling a relay can reach.
//! - **raw full**: the same, with the headers a `NatsSink` sends by default besides
//!   `Nats-Msg-Id` (`Ordo-Position`, `Ordo-Lane`, `Ordo-Key`): the raw client sending what the
//!   relay sends.
//! - **sink**: the messages the relay would build for those events, sent by a `NatsSink` alone
//!   (no database), 500 at a time: the relay's own cost is the gap between this and **relay**;
//!   the gap between **raw full** and this is the sink's batching and message building.
//! - **relay**: the same number of events written to `ordo.events` first (single-event
//!   transactions), then a relay from the commit lane's start; events/s until its watermark
//!   reaches the last one. **relay x4**: `relay_with_sinks` with four sinks (four batches in
//!   flight). **relay detail** (only when named in `ORDO_PHASES`): one sink with
//!   `detail_headers(true)`.
//! - **latency**: single-event transactions committed at `ORDO_RATE`/s for `ORDO_SECONDS`,
//!   relayed as they come; for each, from just before its COMMIT to the stream message's arrival
//!   at a NATS subscriber (which follows the stream's ack), p50/p99/max.
//!
//! Runs alternate: raw, raw full, sink, relay, relay x4, then the same backwards; then the
//! latency phase twice. `ORDO_PHASES` (e.g. `relay,raw`) picks other throughput runs,
//! `ORDO_LATENCY_ROUNDS` the latency rounds, `ORDO_EVENTS` the events per throughput run.

use std::time::Instant;

use anyhow::Result;
use futures::StreamExt;
use ordo::relay::nats::NatsSink;
// The client ordo re-exports: the raw phases run on exactly the version the sink is built on.
use ordo::relay::nats::async_nats::{
    self,
    jetstream::{self, stream},
};

#[path = "support/relay_bench.rs"]
mod relay_bench;
#[path = "support/scratch.rs"]
mod scratch;

use relay_bench::{Item, env};

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
    raw_with(nats, events, false).await
}

/// `full`: with the headers a `NatsSink` sends too (see `ordo::relay::nats`), not only
/// `Nats-Msg-Id`.
async fn raw_with(nats: &str, events: u64, full: bool) -> Result<f64> {
    let stream = TestStream::create(nats).await?;
    let payload = serde_json::to_vec(&Item { n: 0, key: 0 })?;
    let started = Instant::now();
    let mut acks = std::collections::VecDeque::new();
    for _ in 0..events {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", uuid::Uuid::now_v7().to_string().as_str());
        if full {
            headers.insert("Ordo-Position", "12345");
            headers.insert("Ordo-Lane", "commit");
            headers.insert("Ordo-Key", "345");
        }
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

async fn relay(server: &str, nats: &str, events: u64, sinks: usize, detail: bool) -> Result<f64> {
    let stream = TestStream::create(nats).await?;
    let sinks = (0..sinks)
        .map(|_| {
            NatsSink::builder(nats)
                .subject_prefix(&stream.prefix)
                .detail_headers(detail)
                .build()
        })
        .collect::<ordo::Result<Vec<_>>>()?;
    let rate = relay_bench::relay_rate(server, events, sinks).await?;
    stream.delete().await?;
    Ok(rate)
}

#[tokio::main]
async fn main() -> Result<()> {
    let server = scratch::server_url();
    let nats = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let events = env("ORDO_EVENTS", 20_000);
    println!("throughput, {events} events, 1,000 keys");
    let phases = std::env::var("ORDO_PHASES").unwrap_or_else(|_| {
        "raw,raw full,sink,relay,relay x4,relay x4,relay,sink,raw full,raw".into()
    });
    for phase in phases.split(',').map(str::trim) {
        let rate = match phase {
            "raw" => raw(&nats, events).await?,
            "relay" => relay(&server, &nats, events, 1, false).await?,
            "relay detail" => relay(&server, &nats, events, 1, true).await?,
            "raw full" => raw_with(&nats, events, true).await?,
            "sink" => {
                let stream = TestStream::create(&nats).await?;
                let sink = NatsSink::builder(&nats)
                    .subject_prefix(&stream.prefix)
                    .build()?;
                let rate = relay_bench::sink_rate(events, sink).await?;
                stream.delete().await?;
                rate
            }
            _ => relay(&server, &nats, events, 4, false).await?,
        };
        println!("{phase:>9} {rate:>10.0} events/s");
    }
    let (rate, seconds) = (env("ORDO_RATE", 500), env("ORDO_SECONDS", 10));
    for _ in 0..env("ORDO_LATENCY_ROUNDS", 2) {
        let stream = TestStream::create(&nats).await?;
        let client = async_nats::connect(&nats).await?;
        let arrivals = client
            .subscribe(format!("{}.>", stream.prefix))
            .await?
            .map(|message| message.payload.to_vec());
        let sink = NatsSink::builder(&nats)
            .subject_prefix(&stream.prefix)
            .build()?;
        let h = relay_bench::latency(&server, rate, seconds, sink, arrivals).await?;
        relay_bench::report(rate, seconds, &h);
        stream.delete().await?;
    }
    Ok(())
}
