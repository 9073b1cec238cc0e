//! Cross-process wake-ups, sending side.
//!
//! A `NOTIFY` inside every writing transaction would take PostgreSQL's cluster-wide notify lock
//! at each commit and serialise all committers. Instead, writers only bump a watch after their
//! commit; this task sends one `pg_notify` right away when the process has been quiet, then at
//! most one per `debounce`, each carrying the highest sequence committed so far.

use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::watch;

use super::sql;
use crate::position::EventSequence;
use crate::task::StopSignal;

pub(crate) async fn run(
    pool: PgPool,
    channel: String,
    debounce: Duration,
    instance: u64,
    mut committed: watch::Receiver<EventSequence>,
    mut stop: StopSignal,
) {
    let mut sent = *committed.borrow_and_update();
    loop {
        tokio::select! {
            biased;
            _ = stop.stopped() => return,
            changed = committed.changed() => if changed.is_err() { return },
        }
        let latest = *committed.borrow_and_update();
        if latest <= sent {
            continue;
        }
        match sql::notify(&pool, &channel, latest, instance).await {
            Ok(_) => sent = latest,
            // Listeners also resync on a timer: a lost wake-up costs latency, not events.
            Err(error) => tracing::warn!(%error, "sending a wake-up failed"),
        }
        tokio::select! {
            biased;
            _ = stop.stopped() => return,
            _ = tokio::time::sleep(debounce) => {}
        }
    }
}
