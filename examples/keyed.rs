//! A keyed subscription: notices to several recipients, each recipient's in order, the
//! recipients concurrently, one recipient failing without holding up the others.
//!
//! ```sh
//! cargo run --example keyed
//! ```
//! Reads `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`). Publishes
//! notices, lets a keyed subscription "send" them (each send takes 20 ms of pretend I/O and is
//! recorded in `keyed_example_sent`), shows the stalled recipient whose sends fail, retries it
//! as an operator would, prints what each recipient received in order, and exits.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::Duration;

use ordo::{
    Delivery, Envelope, HandlerError, JobConfig, Keys, OnExhaustion, Ordering, Outbox,
    OutboxConfig, RetryPolicy, StartFrom, Subscriber,
};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

#[derive(Debug, Serialize, Deserialize)]
struct Notice {
    recipients: Vec<String>,
    text: String,
}

/// "Sends" a notice to each recipient; sends to `carol` fail until `carol_fixed` is set.
struct Mailer {
    carol_fixed: Arc<AtomicBool>,
}

impl Subscriber<Notice> for Mailer {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        event: &Delivery<Notice>,
    ) -> Result<(), HandlerError> {
        let to_carol = event.payload.recipients.iter().any(|r| r == "carol");
        if to_carol && !self.carol_fixed.load(AtomicOrdering::SeqCst) {
            return Err("carol's mail server refuses the connection".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await; // the pretend I/O
        for recipient in &event.payload.recipients {
            sqlx::query("INSERT INTO keyed_example_sent (recipient, text) VALUES ($1, $2)")
                .bind(recipient)
                .bind(&event.payload.text)
                .execute(&mut *tx)
                .await?;
        }
        Ok(())
    }

    /// One key per recipient: a notice to two recipients waits for both, and holds both.
    fn keys(&self, event: &Envelope<Notice>) -> Keys {
        event.payload.recipients.iter().cloned().collect()
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let pool = sqlx::PgPool::connect(&url).await?;
    ordo::migrate(&pool).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS keyed_example_sent
             (id BIGINT GENERATED ALWAYS AS IDENTITY, recipient TEXT NOT NULL, text TEXT NOT NULL)",
    )
    .execute(&pool)
    .await?;
    sqlx::query("TRUNCATE keyed_example_sent")
        .execute(&pool)
        .await?;
    let outbox = Outbox::<Notice>::new(pool.clone(), OutboxConfig::default()).await?;

    let name = format!("example-mailer-{}", uuid::Uuid::new_v4().simple());
    let config = JobConfig::new(name.clone())
        .ordering(Ordering::Commit)
        .keyed(8)
        .start(StartFrom::Now)
        .retry(RetryPolicy {
            max_attempts: 2,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(50),
        })
        .on_exhaustion(OnExhaustion::Halt);
    let carol_fixed = Arc::new(AtomicBool::new(false));
    let mailer = Mailer {
        carol_fixed: Arc::clone(&carol_fixed),
    };
    let subscription = outbox.subscribe(config, mailer).await?;

    let notices = [
        (&["alice"][..], "1: welcome"),
        (&["carol"][..], "1: welcome"),
        (&["bob"][..], "1: welcome"),
        (&["alice", "bob"][..], "2: you were both invited"),
        (&["carol"][..], "2: your invoice"),
        (&["alice"][..], "3: reminder"),
    ];
    for (recipients, text) in notices {
        let mut tx = outbox.begin().await?;
        tx.publish(Notice {
            recipients: recipients.iter().map(|r| r.to_string()).collect(),
            text: text.to_owned(),
        })?;
        tx.commit().await?;
    }

    // alice and bob get everything while carol's first notice stalls her key.
    let (status, _) = subscription
        .wait_for(Duration::from_secs(10), |s| !s.stalled.is_empty())
        .await;
    for stalled in &status.stalled {
        println!(
            "stalled: key {:?} at {} after {} attempts: {}",
            stalled.key, stalled.position, stalled.attempts, stalled.error
        );
    }
    // Carol's mail server is fixed; the operator retries her key
    // (`ordo subscriptions retry-keys NAME carol` does the same).
    carol_fixed.store(true, AtomicOrdering::SeqCst);
    ordo::admin::retry_stalled_keys(&pool, &name, Some("carol")).await?;
    let (status, caught_up) = subscription
        .wait_for(Duration::from_secs(10), |s| {
            s.stalled.is_empty() && s.lag == 0
        })
        .await;
    println!(
        "caught up: {caught_up}, watermark at {} position {}",
        status.lane, status.position
    );

    let sent: Vec<(String, String)> =
        sqlx::query_as("SELECT recipient, text FROM keyed_example_sent ORDER BY id")
            .fetch_all(&pool)
            .await?;
    for recipient in ["alice", "bob", "carol"] {
        let theirs: Vec<&str> = sent
            .iter()
            .filter(|(r, _)| r == recipient)
            .map(|(_, text)| text.as_str())
            .collect();
        println!("{recipient:>6} received, in order: {}", theirs.join(" | "));
    }
    subscription.shutdown().await;
    ordo::admin::delete_subscription(&pool, &name, false).await?;
    outbox.shutdown().await;
    Ok(())
}
