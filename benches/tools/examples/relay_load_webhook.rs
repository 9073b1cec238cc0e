//! Relay throughput and latency through HTTP webhooks, next to a raw HTTP client in the same run.
//!
//! ```sh
//! cargo run --release --example relay_load_webhook
//! ```
//! Uses `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`, a scratch
//! database per run). The receiver is the tool's own: a minimal HTTP/1.1 server on 127.0.0.1
//! (`tests/common/http_responder.rs`, one per run) that reads each request's head and body on
//! a kept-alive connection and answers `200` with an empty body. It checks no signature, so
//! both sides below pay the same for it.
//!
//! - **raw**: `ORDO_EVENTS` POSTs of a small JSON body (`{"n":…,"key":…}`) with `reqwest`,
//!   `Content-Type` and a fresh `Ordo-Event-Id` set, [`IN_FLIGHT`] requests in flight: the
//!   ceiling a relay can reach.
//! - **relay**: the same number of events written and folded first, then a relay from the
//!   commit lane's start through a `WebhookSink` (signed requests, [`IN_FLIGHT`] keys at once,
//!   1,000 keys) to the same kind of server; events/s until its watermark reaches the last one.
//!   **relay x4**: four sinks, four batches in flight.
//! - **latency**: single-event transactions at `ORDO_RATE`/s (default 500) for `ORDO_SECONDS`
//!   (default 10), relayed as they come; for each, from just before its COMMIT to the
//!   request's arrival at the server, p50/p99/max.
//!
//! `ORDO_PHASES` (default `raw,relay,relay x4,relay x4,relay,raw`) and `ORDO_LATENCY_ROUNDS`
//! (default 2) pick the runs; the relays' mean rates are then given as a share of the raw
//! client's.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Result;
use futures::StreamExt;
use ordo::relay::http::WebhookSink;

#[allow(dead_code)]
#[path = "../../../tests/common/http_responder.rs"]
mod http_responder;
#[path = "support/relay_bench.rs"]
mod relay_bench;
#[path = "support/scratch.rs"]
mod scratch;

use http_responder::Responder;
use relay_bench::{Item, env};

/// Requests in flight: a sink's concurrency (its default) and the raw client's.
const IN_FLIGHT: usize = 16;

fn sink(responder: &Responder) -> ordo::Result<WebhookSink> {
    WebhookSink::builder(responder.url("/events"), b"ordo-load-secret".to_vec())
        .concurrency(IN_FLIGHT)
        .build()
}

async fn raw(events: u64) -> Result<f64> {
    let responder = Responder::start(Vec::new()).await;
    let (client, url) = (reqwest::Client::new(), responder.url("/events"));
    let started = Instant::now();
    let mut posts = futures::stream::iter(0..events)
        .map(|n| {
            let request = client
                .post(&url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .header("Ordo-Event-Id", uuid::Uuid::now_v7().to_string());
            async move {
                let body = serde_json::to_vec(&Item { n, key: n % 1000 })?;
                request.body(body).send().await?.error_for_status()?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(IN_FLIGHT);
    while let Some(posted) = posts.next().await {
        posted?;
    }
    let rate = events as f64 / started.elapsed().as_secs_f64();
    anyhow::ensure!(responder.count() as u64 == events, "requests lost");
    Ok(rate)
}

async fn relay(server: &str, events: u64, sinks: usize) -> Result<f64> {
    let responder = Responder::start(Vec::new()).await;
    let sinks = (0..sinks)
        .map(|_| sink(&responder))
        .collect::<ordo::Result<Vec<_>>>()?;
    let rate = relay_bench::relay_rate(server, events, sinks).await?;
    anyhow::ensure!(responder.count() as u64 >= events, "requests lost");
    Ok(rate)
}

#[tokio::main]
async fn main() -> Result<()> {
    let server = scratch::server_url();
    let events = env("ORDO_EVENTS", 20_000);
    println!(
        "receiver: HTTP/1.1 on 127.0.0.1, keep-alive, 200 with an empty body; \
         {IN_FLIGHT} requests in flight (raw, and per sink)"
    );
    println!("throughput, {events} events, 1,000 keys");
    let phases = std::env::var("ORDO_PHASES")
        .unwrap_or_else(|_| "raw,relay,relay x4,relay x4,relay,raw".into());
    let mut rates: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for phase in phases.split(',').map(str::trim) {
        let rate = match phase {
            "raw" => raw(events).await?,
            "relay" => relay(&server, events, 1).await?,
            _ => relay(&server, events, 4).await?,
        };
        println!("{phase:>9} {rate:>10.0} events/s");
        rates.entry(phase).or_default().push(rate);
    }
    let mean = |rates: &Vec<f64>| rates.iter().sum::<f64>() / rates.len() as f64;
    if let Some(raw) = rates.get("raw").map(mean) {
        for (phase, relayed) in rates.iter().filter(|(phase, _)| **phase != "raw") {
            println!("{phase:>9} / raw {:>6.2}", mean(relayed) / raw);
        }
    }
    let (rate, seconds) = (env("ORDO_RATE", 500), env("ORDO_SECONDS", 10));
    for _ in 0..env("ORDO_LATENCY_ROUNDS", 2) {
        let responder = Responder::start(Vec::new()).await;
        let mut requests = responder.watch();
        let arrivals =
            futures::stream::poll_fn(move |cx| requests.poll_recv(cx)).map(|request| request.body);
        let h = relay_bench::latency(&server, rate, seconds, sink(&responder)?, arrivals).await?;
        relay_bench::report(rate, seconds, &h);
    }
    Ok(())
}
