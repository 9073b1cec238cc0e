//! Quickstart: publish an event in the same transaction as a domain write, and receive it on
//! the insert-ordered lane.
//!
//! ```sh
//! cargo run --example quickstart
//! ```
//! Reads `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`).

use std::time::Duration;

use futures::StreamExt;
use ordo::{Outbox, OutboxConfig, Start};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type")]
enum ShopEvent {
    OrderPlaced { order_id: i64, total_cents: i64 },
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let pool = sqlx::PgPool::connect(&url).await?;
    ordo::migrate(&pool).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS quickstart_orders (id BIGSERIAL PRIMARY KEY, total_cents BIGINT NOT NULL)",
    )
    .execute(&pool)
    .await?;

    let outbox = Outbox::<ShopEvent>::new(pool, OutboxConfig::default()).await?;
    let mut events = outbox.listen_inserted(Start::Now);

    // The domain write and the event commit together, or not at all.
    let mut tx = outbox.begin().await?;
    let order_id: i64 = sqlx::query_scalar(
        "INSERT INTO quickstart_orders (total_cents) VALUES (4200) RETURNING id",
    )
    .fetch_one(&mut *tx)
    .await?;
    tx.publish(ShopEvent::OrderPlaced {
        order_id,
        total_cents: 4200,
    })?;
    let sequences = tx.commit().await?;
    println!("committed order {order_id} as event {}", sequences[0]);

    let event = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await?
        .ok_or("the outbox stopped")??;
    println!(
        "received event {} (id {}, transaction {}): {:?}",
        event.sequence, event.id, event.commit_xid, event.payload
    );
    outbox.shutdown().await;
    Ok(())
}
