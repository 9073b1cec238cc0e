//! A durable subscription that keeps a read model in step with the events, exactly once.
//!
//! ```sh
//! cargo run --example projection
//! ```
//! Reads `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`). Publishes a
//! few deposits, lets a commit-lane subscription fold them into `projection_balances` (each
//! handler write commits with the subscription's checkpoint), prints the balances, and exits.

use std::time::Duration;

use ordo::{
    Batch, Delivery, HandlerError, JobConfig, OnExhaustion, Ordering, Outbox, OutboxConfig,
    Subscriber,
};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

#[derive(Debug, Serialize, Deserialize)]
struct Deposited {
    account: String,
    cents: i64,
}

/// Applies each source transaction's deposits in one go.
struct Balances;

impl Subscriber<Deposited> for Balances {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        event: &Delivery<Deposited>,
    ) -> Result<(), HandlerError> {
        sqlx::query(
            "INSERT INTO projection_balances (account, cents) VALUES ($1, $2)
             ON CONFLICT (account) DO UPDATE SET cents = projection_balances.cents + EXCLUDED.cents",
        )
        .bind(&event.payload.account)
        .bind(event.payload.cents)
        .execute(&mut *tx)
        .await?;
        Ok(())
    }
    // `handle_group` keeps its default: `handle` for each event of the group, in one
    // transaction with the checkpoint at the group's boundary.
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let pool = sqlx::PgPool::connect(&url).await?;
    ordo::migrate(&pool).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS projection_balances (account TEXT PRIMARY KEY, cents BIGINT NOT NULL)",
    )
    .execute(&pool)
    .await?;
    sqlx::query("TRUNCATE projection_balances")
        .execute(&pool)
        .await?;
    let outbox = Outbox::<Deposited>::new(pool.clone(), OutboxConfig::default()).await?;

    // A fresh name per run, so the example always starts from the events it publishes now.
    let name = format!("example-balances-{}", uuid::Uuid::new_v4().simple());
    let config = JobConfig::new(name.clone())
        .ordering(Ordering::Commit)
        .batch(Batch::Groups)
        .start(ordo::StartFrom::Now)
        .on_exhaustion(OnExhaustion::DeadLetter);
    let subscription = outbox.subscribe(config, Balances).await?;

    let mut written = Vec::new();
    for (account, cents) in [("alice", 500), ("bob", 250), ("alice", 125)] {
        let mut tx = outbox.begin().await?;
        tx.publish(Deposited {
            account: account.to_owned(),
            cents,
        })?;
        written.extend(tx.commit().await?);
    }
    // Read-your-writes: wait until the projection has handled what we wrote (from any process:
    // the wait asks the database), then read it.
    outbox
        .wait_for_subscription(&name, &written, Duration::from_secs(10))
        .await?;
    let positions = outbox
        .wait_for_commit(&written, Duration::from_secs(10))
        .await?;
    let status = subscription.status();
    let positions: Vec<String> = positions.iter().map(ToString::to_string).collect();
    println!(
        "subscription {name}: {:?} at {} position {}, lag {}; the deposits sit at commit positions {}",
        status.state,
        status.lane,
        status.position,
        status.lag,
        positions.join(", ")
    );
    let balances: Vec<(String, i64)> =
        sqlx::query_as("SELECT account, cents FROM projection_balances ORDER BY account")
            .fetch_all(&pool)
            .await?;
    for (account, cents) in balances {
        println!("{account:>8}: {cents} cents");
    }
    subscription.shutdown().await;
    ordo::admin::delete_subscription(&pool, &name, false).await?;
    outbox.shutdown().await;
    Ok(())
}
