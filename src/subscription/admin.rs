//! Operating subscriptions from outside their runners: list, pause, resume, reset, delete. The CLI's
//! `ordo subscriptions` is a thin layer over these.

use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row};
use uuid::Uuid;

use super::config::Ordering;
use super::handle::Position;
use crate::error::{Error, Result};
use crate::insert_lane::rows::{to_i64, to_u64};

const LIST: &str = r#"
SELECT s.name, s.lane, s.position, s.status, s.attempts, s.last_error, s.lease_owner,
       s.lease_expires_at, s.updated_at,
       GREATEST(CASE s.lane
           WHEN 'commit' THEN (SELECT last_commit_seq FROM ordo.sequencer_state)
           ELSE coalesce((SELECT max(sequence) FROM ordo.events), 0)
       END - s.position, 0) AS lag
FROM ordo.subscriptions AS s
ORDER BY s.name
"#;

const SET_STATUS: &str = r#"
UPDATE ordo.subscriptions
SET status = $2,
    attempts = CASE WHEN $2 = 'active' THEN 0 ELSE attempts END,
    last_error = CASE WHEN $2 = 'active' THEN NULL ELSE last_error END,
    updated_at = now()
WHERE name = $1
"#;

/// The subscription's lane, locked for the reset (a concurrent checkpoint waits, then fails its
/// position fence).
const LANE_FOR_UPDATE: &str = "SELECT lane FROM ordo.subscriptions WHERE name = $1 FOR UPDATE";

/// The insert lane's head: the highest stored sequence, placeholders included.
const INSERT_HEAD: &str = "SELECT coalesce(max(sequence), 0) FROM ordo.events";

/// The commit lane's head: the rows in the log.
const COMMIT_HEAD: &str = "SELECT last_commit_seq FROM ordo.sequencer_state LIMIT 1";

const RESET: &str = r#"
UPDATE ordo.subscriptions
SET position = $2, attempts = 0, last_error = NULL, updated_at = now()
WHERE name = $1
"#;

/// Deletes unless a lease is live (or `$2`, force); one statement, so the lease it reports is
/// the one that refused the delete. No row: no such subscription.
const DELETE: &str = r#"
WITH target AS (
    SELECT name, lease_owner, lease_expires_at,
           ($2 OR lease_owner IS NULL OR lease_expires_at < now()) AS free
    FROM ordo.subscriptions WHERE name = $1
    FOR UPDATE
), gone AS (
    DELETE FROM ordo.subscriptions AS s USING target
    WHERE s.name = target.name AND target.free
)
SELECT free, lease_owner, lease_expires_at FROM target
"#;

/// One row of `ordo.subscriptions`, with its lag.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct SubscriptionRow {
    /// The subscription's name.
    pub name: String,
    /// `insert` or `commit`.
    pub lane: String,
    /// Everything at or below it has been handled.
    pub position: u64,
    /// Positions between `position` and the lane's head (for the insert lane, the highest
    /// stored sequence, placeholders included).
    pub lag: u64,
    /// `active`, `paused` or `halted`.
    pub status: String,
    /// Failed attempts on the current event.
    pub attempts: u32,
    /// The last handler error.
    pub last_error: Option<String>,
    /// The runner holding the lease, if any.
    pub lease_owner: Option<Uuid>,
    /// When that lease runs out.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// The row's last change.
    pub updated_at: DateTime<Utc>,
}

/// Every subscription, by name.
///
/// # Errors
/// [`Error::Database`] if the table cannot be read.
pub async fn list_subscriptions(pool: &PgPool) -> Result<Vec<SubscriptionRow>> {
    let rows = sqlx::query(LIST).fetch_all(pool).await?;
    rows.iter()
        .map(|row| {
            Ok(SubscriptionRow {
                name: row.try_get("name")?,
                lane: row.try_get("lane")?,
                position: to_u64(row.try_get("position")?),
                lag: to_u64(row.try_get("lag")?),
                status: row.try_get("status")?,
                attempts: u32::try_from(row.try_get::<i32, _>("attempts")?).unwrap_or(0),
                last_error: row.try_get("last_error")?,
                lease_owner: row.try_get("lease_owner")?,
                lease_expires_at: row.try_get("lease_expires_at")?,
                updated_at: row.try_get("updated_at")?,
            })
        })
        .collect()
}

/// Pauses a subscription: its runner stops after the event in hand and waits.
///
/// # Errors
/// [`Error::UnknownSubscription`] if there is no such subscription.
pub async fn pause_subscription(pool: &PgPool, name: &str) -> Result<()> {
    set_status(pool, name, "paused").await
}

/// Resumes a paused or halted subscription, clearing its attempts and last error; a halted
/// one tries its failing event again.
///
/// # Errors
/// [`Error::UnknownSubscription`] if there is no such subscription.
pub async fn resume_subscription(pool: &PgPool, name: &str) -> Result<()> {
    set_status(pool, name, "active").await
}

/// Moves a subscription's position to `to`: everything at or below it counts as handled, so a
/// lower position replays and a higher one skips. A running runner notices at its next
/// checkpoint or renewal (its checkpoint is fenced by the position) and continues from `to`.
///
/// `to` must be of the subscription's lane ([`Position::Insert`] with an
/// [`EventSequence`](crate::EventSequence), [`Position::Commit`] with a
/// [`CommitSequence`](crate::CommitSequence)). A target past the lane's head (insert lane: the
/// highest stored sequence; commit lane: `ordo.sequencer_state.last_commit_seq`) would skip
/// events not yet written, unseen; it is refused unless `force`.
///
/// # Errors
/// [`Error::UnknownSubscription`] if there is no such subscription;
/// [`Error::PositionLaneMismatch`] if `to` is of the other lane; [`Error::PastHead`] if `to` is
/// past the head and `force` is false; [`Error::Database`] if a statement fails.
pub async fn reset_subscription(
    pool: &PgPool,
    name: &str,
    to: Position,
    force: bool,
) -> Result<()> {
    let mut tx = pool.begin().await?;
    let lane: Option<String> = sqlx::query_scalar(LANE_FOR_UPDATE)
        .bind(name)
        .fetch_optional(&mut *tx)
        .await?;
    let Some(lane) = lane else {
        return Err(Error::UnknownSubscription {
            name: name.to_owned(),
        });
    };
    let (given, head_query) = match to {
        Position::Insert(_) => (Ordering::Insert, INSERT_HEAD),
        Position::Commit(_) => (Ordering::Commit, COMMIT_HEAD),
    };
    // The table's CHECK admits only the two lanes.
    let lane = Ordering::parse(&lane).unwrap_or(Ordering::Insert);
    if lane != given {
        let expected = match lane {
            Ordering::Commit => "Commit(CommitSequence)",
            Ordering::Insert => "Insert(EventSequence)",
        };
        return Err(Error::PositionLaneMismatch {
            subscription: name.to_owned(),
            lane,
            given,
            expected,
        });
    }
    let head: Option<i64> = sqlx::query_scalar(head_query)
        .fetch_optional(&mut *tx)
        .await?;
    let head = to_u64(head.unwrap_or(0));
    if to.get() > head && !force {
        return Err(Error::PastHead {
            subscription: name.to_owned(),
            lane,
            to: to.get(),
            head,
            skipped: to.get() - head,
        });
    }
    sqlx::query(RESET)
        .bind(name)
        .bind(to_i64(to.get()))
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Deletes a subscription's row (its dead letters stay until purged). A runner still running
/// under that name finds no row and stands by; starting it again creates a new row from its
/// [`StartFrom`](crate::StartFrom).
///
/// Refused while a runner holds a live lease, unless `force`.
///
/// # Errors
/// [`Error::UnknownSubscription`] if there is no such subscription;
/// [`Error::SubscriptionLeased`] if a live lease is held and `force` is false;
/// [`Error::Database`] if a statement fails.
pub async fn delete_subscription(pool: &PgPool, name: &str, force: bool) -> Result<()> {
    let target: Option<(bool, Option<Uuid>, Option<DateTime<Utc>>)> = sqlx::query_as(DELETE)
        .bind(name)
        .bind(force)
        .fetch_optional(pool)
        .await?;
    match target {
        None => Err(Error::UnknownSubscription {
            name: name.to_owned(),
        }),
        Some((true, _, _)) => Ok(()),
        Some((false, owner, expires_at)) => Err(Error::SubscriptionLeased {
            name: name.to_owned(),
            owner: owner.unwrap_or_default(),
            expires_at: expires_at.unwrap_or_default(),
        }),
    }
}

async fn set_status(pool: &PgPool, name: &str, status: &str) -> Result<()> {
    let done = sqlx::query(SET_STATUS)
        .bind(name)
        .bind(status)
        .execute(pool)
        .await?;
    if done.rows_affected() == 0 {
        return Err(Error::UnknownSubscription {
            name: name.to_owned(),
        });
    }
    Ok(())
}

impl SubscriptionRow {
    /// The row's lane as an [`Ordering`], if it is one ordo knows.
    pub fn ordering(&self) -> Option<Ordering> {
        Ordering::parse(&self.lane)
    }
}
