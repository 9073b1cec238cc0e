//! A relay from the commit lane to NATS JetStream: orders leave in commit order per customer,
//! each with its event id as `Nats-Msg-Id`, so the stream drops a repeat.
//!
//! ```sh
//! cargo run --example relay_nats --features nats
//! ```
//! Reads `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`) and `NATS_URL`
//! (default `nats://127.0.0.1:4222`, JetStream on). Creates a stream `ORDO_EXAMPLE_<random>` on
//! subjects `ordo_example_<random>.>` with a duplicate window that covers the relay's re-sends
//! (`docs/relays.md`, "Preparing the sink"), relays five orders into it, prints what the stream
//! holds, deletes the stream and the relay's row, and exits.
//!
//! The NATS client is the one ordo re-exports (`ordo::relay::nats::async_nats`), and sqlx is
//! `ordo::sqlx`: copied into a project, this needs no `async-nats` or `sqlx` dependency.

use std::time::Duration;

use ordo::relay::nats::NatsSink;
use ordo::relay::nats::async_nats::{
    self,
    jetstream::{self, stream},
};
use ordo::relay::{RelayConfig, SinkTiming};
use ordo::sqlx;
use ordo::{Keys, Outbox, OutboxConfig, StartFrom};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct OrderPlaced {
    customer: String,
    cents: i64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let nats = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    let pool = sqlx::PgPool::connect(&url).await?;
    ordo::migrate(&pool).await?;
    let outbox = Outbox::<OrderPlaced>::new(pool.clone(), OutboxConfig::default()).await?;

    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let name = format!("example-relay-{suffix}");
    // From now on: the database may hold older events of other kinds.
    let config = RelayConfig::new(name.clone()).start(StartFrom::Now);

    // A stream of our own, so the example leaves nothing behind, bound to the sink's subjects
    // ("{prefix}.>") and dropping every repeat the relay may send (its re-send span).
    let prefix = format!("ordo_example_{suffix}");
    let jetstream = jetstream::new(async_nats::connect(&nats).await?);
    let stream_name = format!("ORDO_EXAMPLE_{suffix}");
    let window = SinkTiming::of(&config).resend_span;
    jetstream
        .create_stream(stream::Config {
            name: stream_name.clone(),
            subjects: vec![format!("{prefix}.>")],
            duplicate_window: window,
            ..Default::default()
        })
        .await?;
    println!("stream {stream_name}: subjects {prefix}.>, duplicate window {window:?}");

    let sink = NatsSink::builder(&nats).subject_prefix(&prefix).build()?;
    let relay = outbox
        .relay(config, sink, |event| {
            Keys::one(event.payload.customer.clone())
        })
        .await?;

    let mut written = Vec::new();
    for (customer, cents) in [
        ("ada", 1200),
        ("bob", 500),
        ("ada", 300),
        ("cy", 99),
        ("bob", 42),
    ] {
        let mut tx = outbox.begin().await?;
        tx.publish_typed(
            Some("OrderPlaced"),
            OrderPlaced {
                customer: customer.to_owned(),
                cents,
            },
        )?;
        written.extend(tx.commit().await?);
    }
    let positions = outbox
        .wait_for_commit(&written, Duration::from_secs(10))
        .await?;
    let last = positions.iter().map(|p| p.get()).max().unwrap_or(0);
    let (status, delivered) = relay
        .wait_for(Duration::from_secs(10), |s| s.position.get() >= last)
        .await;
    println!(
        "relay {name}: delivered through commit position {} ({delivered})",
        status.position
    );

    let mut stream = jetstream.get_stream(&stream_name).await?;
    let count = stream.info().await?.state.messages;
    for sequence in 1..=count {
        let message = stream.get_raw_message(sequence).await?;
        let id = message
            .headers
            .get("Nats-Msg-Id")
            .map(|v| v.to_string())
            .unwrap_or_default();
        println!(
            "{} {} Nats-Msg-Id={id}",
            message.subject,
            String::from_utf8_lossy(&message.payload)
        );
    }

    relay.shutdown().await;
    jetstream.delete_stream(&stream_name).await?;
    ordo::admin::delete_subscription(&pool, &name, false).await?;
    outbox.shutdown().await;
    Ok(())
}
