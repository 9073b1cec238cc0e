//! Read-your-writes through a subscription: wait until it has handled what a writer committed,
//! from any process (the stored position is the answer), woken early by this process's view of
//! the commit log head.

use std::time::Duration;

use sqlx::{PgPool, Row};
use tokio::sync::watch;
use tokio::time::Instant;

use super::config::Ordering;
use super::sql::PROGRESS;
use crate::commit_lane::wait::{commit_positions, sleep_or_wake};
use crate::consumer::status::RunStatus;
use crate::error::{Error, Result};
use crate::position::EventSequence;
use crate::position::{Position, read_lane};

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
    // On the commit lane the target is the highest commit position among the sequences, looked
    // up once they are all in the log.
    let mut goal: Option<Position> = None;
    loop {
        let row = sqlx::query(PROGRESS)
            .bind(name)
            .fetch_optional(pool)
            .await?
            .ok_or_else(|| Error::UnknownSubscription {
                name: name.to_owned(),
            })?;
        let lane = read_lane(&row, "lane")?;
        let position = Position::read(&row, "position", lane)?;
        let status: String = row.try_get("status")?;
        let target = match (goal, lane) {
            (Some(target), _) => target,
            (None, Ordering::Insert) => *goal.insert(Position::Insert(highest)),
            (None, Ordering::Commit) => {
                let left = deadline.saturating_duration_since(Instant::now());
                let positions = commit_positions(pool, head.clone(), sequences, left).await?;
                let top = positions.into_iter().max().unwrap_or_default();
                *goal.insert(Position::Commit(top))
            }
        };
        if position.get() >= target.get() {
            return Ok(());
        }
        if RunStatus::parse(&status) != Some(RunStatus::Active) {
            return Err(Error::SubscriptionNotRunning {
                name: name.to_owned(),
                status,
                last_error: row.try_get("last_error")?,
            });
        }
        if !sleep_or_wake(&mut head, deadline).await {
            return Err(Error::WaitTimedOut {
                what: format!(
                    "subscription {name:?} to pass position {target} on the {lane} lane (it is at {position})"
                ),
                waited: limit,
            });
        }
    }
}
