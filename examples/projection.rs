//! A durable subscription that keeps a read model in step with the events, exactly once.
//!
//! ```sh
//! cargo run --example projection
//! ```
//! Reads `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`). Publishes a
//! few deposits, lets a commit-lane subscription fold them into `projection_balances` (each
//! handler write commits with the subscription's checkpoint), prints the balances, and exits.

use std::sync::Arc;
use std::time::Duration;

use ordo::{
    Batch, Envelope, HandlerError, JobConfig, OnExhaustion, Ordering, Outbox, OutboxConfig,
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
        event: &Arc<Envelope<Deposited>>,
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

    let mut last = ordo::EventSequence::BEGIN;
    for (account, cents) in [("alice", 500), ("bob", 250), ("alice", 125)] {
        let mut tx = outbox.begin().await?;
        tx.publish(Deposited {
            account: account.to_owned(),
            cents,
        })?;
        last = tx.commit().await?.into_iter().max().unwrap_or(last);
    }
    // Where the last deposit landed in the commit log, once the sequencer has folded it.
    let mut target = None;
    for _ in 0..1_000 {
        target = sqlx::query_scalar::<_, i64>(
            "SELECT commit_seq FROM ordo.commit_log WHERE sequence = $1",
        )
        .bind(last.get() as i64)
        .fetch_optional(&pool)
        .await?;
        if target.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let target = target.ok_or("the sequencer did not fold the deposits in 10 s")? as u64;
    let (status, done) = subscription
        .wait_for(Duration::from_secs(10), |s| s.position.get() >= target)
        .await;
    println!(
        "subscription {name}: {:?} at position {:?}, lag {}",
        status.state, status.position, status.lag
    );
    if !done {
        return Err("the subscription did not catch up in 10 s".into());
    }
    let balances: Vec<(String, i64)> =
        sqlx::query_as("SELECT account, cents FROM projection_balances ORDER BY account")
            .fetch_all(&pool)
            .await?;
    for (account, cents) in balances {
        println!("{account:>8}: {cents} cents");
    }
    subscription.shutdown().await;
    sqlx::query("DELETE FROM ordo.subscriptions WHERE name = $1")
        .bind(&name)
        .execute(&pool)
        .await?;
    outbox.shutdown().await;
    Ok(())
}
