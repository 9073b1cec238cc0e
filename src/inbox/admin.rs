//! The operator's side of the inbox: failed messages, replays, watermarks. Pool-based, like
//! [`ordo::admin`](crate::admin): none needs a running [`Inbox`](super::Inbox).
//!
//! **What a replay means.** [`replay`] sets a `failed` message back to `pending` with its
//! attempts at zero; its payload stays stored. It then runs (once, with exactly-once effect
//! like any message) on whichever comes first: the consumer's next
//! [`Inbox::run_pending`](super::Inbox::run_pending), which runs stored payloads, or a
//! redelivery of the same id by the transport. A transport that was told the message was
//! settled ([`Receipt::Failed`](super::Receipt::Failed)) will not redeliver it, so a consumer
//! calls `run_pending` (at start-up and every so often) to pick replays up.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};

use super::rows::{count, position_column};
use super::sql;
use crate::envelope::Headers;
use crate::error::{Error, Result};

/// A message an inbox consumer gave up on (`failed` in `ordo.inbox`).
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct FailedMessage {
    /// The consumer.
    pub consumer: String,
    /// The message's id.
    pub id: String,
    /// Attempts made.
    pub attempts: u32,
    /// The last error.
    pub error: Option<String>,
    /// The payload as received.
    pub payload: Option<String>,
    /// The headers as received.
    pub headers: Option<Headers>,
    /// The sending ordo and the position there (watermark mode).
    pub source: Option<String>,
    /// The message's position at `source`.
    pub position: Option<i64>,
    /// When the message was first recorded.
    pub received_at: DateTime<Utc>,
    /// When it failed.
    pub failed_at: DateTime<Utc>,
}

impl FailedMessage {
    fn read(row: &PgRow) -> Result<Self, sqlx::Error> {
        let headers: Option<sqlx::types::Json<Headers>> = row.try_get("headers")?;
        Ok(Self {
            consumer: row.try_get("consumer")?,
            id: row.try_get("message_id")?,
            attempts: count(row.try_get("attempts")?),
            error: row.try_get("last_error")?,
            payload: row.try_get("payload")?,
            headers: headers.map(|json| json.0),
            source: row.try_get("source")?,
            position: row.try_get("position")?,
            received_at: row.try_get("received_at")?,
            failed_at: row.try_get("updated_at")?,
        })
    }
}

/// Failed messages, oldest failure first: of one consumer, or of all when `consumer` is
/// `None`.
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> ordo::Result<()> {
/// for failed in ordo::inbox::list_failed(&pool, Some("billing")).await? {
///     println!("{} failed {} times: {:?}", failed.id, failed.attempts, failed.error);
/// }
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::UnknownConsumer`] if `consumer` has no row in the inbox (in either mode);
/// [`Error::Database`] if `ordo.inbox` cannot be read.
pub async fn list_failed(pool: &PgPool, consumer: Option<&str>) -> Result<Vec<FailedMessage>> {
    let rows = sqlx::query(sql::LIST_FAILED)
        .bind(consumer)
        .fetch_all(pool)
        .await?;
    let failed: Vec<FailedMessage> = rows
        .iter()
        .map(FailedMessage::read)
        .collect::<Result<_, _>>()?;
    if failed.is_empty() {
        refuse_unknown_consumer(pool, consumer).await?;
    }
    Ok(failed)
}

/// Replays the failed message `id` (of `consumer`, or of every consumer that failed it when
/// `None`): see the module docs for when it runs. Returns how many rows were replayed.
///
/// # Errors
/// [`Error::UnknownInboxMessage`] if no such message is `failed`; [`Error::Database`] if the
/// update fails.
pub async fn replay(pool: &PgPool, consumer: Option<&str>, id: &str) -> Result<u64> {
    let replayed = sqlx::query(sql::REPLAY)
        .bind(Some(id))
        .bind(consumer)
        .execute(pool)
        .await?
        .rows_affected();
    if replayed == 0 {
        return Err(Error::UnknownInboxMessage {
            id: id.to_owned(),
            consumer: consumer.map(str::to_owned),
        });
    }
    Ok(replayed)
}

/// Replays every failed message of `consumer` (of every consumer when `None`); returns how
/// many.
///
/// # Errors
/// [`Error::UnknownConsumer`] if `consumer` has no row in the inbox (in either mode);
/// [`Error::Database`] if the update fails.
pub async fn replay_all(pool: &PgPool, consumer: Option<&str>) -> Result<u64> {
    let replayed = sqlx::query(sql::REPLAY)
        .bind(None::<&str>)
        .bind(consumer)
        .execute(pool)
        .await?
        .rows_affected();
    if replayed == 0 {
        refuse_unknown_consumer(pool, consumer).await?;
    }
    Ok(replayed)
}

/// One row of `ordo.inbox_watermarks`: how far a consumer has handled a source.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct Watermark {
    /// The consumer.
    pub consumer: String,
    /// The sending ordo.
    pub source: String,
    /// The sender's route the mark follows (`Ordo-Route`, see
    /// [`InboxMessage::route`](super::InboxMessage::route)); empty for a source with one route.
    pub route: String,
    /// The highest position handled (0: none yet).
    pub position: u64,
    /// The position failing now, if any (the next one of the source's route).
    pub failing_position: Option<i64>,
    /// Its failed attempts.
    pub attempts: u32,
    /// Its last error.
    pub last_error: Option<String>,
    /// When the row last changed.
    pub updated_at: DateTime<Utc>,
    /// The consumer waits on a gap: a message from beyond the next position came and was
    /// refused ([`Receipt::Gap`](super::Receipt::Gap)) since the mark last moved. `None` while
    /// messages come in order.
    pub gap: Option<WatermarkGap>,
    /// The sender's server history of the message that set the mark (`Ordo-History`), if
    /// it sends one.
    pub history: Option<u64>,
    /// The last rewind seen: the sender gave positions this consumer had handled again, on a
    /// newer server history (its database went back: a failover that lost its last
    /// transactions, a restore, a crash).
    pub rewind: Option<WatermarkRewind>,
}

/// Positions a watermark consumer had handled that the sender gave again on a newer server
/// history: the events it had there were lost when the sender's database went back (they are
/// not in it any more), and the new events at those positions were taken as new. See
/// [`Watermark::rewind`] and `docs/inbox.md`, "Rewinds upstream".
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct WatermarkRewind {
    /// The first position given again.
    pub from: u64,
    /// The mark when the rewind was seen: the last position given again.
    pub through: u64,
    /// The history those positions had (`None`: not known).
    pub lost_history: Option<u64>,
    /// When the consumer saw it.
    pub at: DateTime<Utc>,
}

/// A watermark consumer waiting on a position that has not arrived: see [`Watermark::gap`].
///
/// A sender that delivers in order fills a gap by itself once the missing message is
/// redelivered. One that never will (a relay moved past a parked event with `ordo
/// subscriptions reset`, the event dropped by retention) leaves the consumer waiting for ever;
/// [`set_watermark`] to the last position skipped ends the wait.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct WatermarkGap {
    /// The position the consumer waits for (the refused message's previous one on its route,
    /// or with none, the mark + 1).
    pub expected: u64,
    /// The highest position refused meanwhile.
    pub received: u64,
    /// When the first of those refusals was made.
    pub since: DateTime<Utc>,
}

/// The watermarks of one consumer, or of all when `consumer` is `None`.
///
/// # Errors
/// [`Error::UnknownConsumer`] if `consumer` has no row in the inbox (in either mode);
/// [`Error::Database`] if `ordo.inbox_watermarks` cannot be read.
pub async fn list_watermarks(pool: &PgPool, consumer: Option<&str>) -> Result<Vec<Watermark>> {
    let rows = sqlx::query(sql::LIST_MARKS)
        .bind(consumer)
        .fetch_all(pool)
        .await?;
    let read = |row: &PgRow| -> Result<Watermark, sqlx::Error> {
        Ok(Watermark {
            consumer: row.try_get("consumer")?,
            source: row.try_get("source")?,
            route: row.try_get("route")?,
            position: u64::try_from(row.try_get::<i64, _>("position")?).unwrap_or(0),
            failing_position: row.try_get("failing_position")?,
            attempts: count(row.try_get("attempts")?),
            last_error: row.try_get("last_error")?,
            updated_at: row.try_get("updated_at")?,
            gap: read_gap(row)?,
            history: row
                .try_get::<Option<i64>, _>("history")?
                .and_then(|history| u64::try_from(history).ok()),
            rewind: read_rewind(row)?,
        })
    };
    let marks: Vec<Watermark> = rows.iter().map(read).collect::<Result<_, _>>()?;
    if marks.is_empty() {
        refuse_unknown_consumer(pool, consumer).await?;
    }
    Ok(marks)
}

/// A mark's rewind columns, if it saw one.
fn read_rewind(row: &PgRow) -> Result<Option<WatermarkRewind>, sqlx::Error> {
    let at: Option<DateTime<Utc>> = row.try_get("rewound_at")?;
    let from: Option<i64> = row.try_get("rewound_from")?;
    let through: Option<i64> = row.try_get("rewound_through")?;
    let lost_history: Option<i64> = row.try_get("rewound_history")?;
    Ok(match (at, from, through) {
        (Some(at), Some(from), Some(through)) => Some(WatermarkRewind {
            from: u64::try_from(from).unwrap_or(0),
            through: u64::try_from(through).unwrap_or(0),
            lost_history: lost_history.and_then(|history| u64::try_from(history).ok()),
            at,
        }),
        _ => None,
    })
}

/// A mark's gap columns, if it waits on one.
fn read_gap(row: &PgRow) -> Result<Option<WatermarkGap>, sqlx::Error> {
    let position: i64 = row.try_get("position")?;
    let expected: Option<i64> = row.try_get("gap_expected")?;
    let received: Option<i64> = row.try_get("gap_position")?;
    let since: Option<DateTime<Utc>> = row.try_get("gap_since")?;
    Ok(received.zip(since).map(|(received, since)| WatermarkGap {
        expected: expected
            .and_then(|expected| u64::try_from(expected).ok())
            .unwrap_or_else(|| u64::try_from(position).unwrap_or(0) + 1),
        received: u64::try_from(received).unwrap_or(0),
        since,
    }))
}

/// Refuses a consumer name no row of either inbox table has: nothing could be listed or
/// replayed under it, so it is a typo or the wrong database.
async fn refuse_unknown_consumer(pool: &PgPool, consumer: Option<&str>) -> Result<()> {
    let Some(consumer) = consumer else {
        return Ok(());
    };
    let known: bool = sqlx::query_scalar(sql::KNOWN_CONSUMER)
        .bind(consumer)
        .fetch_one(pool)
        .await?;
    if known {
        return Ok(());
    }
    Err(Error::UnknownConsumer {
        consumer: consumer.to_owned(),
    })
}

/// Sets `consumer`'s mark for `source` (its one route: messages that name none) to
/// `position`: the next message it handles from there is the one after `position`. For a
/// consumer that joins a source whose history it does not need (the mark of a new source
/// starts at 0), or to handle a range again. Moving it back makes the messages above run
/// again when they are redelivered. A source whose messages name routes has a mark per route:
/// [`set_route_watermark`].
///
/// # Errors
/// [`Error::Database`] if the upsert fails (it waits while a receiver of that source is in
/// its handler's transaction).
pub async fn set_watermark(
    pool: &PgPool,
    consumer: &str,
    source: &str,
    position: u64,
) -> Result<()> {
    set_route_watermark(pool, consumer, source, "", position).await
}

/// [`set_watermark`] for the mark of `source`'s route `route` (`Ordo-Route`, as
/// [`list_watermarks`] shows it; `""`: the source's one route).
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> ordo::Result<()> {
/// // The consumer "billing" takes orders-db's subject orders.placed from position 500 on.
/// ordo::inbox::set_route_watermark(&pool, "billing", "orders-db", "orders.placed", 499).await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`set_watermark`].
pub async fn set_route_watermark(
    pool: &PgPool,
    consumer: &str,
    source: &str,
    route: &str,
    position: u64,
) -> Result<()> {
    sqlx::query(sql::SET_MARK)
        .bind(consumer)
        .bind(source)
        .bind(position_column(position))
        .bind(route)
        .execute(pool)
        .await?;
    Ok(())
}
