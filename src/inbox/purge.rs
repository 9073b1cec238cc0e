//! Forgetting completed messages: an explicit purge and an optional background task.

use std::time::Duration;

use sqlx::PgPool;

use super::sql;
use crate::error::Result;
use crate::task::Supervised;

/// Rows deleted per statement, so that a large backlog never holds locks or builds WAL in one
/// long transaction.
const BATCH: i64 = 10_000;

/// Deletes `consumer`'s completed rows older than `retention`, in batches; how many went.
pub(crate) async fn purge(pool: &PgPool, consumer: &str, retention: Duration) -> Result<u64> {
    let mut total = 0;
    loop {
        // Unnamed, in a transaction: it runs rarely, and so it runs through a
        // transaction-mode pooler too (see UNNAMED_ALONE in `watermark.rs`).
        let mut tx = pool.begin().await?;
        let deleted = sqlx::query(sql::PURGE)
            .persistent(false)
            .bind(consumer)
            .bind(retention.as_secs_f64() * 1000.0)
            .bind(BATCH)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        total += deleted;
        if deleted < BATCH as u64 {
            return Ok(total);
        }
    }
}

/// The background purge of one inbox consumer ([`Inbox::spawn_purge`](super::Inbox::spawn_purge)).
/// It stops on [`shutdown`](Self::shutdown), or when dropped (after the batch in hand).
#[derive(Debug)]
pub struct InboxPurger {
    task: Supervised,
}

impl InboxPurger {
    pub(crate) fn spawn(
        pool: PgPool,
        consumer: String,
        retention: Duration,
        every: Duration,
    ) -> Self {
        let span = tracing::info_span!("ordo", task = "inbox-purge", consumer = %consumer);
        let task = Supervised::spawn("inbox-purge", span, move |mut stop| async move {
            loop {
                match purge(&pool, &consumer, retention).await {
                    Ok(0) => {}
                    Ok(purged) => tracing::debug!(purged, "inbox rows purged"),
                    // Retried at the next turn.
                    Err(error) => tracing::warn!(%error, "inbox purge failed"),
                }
                tokio::select! {
                    () = stop.stopped() => return,
                    () = tokio::time::sleep(every) => {}
                }
            }
        });
        Self { task }
    }

    /// Stops the task, waiting up to 10 seconds for the batch in hand.
    pub async fn shutdown(self) {
        self.task.stop(Duration::from_secs(10)).await;
    }
}

impl Drop for InboxPurger {
    fn drop(&mut self) {
        self.task.request_stop();
    }
}
