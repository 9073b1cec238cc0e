//! Operating subscriptions from outside their runners: list, pause, resume, reset, delete. The CLI's
//! `ordo subscriptions` is a thin layer over these.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::config::Ordering;
use crate::consumer::status::RunStatus;
use crate::error::{Error, Result};
use crate::position::Position;

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

/// Also forgets a keyed subscription's progress above the old position, and **hands the lease
/// over**: a live lease passes to the owner's handover id (`md5(owner || ':handover')`, see `sql::CLAIM`), which no runner
/// holds, until it expires. So the runner's next completion, mark, checkpoint or renewal fails
/// its fence (a keyed runner's and a relay's in-flight completions are fenced by the lease, not
/// the position) and it claims again from the new position, once its own work in hand has
/// ended: only the old owner may claim a handover id before it expires. Another process waits
/// for the lease to expire, so it never sends while the old owner may still have a batch in
/// flight. (Ending the lease instead let a standby claim at once, beside the old owner's
/// flights.)
const RESET: &str = r#"
WITH forgotten AS (
    DELETE FROM ordo.subscription_progress WHERE subscription = $1
), unrouted AS (
    -- A relay's route chains start over from what lies at or below the new position; a
    -- route last sent to above it is not known there (its next message says 0 came before).
    DELETE FROM ordo.relay_routes WHERE relay = $1 AND position > $2
), unbacklogged AS (
    -- Stuck keys' events above the new position are read again from the lane; those at or
    -- below it stay, and are taken back at the next claim (no stalled event holds them now).
    DELETE FROM ordo.key_backlogs WHERE subscription = $1 AND position > $2
)
UPDATE ordo.subscriptions
SET position = $2, attempts = 0, last_error = NULL,
    lease_owner = CASE WHEN lease_expires_at > now() THEN md5(lease_owner::text || ':handover')::uuid END,
    lease_expires_at = CASE WHEN lease_expires_at > now() THEN lease_expires_at END,
    updated_at = now()
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

/// [`SET_STATUS`]; false if there is no such subscription.
async fn store_status(pool: &PgPool, name: &str, status: RunStatus) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(SET_STATUS)
        .bind(name)
        .bind(status)
        .execute(pool)
        .await?;
    Ok(done.rows_affected() != 0)
}

/// [`LANE_FOR_UPDATE`]: the stored lane, as text (`None`: no such subscription).
async fn lane_for_update(tx: &mut PgConnection, name: &str) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(LANE_FOR_UPDATE)
        .bind(name)
        .fetch_optional(tx)
        .await
}

/// [`INSERT_HEAD`] or [`COMMIT_HEAD`]: the head of `lane` (the beginning when empty).
async fn head(tx: &mut PgConnection, lane: Ordering) -> Result<Position, sqlx::Error> {
    Ok(match lane {
        Ordering::Insert => Position::Insert(
            sqlx::query_scalar(INSERT_HEAD)
                .fetch_optional(tx)
                .await?
                .unwrap_or_default(),
        ),
        Ordering::Commit => Position::Commit(
            sqlx::query_scalar(COMMIT_HEAD)
                .fetch_optional(tx)
                .await?
                .unwrap_or_default(),
        ),
    })
}

/// [`RESET`].
async fn reset(tx: &mut PgConnection, name: &str, to: Position) -> Result<(), sqlx::Error> {
    sqlx::query(RESET).bind(name).bind(to).execute(tx).await?;
    Ok(())
}

/// [`DELETE`]: `None` for no such subscription, else whether it went and the lease that
/// refused it.
async fn delete(
    pool: &PgPool,
    name: &str,
    force: bool,
) -> Result<Option<(bool, Option<Uuid>, Option<DateTime<Utc>>)>, sqlx::Error> {
    sqlx::query_as(DELETE)
        .bind(name)
        .bind(force)
        .fetch_optional(pool)
        .await
}

/// Pauses a subscription: its runner stops after the event in hand and waits.
///
/// # Errors
/// [`Error::UnknownSubscription`] if there is no such subscription.
pub async fn pause_subscription(pool: &PgPool, name: &str) -> Result<()> {
    set_status(pool, name, RunStatus::Paused).await
}

/// Resumes a paused or halted subscription (or relay), clearing its attempts and last error; a
/// halted one tries its failing event again. One halted below the retention floor reads from
/// its position again, and halts again unless [`reset_subscription`] first moved it to the
/// floor (to the position before the floor its last error names).
///
/// # Errors
/// [`Error::UnknownSubscription`] if there is no such subscription.
pub async fn resume_subscription(pool: &PgPool, name: &str) -> Result<()> {
    set_status(pool, name, RunStatus::Active).await
}

/// Moves a subscription's position to `to`: everything at or below it counts as handled, so a
/// lower position replays and a higher one skips. A running runner notices at its next
/// checkpoint or renewal (the reset hands its lease over: only it may claim again before the
/// lease expires, once its work in hand has ended) and continues from `to`; no other process
/// takes over before the old owner's lease expires, so a relay's batch in flight never travels
/// beside a new owner's. A keyed
/// subscription's progress above the old position (finished, failing and stalled events) is
/// forgotten with it; of its stuck keys' backlogs, the events above `to` go (they are read
/// again from the lane) and those at or below it are taken back at the next claim.
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
    let Some(lane) = lane_for_update(&mut tx, name).await? else {
        return Err(Error::UnknownSubscription {
            name: name.to_owned(),
        });
    };
    let given = to.lane();
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
    let head = head(&mut tx, given).await?.get();
    if to.get() > head && !force {
        return Err(Error::PastHead {
            subscription: name.to_owned(),
            lane,
            to: to.get(),
            head,
            skipped: to.get() - head,
        });
    }
    reset(&mut tx, name, to).await?;
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
    match delete(pool, name, force).await? {
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

async fn set_status(pool: &PgPool, name: &str, status: RunStatus) -> Result<()> {
    if !store_status(pool, name, status).await? {
        return Err(Error::UnknownSubscription {
            name: name.to_owned(),
        });
    }
    Ok(())
}
