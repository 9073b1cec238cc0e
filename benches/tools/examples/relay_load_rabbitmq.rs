//! Relay throughput and latency against RabbitMQ, next to the raw client in the same run.
//!
//! ```sh
//! cargo run --release --example relay_load_rabbitmq
//! ```
//! Uses `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`, a scratch
//! database per run) and RabbitMQ at `AMQP_URL` (default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`, a durable queue per run, deleted after).
//!
//! - **raw**: `ORDO_EVENTS` persistent messages published with `lapin` on one confirm-mode
//!   channel through the default exchange to the queue, up to 128 awaiting their confirm (the
//!   `RabbitSink`'s default pipeline depth), `message_id` set: the ceiling a relay can reach.
//! - **relay**: the same number of events written and folded first, then a relay from the
//!   commit lane's start through a `RabbitSink` to the same kind of queue; events/s until its
//!   watermark reaches the last one. **relay x4**: four sinks, four batches in flight.
//! - **latency**: single-event transactions at `ORDO_RATE`/s for `ORDO_SECONDS`, relayed as they
//!   come; for each, from just before its COMMIT to its arrival at a consumer of the queue.
//!
//! `ORDO_PHASES` (default `raw,relay,relay x4,relay x4,relay,raw`) and `ORDO_LATENCY_ROUNDS`
//! (default 2) pick the runs.

use std::collections::VecDeque;
use std::time::Instant;

use anyhow::Result;
use futures::StreamExt;
use ordo::relay::rabbitmq::RabbitSink;
// The client ordo re-exports: the raw phases run on exactly the version the sink is built on.
use ordo::relay::rabbitmq::lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use ordo::relay::rabbitmq::lapin::types::FieldTable;
use ordo::relay::rabbitmq::lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

#[path = "support/relay_bench.rs"]
mod relay_bench;
#[path = "support/scratch.rs"]
mod scratch;

use relay_bench::{Item, env};

/// A durable queue of its own, deleted by [`TestQueue::delete`].
struct TestQueue {
    connection: Connection,
    channel: Channel,
    name: String,
}

impl TestQueue {
    async fn create(uri: &str) -> Result<TestQueue> {
        let connection = Connection::connect(uri, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        let name = format!("ordo_load_{}", uuid::Uuid::new_v4().simple());
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_declare(name.as_str().into(), durable, FieldTable::default())
            .await?;
        Ok(TestQueue {
            connection,
            channel,
            name,
        })
    }

    async fn delete(self) -> Result<()> {
        self.channel
            .queue_delete(self.name.as_str().into(), QueueDeleteOptions::default())
            .await?;
        self.connection.close(200, "done".into()).await?;
        Ok(())
    }

    fn sink(&self, uri: &str) -> ordo::Result<RabbitSink> {
        let queue = self.name.clone();
        RabbitSink::builder(uri)
            .route(move |_| (String::new(), queue.clone()))
            .build()
    }
}

async fn raw(uri: &str, events: u64) -> Result<f64> {
    let queue = TestQueue::create(uri).await?;
    let channel = queue.connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let payload = serde_json::to_vec(&Item { n: 0, key: 0 })?;
    let started = Instant::now();
    let mut confirms = VecDeque::new();
    for _ in 0..events {
        let properties = BasicProperties::default()
            .with_message_id(uuid::Uuid::now_v7().to_string().into())
            .with_content_type("application/json".into())
            .with_delivery_mode(2);
        let confirm = channel
            .basic_publish(
                "".into(),
                queue.name.as_str().into(),
                BasicPublishOptions::default(),
                &payload,
                properties,
            )
            .await?;
        confirms.push_back(confirm);
        if confirms.len() >= 128
            && let Some(oldest) = confirms.pop_front()
        {
            anyhow::ensure!(oldest.await?.is_ack(), "a nack");
        }
    }
    for confirm in confirms {
        anyhow::ensure!(confirm.await?.is_ack(), "a nack");
    }
    let rate = events as f64 / started.elapsed().as_secs_f64();
    channel.close(200, "done".into()).await?;
    queue.delete().await?;
    Ok(rate)
}

async fn relay(server: &str, uri: &str, events: u64, sinks: usize) -> Result<f64> {
    let queue = TestQueue::create(uri).await?;
    let sinks = (0..sinks)
        .map(|_| queue.sink(uri))
        .collect::<ordo::Result<Vec<_>>>()?;
    let rate = relay_bench::relay_rate(server, events, sinks).await?;
    queue.delete().await?;
    Ok(rate)
}

#[tokio::main]
async fn main() -> Result<()> {
    let server = scratch::server_url();
    let uri = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let events = env("ORDO_EVENTS", 20_000);
    println!("throughput, {events} events, 1,000 keys");
    let phases = std::env::var("ORDO_PHASES")
        .unwrap_or_else(|_| "raw,relay,relay x4,relay x4,relay,raw".into());
    for phase in phases.split(',').map(str::trim) {
        let rate = match phase {
            "raw" => raw(&uri, events).await?,
            "relay" => relay(&server, &uri, events, 1).await?,
            _ => relay(&server, &uri, events, 4).await?,
        };
        println!("{phase:>9} {rate:>10.0} events/s");
    }
    let (rate, seconds) = (env("ORDO_RATE", 500), env("ORDO_SECONDS", 10));
    for _ in 0..env("ORDO_LATENCY_ROUNDS", 2) {
        let queue = TestQueue::create(&uri).await?;
        let consumer = queue
            .channel
            .basic_consume(
                queue.name.as_str().into(),
                "".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        let arrivals = consumer.filter_map(|delivery| async move { delivery.ok().map(|d| d.data) });
        let sink = queue.sink(&uri)?;
        let h = relay_bench::latency(&server, rate, seconds, sink, Box::pin(arrivals)).await?;
        relay_bench::report(rate, seconds, &h);
        queue.delete().await?;
    }
    Ok(())
}
