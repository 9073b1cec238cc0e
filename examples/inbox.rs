//! The consumer inbox: a redelivered message takes effect once, a failing one is dead-lettered
//! and replayed, and a watermark-mode consumer refuses a gap until it is filled.
//!
//! ```sh
//! cargo run --example inbox
//! ```
//! Reads `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`). Plays a
//! transport that delivers each message more than once, prints each receipt, and exits.

use ordo::HandlerError;
use ordo::inbox::{self, Inbox, InboxConfig, InboxHandler, InboxMessage, InboxMode};
use serde::Deserialize;
use sqlx::PgConnection;

#[derive(Deserialize)]
struct Shipped {
    order_id: i64,
}

/// Records each shipment, in the inbox's transaction. Refuses order 13 until it is fixed.
struct Shipments;

impl InboxHandler for Shipments {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        message: &InboxMessage,
    ) -> Result<(), HandlerError> {
        let shipped: Shipped = message.payload_as()?;
        let fixed: bool = sqlx::query_scalar("SELECT count(*) > 0 FROM inbox_example_fixed")
            .fetch_one(&mut *tx)
            .await?;
        if shipped.order_id == 13 && !fixed {
            return Err("order 13 is not in the catalogue".into());
        }
        sqlx::query("INSERT INTO inbox_example_shipments (order_id) VALUES ($1)")
            .bind(shipped.order_id)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let pool = sqlx::PgPool::connect(&url).await?;
    ordo::migrate(&pool).await?;
    for statement in [
        "CREATE TABLE IF NOT EXISTS inbox_example_shipments (order_id BIGINT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS inbox_example_fixed (fixed BOOLEAN)",
        "TRUNCATE inbox_example_shipments, inbox_example_fixed",
    ] {
        sqlx::query(statement).execute(&pool).await?;
    }
    // A fresh consumer name per run, so the example starts from nothing.
    let run = uuid::Uuid::new_v4().simple().to_string();
    let consumer = format!("example-shipping-{run}");
    let inbox = Inbox::new(pool.clone(), InboxConfig::new(&consumer).max_attempts(2))?;

    // The transport delivers order 7 three times (a lost ack, a failover): it takes effect once.
    let seven = InboxMessage::new("msg-7", r#"{"order_id":7}"#);
    for delivery in 1..=3 {
        let receipt = inbox.receive(&seven, &Shipments).await?;
        println!(
            "order 7, delivery {delivery}: {receipt:?} (ack: {})",
            receipt.settled()
        );
    }
    // Order 13 fails twice and is dead-lettered in the inbox.
    let thirteen = InboxMessage::new("msg-13", r#"{"order_id":13}"#);
    for delivery in 1..=2 {
        let receipt = inbox.receive(&thirteen, &Shipments).await?;
        println!("order 13, delivery {delivery}: {receipt:?}");
    }
    for failed in inbox::list_failed(&pool, Some(&consumer)).await? {
        println!(
            "failed: {} after {} attempts: {:?}",
            failed.id, failed.attempts, failed.error
        );
    }
    // The cause is fixed; an operator replays it (`ordo inbox replay msg-13`); the consumer
    // runs what was replayed from the stored payload.
    sqlx::query("INSERT INTO inbox_example_fixed VALUES (true)")
        .execute(&pool)
        .await?;
    inbox::replay(&pool, Some(&consumer), "msg-13").await?;
    for (id, receipt) in inbox.run_pending(&Shipments, 100).await? {
        println!("replayed {id}: {receipt:?}");
    }

    // Watermark mode: messages from another ordo, numbered densely; one row per source.
    let replica = Inbox::new(
        pool.clone(),
        InboxConfig::new(format!("example-replica-{run}")).mode(InboxMode::Watermark),
    )?;
    for position in [1, 3, 2, 3, 2] {
        let message = InboxMessage::new(
            format!("orders-{position}"),
            format!(r#"{{"order_id":{}}}"#, 100 + position),
        )
        .with_source("orders-db", position);
        let receipt = replica.receive(&message, &Shipments).await?;
        println!("orders-db position {position}: {receipt:?}");
    }

    let shipped: Vec<i64> =
        sqlx::query_scalar("SELECT order_id FROM inbox_example_shipments ORDER BY order_id")
            .fetch_all(&pool)
            .await?;
    println!("shipments recorded once each: {shipped:?}");
    sqlx::query("DELETE FROM ordo.inbox WHERE consumer = $1")
        .bind(&consumer)
        .execute(&pool)
        .await?;
    sqlx::query("DELETE FROM ordo.inbox_watermarks WHERE consumer = $1")
        .bind(format!("example-replica-{run}"))
        .execute(&pool)
        .await?;
    Ok(())
}
