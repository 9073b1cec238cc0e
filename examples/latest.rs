//! Latest values: feature flags and an exchange rate published by one service and followed by
//! another (two outboxes on two pools stand for two processes). Only the newest value of each
//! type is kept; nothing enters `ordo.events`.
//!
//! ```sh
//! cargo run --example latest
//! ```
//! Reads `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`).

use std::time::Duration;

use futures::StreamExt;
use ordo::{LatestStream, Outbox, OutboxConfig};
use serde::{Deserialize, Serialize};

/// Both types are published in this one shape: a stream decodes every type it selects as one
/// `T` (follow differently shaped types with a stream each, or as `serde_json::Value`).
#[derive(Debug, Serialize, Deserialize)]
struct Setting {
    name: String,
    value: serde_json::Value,
}

const WAIT: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let publisher_pool = sqlx::PgPool::connect(&url).await?;
    ordo::migrate(&publisher_pool).await?;
    let follower_pool = sqlx::PgPool::connect(&url).await?;

    // The outbox's own event type does not matter for latest values.
    let publisher =
        Outbox::<serde_json::Value>::new(publisher_pool, OutboxConfig::default()).await?;
    let follower = Outbox::<serde_json::Value>::new(follower_pool, OutboxConfig::default()).await?;

    // A value published before anyone listens is not lost: it is the current value.
    let version = publisher
        .publish_latest("example.flags", &setting("dark_mode", true.into()))
        .await?;
    println!("published example.flags version {version}");

    // One stream, two types: first the current value of each that has one, then newer ones.
    let mut settings: LatestStream<Setting> =
        follower.latest(["example.flags", "example.fx.eurusd"])?;
    // (A rate from an earlier run of this example may come first: order between types is
    // not defined.)
    until(&mut settings, "example.flags", version).await?;

    // Published in a transaction with domain writes: seen only if it commits.
    let mut tx = publisher.begin().await?;
    let version = tx
        .publish_latest("example.fx.eurusd", &setting("EURUSD", 1.0834.into()))
        .await?;
    tx.commit().await?;
    until(&mut settings, "example.fx.eurusd", version).await?;

    publisher.shutdown().await;
    follower.shutdown().await;
    Ok(())
}

fn setting(name: &str, value: serde_json::Value) -> Setting {
    Setting {
        name: name.to_owned(),
        value,
    }
}

/// Prints the stream's values until `event_type` reaches `version`, each within [`WAIT`].
async fn until(
    stream: &mut LatestStream<Setting>,
    event_type: &str,
    version: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    loop {
        let item = tokio::time::timeout(WAIT, stream.next())
            .await?
            .ok_or("the outbox stopped")??;
        println!(
            "{} v{}: {} = {} (published {})",
            item.event_type, item.version, item.payload.name, item.payload.value, item.updated_at
        );
        if item.event_type == event_type && item.version >= version {
            return Ok(());
        }
    }
}
