//! Relay throughput and latency against Kafka, next to the raw client in the same run.
//!
//! ```sh
//! cd benches/tools && cargo run --release --features kafka --example relay_load_kafka
//! ```
//! Uses `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`, a scratch
//! database per run) and the Kafka cluster at `KAFKA_BOOTSTRAP`; without it, librdkafka's mock
//! cluster started in this process (one broker: what the tests run against; no Kafka
//! distribution or Docker on the machines this was written on). A topic of 8 partitions per run.
//!
//! - **raw**: `ORDO_EVENTS` records produced with `rdkafka`'s `FutureProducer` set up as the
//!   sink's (idempotent, `acks=all`, the Java partitioner), each with a key of 1,000 and an
//!   `ordo-event-id` header, all enqueued at once and their delivery reports awaited: the
//!   client's own pipelined produce rate, the ceiling a relay can reach.
//! - **relay**: the same number of events written to `ordo.events` first, then a relay with a
//!   `KafkaSink` from the commit lane's start (batches of 500); events/s until its watermark
//!   reaches the last one.
//! - **latency**: single-event transactions committed at `ORDO_RATE`/s for `ORDO_SECONDS`,
//!   relayed as they come; for each, from just before its COMMIT to its arrival at a consumer of
//!   the topic (which reads only what the brokers acknowledged), p50/p99/max.
//!
//! Runs: raw, relay, relay, raw (A B B A), then the latency phase twice. `ORDO_PHASES` picks
//! other throughput runs, `ORDO_LATENCY_ROUNDS` the latency rounds.

use std::time::Instant;

use anyhow::Result;
use futures::StreamExt;
use ordo::relay::kafka::KafkaSink;
// The client ordo re-exports: the raw phase runs on exactly the version the sink is built on.
use ordo::relay::kafka::rdkafka::{
    ClientConfig, Offset, TopicPartitionList,
    consumer::{Consumer, StreamConsumer},
    message::{Header, Message as _, OwnedHeaders},
    mocking::MockCluster,
    producer::{FutureProducer, FutureRecord},
};

#[path = "support/relay_bench.rs"]
mod relay_bench;
#[path = "support/scratch.rs"]
mod scratch;

use relay_bench::{Item, env};

const PARTITIONS: i32 = 8;

type Mock = MockCluster<'static, ordo::relay::kafka::rdkafka::producer::DefaultProducerContext>;

/// A topic of its own (created on the mock cluster; on a real cluster, auto-created or made
/// beforehand with 8 partitions).
fn topic(mock: Option<&Mock>) -> Result<String> {
    let name = format!("ordo-load-{}", uuid::Uuid::new_v4().simple());
    if let Some(mock) = mock {
        mock.create_topic(&name, PARTITIONS, 1)?;
    }
    Ok(name)
}

async fn raw(bootstrap: &str, topic: &str, events: u64) -> Result<f64> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", "murmur2_random")
        .create()?;
    let payload = serde_json::to_vec(&Item { n: 0, key: 0 })?;
    let started = Instant::now();
    let mut deliveries = futures::stream::FuturesUnordered::new();
    for n in 0..events {
        let id = uuid::Uuid::now_v7().to_string();
        let key = (n % 1000).to_string();
        let headers = OwnedHeaders::new().insert(Header {
            key: "ordo-event-id",
            value: Some(id.as_bytes()),
        });
        let record = FutureRecord::to(topic)
            .payload(&payload[..])
            .key(key.as_bytes())
            .headers(headers);
        match producer.send_result(record) {
            Ok(delivery) => deliveries.push(delivery),
            Err((error, _)) => anyhow::bail!("enqueueing: {error}"),
        }
    }
    while let Some(report) = deliveries.next().await {
        if let Err((error, _)) = report? {
            anyhow::bail!("a delivery failed: {error}");
        }
    }
    Ok(events as f64 / started.elapsed().as_secs_f64())
}

fn sink(bootstrap: &str, topic: &str) -> Result<KafkaSink> {
    Ok(KafkaSink::builder(bootstrap).topic(topic).build()?)
}

#[tokio::main]
async fn main() -> Result<()> {
    let server = scratch::server_url();
    let mock = match std::env::var("KAFKA_BOOTSTRAP") {
        Ok(_) => None,
        Err(_) => Some(MockCluster::new(1)?),
    };
    let bootstrap = match &mock {
        Some(mock) => mock.bootstrap_servers(),
        None => std::env::var("KAFKA_BOOTSTRAP")?,
    };
    let events = env("ORDO_EVENTS", 20_000);
    println!("throughput, {events} events, 1,000 keys, {PARTITIONS} partitions");
    let phases = std::env::var("ORDO_PHASES").unwrap_or_else(|_| "raw,relay,relay,raw".into());
    for phase in phases.split(',').map(str::trim) {
        let topic = topic(mock.as_ref())?;
        let rate = match phase {
            "raw" => raw(&bootstrap, &topic, events).await?,
            _ => relay_bench::relay_rate(&server, events, vec![sink(&bootstrap, &topic)?]).await?,
        };
        println!("{phase:>9} {rate:>10.0} events/s");
    }
    let (rate, seconds) = (env("ORDO_RATE", 500), env("ORDO_SECONDS", 10));
    for _ in 0..env("ORDO_LATENCY_ROUNDS", 2) {
        let topic = topic(mock.as_ref())?;
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set(
                "group.id",
                format!("latency-{}", uuid::Uuid::new_v4().simple()),
            )
            .set("auto.offset.reset", "earliest")
            .set("fetch.wait.max.ms", "5")
            .create()?;
        // Assigned, not subscribed: no group to join, so the consumer reads from the first
        // record on (a group's first join takes seconds, which would show as latency).
        let mut partitions = TopicPartitionList::new();
        for partition in 0..PARTITIONS {
            partitions.add_partition_offset(&topic, partition, Offset::Beginning)?;
        }
        consumer.assign(&partitions)?;
        let arrivals = consumer
            .stream()
            .filter_map(|message| async move { message.ok()?.payload().map(<[u8]>::to_vec) });
        let sink = sink(&bootstrap, &topic)?;
        let h = relay_bench::latency(&server, rate, seconds, sink, Box::pin(arrivals)).await?;
        relay_bench::report(rate, seconds, &h);
    }
    Ok(())
}
