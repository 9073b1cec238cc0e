//! Read-your-writes: waits keyed by what a writer holds (the sequences `commit()` returned),
//! answered from the database so they work in any process, woken early by this process's view
//! of the log head.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::{PgPool, Row};
use tokio::sync::watch;
use tokio::time::Instant;

use super::sql::{POSITIONS_OF, SUBSCRIPTION_PROGRESS};
use crate::error::{Error, Result};
use crate::insert_lane::rows::{to_i64, to_u64};
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
    let wanted: Vec<i64> = sequences.iter().map(|s| to_i64(s.get())).collect();
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    loop {
        let rows = sqlx::query(POSITIONS_OF)
            .bind(&wanted)
            .fetch_all(pool)
            .await?;
        let mut found = HashMap::with_capacity(rows.len());
        for row in &rows {
            found.insert(
                row.try_get::<i64, _>("sequence")?,
                to_u64(row.try_get("commit_seq")?),
            );
        }
        if wanted.iter().all(|s| found.contains_key(s)) {
            return Ok(wanted
                .iter()
                .map(|s| CommitSequence::new(found[s]))
                .collect());
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

/// Waits until subscription `name` has handled every one of `sequences` (checkpointed past
/// them on its lane).
pub(crate) async fn subscription_reached(
    pool: &PgPool,
    mut head: watch::Receiver<u64>,
    name: &str,
    sequences: &[EventSequence],
    limit: Duration,
) -> Result<()> {
    let deadline = Instant::now() + limit;
    let Some(highest) = sequences.iter().max().copied() else {
        return Ok(());
    };
    // On the commit lane the target is the highest commit position among the sequences.
    let mut target: Option<u64> = None;
    loop {
        let row = sqlx::query(SUBSCRIPTION_PROGRESS)
            .bind(name)
            .fetch_optional(pool)
            .await?
            .ok_or_else(|| Error::UnknownSubscription {
                name: name.to_owned(),
            })?;
        let lane: String = row.try_get("lane")?;
        let position = to_u64(row.try_get("position")?);
        let status: String = row.try_get("status")?;
        if lane == "commit" && target.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            let positions = commit_positions(pool, head.clone(), sequences, left).await?;
            target = positions.iter().map(|p| p.get()).max();
        }
        let goal = match lane.as_str() {
            "commit" => target.unwrap_or(0),
            _ => highest.get(),
        };
        if position >= goal {
            return Ok(());
        }
        if status != "active" {
            return Err(Error::SubscriptionNotRunning {
                name: name.to_owned(),
                status,
                last_error: row.try_get("last_error")?,
            });
        }
        if !sleep_or_wake(&mut head, deadline).await {
            return Err(Error::WaitTimedOut {
                what: format!(
                    "subscription {name:?} to pass position {goal} on the {lane} lane (it is at {position})"
                ),
                waited: limit,
            });
        }
    }
}

/// Sleeps until the head moves, the poll interval passes, or the deadline; false at the deadline.
async fn sleep_or_wake(head: &mut watch::Receiver<u64>, deadline: Instant) -> bool {
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
