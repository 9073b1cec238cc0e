//! Dead letters: listing, retrying and purging them from outside the runners (the CLI's
//! `ordo dead-letters` is a thin layer over these), and the runner's side of a retry.
//!
//! **What a retry means.** [`retry_dead_letter`] only marks the row (`retry_requested_at`).
//! The runner holding the subscription's lease notices within a third of its lease and hands
//! the event to the subscriber again, once, in a transaction that also deletes the dead letter
//! and is fenced by the lease. The subscription's position does not move and no later event is
//! replayed. If the handler fails again, the dead letter stays with the new error, `attempts`
//! one higher and the request cleared; retry it again when the cause is fixed. A
//! [`Batch::Groups`] job gets the event through `handle_group`, alone (the rest of its group was
//! handled). A retry for a subscription that no runner is running (or that is paused or
//! halted) waits until one runs it, listed meanwhile with its `retry_requested_at`.
//!
//! Serial and keyed runners both make them ([`redeliver`]); a keyed one from a task beside its
//! handler tasks (`keyed/dead_letters.rs`). Either way the retried event is handled after the
//! events that followed it, and in a keyed subscription outside its keys' lanes: a retry is a
//! second chance, not a replay in order.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::FutureExt;
use serde::de::DeserializeOwned;
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};
use uuid::Uuid;

use super::config::{Batch, JobConfig, Ordering};
use super::delivery::Delivery;
use super::subscriber::Subscriber;
use crate::consumer::sql::attempts_read;
use crate::error::{Error, Result};
use crate::insert_lane::rows::decode_full;
use crate::position::EventSequence;
use crate::position::{Position, read_lane};
use crate::subscription::sql;

const LIST: &str = r#"
SELECT id, subscription, lane, position, sequence, event_id, payload, error, attempts, created_at,
       retry_requested_at
FROM ordo.dead_letters
WHERE $1::text IS NULL OR subscription = $1
ORDER BY id
"#;

const RETRY_ONE: &str = "UPDATE ordo.dead_letters SET retry_requested_at = now() WHERE id = $1";

const RETRY_ALL: &str =
    "UPDATE ordo.dead_letters SET retry_requested_at = now() WHERE subscription = $1";

/// `$1` NULL: every subscription. `$2`: age in milliseconds (0 purges all).
const PURGE: &str = r#"
DELETE FROM ordo.dead_letters
WHERE ($1::text IS NULL OR subscription = $1)
  AND created_at <= now() - make_interval(secs => $2::float8 / 1000)
"#;

/// Whether a name is a subscription's, or at least that of some dead letter (its row deleted).
const KNOWN: &str = r#"
SELECT EXISTS (SELECT 1 FROM ordo.subscriptions WHERE name = $1)
    OR EXISTS (SELECT 1 FROM ordo.dead_letters WHERE subscription = $1)
"#;

/// [`LIST`], decoded.
async fn list(pool: &PgPool, subscription: Option<&str>) -> Result<Vec<DeadLetter>, sqlx::Error> {
    let rows = sqlx::query(LIST).bind(subscription).fetch_all(pool).await?;
    rows.iter().map(DeadLetter::read).collect()
}

impl DeadLetter {
    fn read(row: &PgRow) -> Result<Self, sqlx::Error> {
        let lane = read_lane(row, "lane")?;
        Ok(Self {
            id: row.try_get("id")?,
            subscription: row.try_get("subscription")?,
            lane,
            position: Position::read(row, "position", lane)?,
            sequence: row.try_get("sequence")?,
            event_id: row.try_get("event_id")?,
            payload: row.try_get("payload")?,
            error: row.try_get("error")?,
            attempts: attempts_read(row.try_get("attempts")?),
            created_at: row.try_get("created_at")?,
            retry_requested_at: row.try_get("retry_requested_at")?,
        })
    }
}

/// [`PURGE`]; how many rows went.
async fn purge(
    pool: &PgPool,
    subscription: Option<&str>,
    older_than: Duration,
) -> Result<u64, sqlx::Error> {
    let done = sqlx::query(PURGE)
        .bind(subscription)
        .bind(older_than.as_secs_f64() * 1000.0)
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}

/// [`RETRY_ONE`]; 0 if there is no such row.
async fn request_retry(pool: &PgPool, id: i64) -> Result<u64, sqlx::Error> {
    let done = sqlx::query(RETRY_ONE).bind(id).execute(pool).await?;
    Ok(done.rows_affected())
}

/// [`RETRY_ALL`]; how many rows were marked.
async fn request_retries(pool: &PgPool, subscription: &str) -> Result<u64, sqlx::Error> {
    let done = sqlx::query(RETRY_ALL)
        .bind(subscription)
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}

/// One row of `ordo.dead_letters`: an event a subscription gave up on, with the last error.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The row's id.
    pub id: i64,
    /// The subscription that gave up.
    pub subscription: String,
    /// The lane `position` is in (printed `insert` or `commit`).
    pub lane: Ordering,
    /// The event's position in the subscription's lane.
    pub position: Position,
    /// The event's insert sequence (`ordo.events.sequence`).
    pub sequence: EventSequence,
    /// The event's id.
    pub event_id: Option<Uuid>,
    /// The payload as stored (it may not decode as the subscription's type).
    pub payload: Option<serde_json::Value>,
    /// The last error.
    pub error: String,
    /// Attempts made before giving up.
    pub attempts: u32,
    /// When the event was dead-lettered.
    pub created_at: DateTime<Utc>,
    /// When an operator asked for a retry that no runner has made yet: set while the retry is
    /// pending (`ordo dead-letters` shows `pending`); cleared when a retry fails (the row then
    /// has the new error), and the row goes when one succeeds.
    pub retry_requested_at: Option<DateTime<Utc>>,
}

/// Dead letters, oldest first: of one subscription, or of all when `subscription` is `None`.
///
/// # Errors
/// [`Error::UnknownSubscription`] if `subscription` names neither a subscription nor the
/// subscription of any dead letter (a typo lists nothing, silently, otherwise);
/// [`Error::Database`](crate::Error::Database) if the table cannot be read.
pub async fn list_dead_letters(
    pool: &PgPool,
    subscription: Option<&str>,
) -> Result<Vec<DeadLetter>> {
    let letters = list(pool, subscription).await?;
    if letters.is_empty() {
        refuse_unknown(pool, subscription).await?;
    }
    Ok(letters)
}

/// Refuses a subscription name that has no row and no dead letter: nothing could ever be
/// listed, retried or purged under it, so it is a typo or the wrong database.
async fn refuse_unknown(pool: &PgPool, subscription: Option<&str>) -> Result<()> {
    let Some(name) = subscription else {
        return Ok(());
    };
    let known: bool = sqlx::query_scalar(KNOWN).bind(name).fetch_one(pool).await?;
    if known {
        return Ok(());
    }
    Err(Error::UnknownSubscription {
        name: name.to_owned(),
    })
}

/// Deletes dead letters at least `older_than` old (`Duration::ZERO`: all of them), of one
/// subscription or of all when `subscription` is `None`. Returns how many went. The events
/// themselves stay in `ordo.events`.
///
/// # Errors
/// [`Error::UnknownSubscription`] if `subscription` names neither a subscription nor the
/// subscription of any dead letter; [`Error::Database`](crate::Error::Database) if the
/// delete fails.
pub async fn purge_dead_letters(
    pool: &PgPool,
    subscription: Option<&str>,
    older_than: Duration,
) -> Result<u64> {
    let purged = purge(pool, subscription, older_than).await?;
    if purged == 0 {
        refuse_unknown(pool, subscription).await?;
    }
    Ok(purged)
}

/// Asks the subscription's runner to hand dead letter `id`'s event to its handler again (see
/// the module docs for what a retry does).
///
/// # Errors
/// [`Error::UnknownDeadLetter`] if there is no such row; [`Error::Database`] if the update
/// fails.
pub async fn retry_dead_letter(pool: &PgPool, id: i64) -> Result<()> {
    if request_retry(pool, id).await? == 0 {
        return Err(Error::UnknownDeadLetter { id });
    }
    Ok(())
}

/// Asks for a retry of every dead letter of `subscription`; returns how many were marked.
///
/// # Errors
/// [`Error::UnknownSubscription`] if `subscription` names neither a subscription nor the
/// subscription of any dead letter; [`Error::Database`] if the update fails.
pub async fn retry_dead_letters(pool: &PgPool, subscription: &str) -> Result<u64> {
    let marked = request_retries(pool, subscription).await?;
    if marked == 0 {
        refuse_unknown(pool, Some(subscription)).await?;
    }
    Ok(marked)
}

/// The runner's side: makes every requested retry of `config.name`'s dead letters, one try
/// each, fenced by `owner`'s lease. Returns false if the lease was lost.
pub(crate) async fn redeliver<P, S>(
    pool: &PgPool,
    config: &JobConfig,
    owner: Uuid,
    subscriber: &S,
) -> Result<bool, sqlx::Error>
where
    P: DeserializeOwned + Send + Sync + 'static,
    S: Subscriber<P>,
{
    sql::refuse_orphan_retries(pool, &config.name).await?;
    let rows = sql::retries(pool, &config.name).await?;
    for row in &rows {
        let id: i64 = row.try_get("dead_letter")?;
        let outcome = match retried_delivery(row, config.ordering)? {
            Ok(delivery) => redeliver_one(pool, config, owner, subscriber, id, delivery).await?,
            Err(message) => Retried::Failed(message),
        };
        match outcome {
            Retried::Done => {
                tracing::info!(subscription = %config.name, dead_letter = id, "dead letter retried");
            }
            Retried::LeaseLost => return Ok(false),
            Retried::Gone => {
                tracing::info!(subscription = %config.name, dead_letter = id, "dead letter gone before its retry committed; its writes rolled back");
            }
            Retried::Failed(message) => {
                tracing::warn!(subscription = %config.name, dead_letter = id, %message, "dead letter retry failed");
                sql::retry_failed(pool, id, &message).await?;
            }
        }
    }
    Ok(true)
}

/// A retry's row as the delivery its handler gets, or why there is none to make (the event
/// does not decode, or the row holds no event).
fn retried_delivery<P>(
    row: &PgRow,
    lane: Ordering,
) -> Result<std::result::Result<Delivery<P>, String>, sqlx::Error>
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    let event = match decode_full::<P>(row) {
        Ok(slot) => match slot.item.into_event() {
            Some(Ok(event)) => event,
            Some(Err(undecodable)) => {
                return Ok(Err(format!(
                    "the payload of ordo.events sequence {} does not decode: {}",
                    slot.sequence, undecodable.error
                )));
            }
            None => {
                return Ok(Err(format!(
                    "ordo.events sequence {} holds no event",
                    slot.sequence
                )));
            }
        },
        Err(error) => return Ok(Err(error.to_string())),
    };
    let attempts = attempts_read(row.try_get("attempts")?);
    Ok(Ok(Delivery::new(event)
        .with_position(Position::read(row, "position", lane)?)
        .with_ends_group(row.try_get("group_last")?)
        .with_attempt(attempts.saturating_add(1))))
}

/// How one retry ended.
enum Retried {
    /// Handled; the dead letter is gone.
    Done,
    /// The handler failed (the message), or the event does not decode.
    Failed(String),
    /// Another runner holds the lease, or the subscription is no longer active: nothing was
    /// committed.
    LeaseLost,
    /// The dead letter went meanwhile (purged, or retried elsewhere): nothing was committed.
    Gone,
}

/// One try, in a transaction fenced by the lease.
async fn redeliver_one<P, S>(
    pool: &PgPool,
    config: &JobConfig,
    owner: Uuid,
    subscriber: &S,
    id: i64,
    event: Delivery<P>,
) -> Result<Retried, sqlx::Error>
where
    P: DeserializeOwned + Send + Sync + 'static,
    S: Subscriber<P>,
{
    let mut tx = pool.begin_with(sql::begin_bounded(config.lease)).await?;
    let handled = AssertUnwindSafe(async {
        if matches!(config.batch, Batch::Groups) {
            subscriber
                .handle_group(&mut tx, std::slice::from_ref(&event))
                .await
        } else {
            subscriber.handle(&mut tx, &event).await
        }
    })
    .catch_unwind()
    .await;
    let message = match handled {
        Ok(Ok(())) => None,
        Ok(Err(error)) => Some(crate::error::failure_text(&*error)),
        Err(_) => Some("the handler panicked".to_owned()),
    };
    if let Some(message) = message {
        let _ = tx.rollback().await;
        return Ok(Retried::Failed(message));
    }
    if !sql::retry_fence(&mut tx, &config.name, owner, config.lease).await? {
        let _ = tx.rollback().await;
        return Ok(Retried::LeaseLost);
    }
    if !sql::retry_done(&mut tx, id).await? {
        let _ = tx.rollback().await;
        return Ok(Retried::Gone);
    }
    tx.commit().await?;
    Ok(Retried::Done)
}
