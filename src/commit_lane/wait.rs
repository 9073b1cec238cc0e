//! Read-your-writes on the commit lane: a wait keyed by what a writer holds (the sequences
//! `commit()` returned), answered from the database so it works in any process, woken early by
//! this process's view of the log head. The wait for a subscription is in
//! `subscription::wait`.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::watch;
use tokio::time::Instant;

use super::sql::POSITIONS_OF;
use crate::error::{Error, Result};
use crate::position::{CommitSequence, EventSequence};

/// How often the database is asked when no head change wakes the wait first (the head of a
/// peer's appends reaches this process through its own sequencer or watcher).
const POLL: Duration = Duration::from_millis(50);

/// Waits until every one of `sequences` is in the commit log; their commit positions, in the
/// order given.
pub(crate) async fn commit_positions(
    pool: &PgPool,
    mut head: watch::Receiver<u64>,
    sequences: &[EventSequence],
    limit: Duration,
) -> Result<Vec<CommitSequence>> {
    let deadline = Instant::now() + limit;
    let wanted = sequences;
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    loop {
        let found: HashMap<EventSequence, CommitSequence> = sqlx::query_as(POSITIONS_OF)
            .bind(wanted)
            .fetch_all(pool)
            .await?
            .into_iter()
            .collect();
        if let Some(positions) = wanted.iter().map(|s| found.get(s).copied()).collect() {
            return Ok(positions);
        }
        if !sleep_or_wake(&mut head, deadline).await {
            return Err(Error::WaitTimedOut {
                what: format!(
                    "the commit lane to hold {} of {} sequences",
                    wanted.len() - found.len(),
                    wanted.len()
                ),
                waited: limit,
            });
        }
    }
}

/// Sleeps until the head moves, the poll interval passes, or the deadline; false at the deadline.
pub(crate) async fn sleep_or_wake(head: &mut watch::Receiver<u64>, deadline: Instant) -> bool {
    if Instant::now() >= deadline {
        return false;
    }
    let nap = (Instant::now() + POLL).min(deadline);
    tokio::select! {
        _ = head.changed() => {}
        _ = tokio::time::sleep_until(nap) => {}
    }
    true
}
