//! One ordo's commit lane into another's inbox through NATS JetStream: a relay sends orders
//! with their source and commit position, a `NatsInbox` adapter takes them into an inbox in
//! watermark mode (one row for the whole source), whose handler keeps a projection.
//!
//! ```sh
//! cargo run --example relay_to_inbox --features nats
//! ```
//! Reads `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`; both sides use
//! it here, as two services would use two databases) and `NATS_URL` (default
//! `nats://127.0.0.1:4222`, JetStream on). Creates a stream `ORDO_EXAMPLE_<random>`, relays five
//! orders, projects them, prints the projection and the inbox's mark, removes what it made.
//!
//! The NATS client is the one ordo re-exports (`ordo::relay::nats::async_nats`), and sqlx is
//! `ordo::sqlx`: copied into a project, this needs no `async-nats` or `sqlx` dependency.

use std::time::Duration;

use ordo::inbox::{Inbox, InboxConfig, InboxHandler, InboxMessage, InboxMode, NatsInbox};
use ordo::relay::nats::NatsSink;
use ordo::relay::nats::async_nats::{
    self,
    jetstream::{self, stream},
};
use ordo::relay::{RelayConfig, SinkTiming};
use ordo::sqlx::{self, PgConnection};
use ordo::{HandlerError, Keys, Outbox, OutboxConfig, StartFrom, SubscriptionState};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct OrderPlaced {
    customer: String,
    cents: i64,
}

/// The receiving side's handler: its write commits with the inbox's mark, or not at all.
struct Totals {
    table: String,
}

impl InboxHandler for Totals {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        message: &InboxMessage,
    ) -> Result<(), HandlerError> {
        let order: OrderPlaced = message.payload_as()?;
        let upsert = format!(
            "INSERT INTO {} (customer, cents) VALUES ($1, $2)
             ON CONFLICT (customer) DO UPDATE SET cents = {0}.cents + excluded.cents",
            self.table
        );
        // The table name is this run's, made of a UUID: no user text reaches the SQL.
        sqlx::query(sqlx::AssertSqlSafe(upsert))
            .bind(&order.customer)
            .bind(order.cents)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
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
    // The sending side: the commit lane from now on, in commit order (one key for all), with
    // its source name and commit position on every message.
    let (relay_name, source) = (format!("example-relay-{suffix}"), "orders-db");
    let config = RelayConfig::new(relay_name.clone())
        .start(StartFrom::Now)
        .source(source);

    // The stream both sides use (the inbox adapter creates only its consumer), with a duplicate
    // window that covers the relay's re-sends (`docs/relays.md`, "Preparing the sink").
    let prefix = format!("ordo_example_{suffix}");
    let stream_name = format!("ORDO_EXAMPLE_{suffix}");
    let jetstream = jetstream::new(async_nats::connect(&nats).await?);
    jetstream
        .create_stream(stream::Config {
            name: stream_name.clone(),
            subjects: vec![format!("{prefix}.>")],
            duplicate_window: SinkTiming::of(&config).resend_span,
            ..Default::default()
        })
        .await?;

    let sink = NatsSink::builder(&nats).subject_prefix(&prefix).build()?;
    let relay = outbox.relay(config, sink, |_| Keys::one("all")).await?;

    // The receiving side: the relay starts after position `start`, so the inbox's mark does too.
    let consumer = format!("example-totals-{suffix}");
    let table = format!("example_totals_{suffix}");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table} (customer TEXT PRIMARY KEY, cents BIGINT NOT NULL)"
    )))
    .execute(&pool)
    .await?;
    let (status, running) = relay
        .wait_for(Duration::from_secs(10), |s| {
            s.state == SubscriptionState::Running
        })
        .await;
    if !running {
        return Err(format!("the relay did not start: {status:?}").into());
    }
    let start = status.position.get();
    ordo::inbox::set_watermark(&pool, &consumer, source, start).await?;
    let inbox = Inbox::new(
        pool.clone(),
        InboxConfig::new(consumer.clone()).mode(InboxMode::Watermark),
    )?;
    let adapter = NatsInbox::builder(&nats, &stream_name, "totals").build()?;

    let orders = [
        ("ada", 1200),
        ("bob", 500),
        ("ada", 300),
        ("cy", 99),
        ("bob", 42),
    ];
    for (customer, cents) in orders {
        let mut tx = outbox.begin().await?;
        tx.publish_typed(
            Some("OrderPlaced"),
            OrderPlaced {
                customer: customer.to_owned(),
                cents,
            },
        )?;
        tx.commit().await?;
    }

    // Run the adapter until the inbox's mark has taken the five orders.
    let marked = async {
        for _ in 0..200 {
            let marks = ordo::inbox::list_watermarks(&pool, Some(&consumer)).await?;
            if marks.iter().any(|mark| mark.position >= start + 5) {
                return Ok::<bool, ordo::Error>(true);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(false)
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handler = Totals {
        table: table.clone(),
    };
    let (ran, took) = tokio::join!(
        adapter.run(&inbox, &handler, async {
            let _ = stopped.await;
        }),
        async {
            let took = marked.await;
            let _ = stop.send(());
            took
        }
    );
    ran?;
    println!("all five orders projected: {}", took?);

    let totals: Vec<(String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT customer, cents FROM {table} ORDER BY customer"
    )))
    .fetch_all(&pool)
    .await?;
    for (customer, cents) in totals {
        println!("{customer}: {cents} cents");
    }
    for mark in ordo::inbox::list_watermarks(&pool, Some(&consumer)).await? {
        println!(
            "inbox {} holds one row for source {}: mark {}",
            mark.consumer, mark.source, mark.position
        );
    }

    relay.shutdown().await;
    outbox.shutdown().await;
    jetstream.delete_stream(&stream_name).await?;
    ordo::admin::delete_subscription(&pool, &relay_name, false).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {table}")))
        .execute(&pool)
        .await?;
    sqlx::query("DELETE FROM ordo.inbox_watermarks WHERE consumer = $1")
        .bind(&consumer)
        .execute(&pool)
        .await?;
    Ok(())
}
