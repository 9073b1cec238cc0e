//! Operating subscriptions from outside their runners: list, pause, resume, reset. The CLI's
//! `ordo subscriptions` is a thin layer over these.

use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row};
use uuid::Uuid;

use super::config::Ordering;
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

const RESET: &str = r#"
UPDATE ordo.subscriptions
SET position = $2, attempts = 0, last_error = NULL, updated_at = now()
WHERE name = $1
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

/// Moves a subscription's position to `to` (replay, or skip ahead). A running runner notices
/// at its next checkpoint or renewal (its checkpoint is fenced by the position) and continues
/// from `to`.
///
/// # Errors
/// [`Error::UnknownSubscription`] if there is no such subscription.
pub async fn reset_subscription(pool: &PgPool, name: &str, to: u64) -> Result<()> {
    let done = sqlx::query(RESET)
        .bind(name)
        .bind(to_i64(to))
        .execute(pool)
        .await?;
    if done.rows_affected() == 0 {
        return Err(Error::UnknownSubscription {
            name: name.to_owned(),
        });
    }
    Ok(())
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
