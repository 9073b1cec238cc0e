//! Watermark mode: one row per (consumer, source) in `ordo.inbox_watermarks`, for messages that
//! carry a dense position (another ordo's commit lane, relayed).
//!
//! One attempt: `BEGIN`; the source's mark is locked `FOR UPDATE NOWAIT` (locked by another
//! receiver: [`Receipt::Busy`] at once); position ≤ mark: [`Receipt::Duplicate`]; position >
//! mark + 1: [`Receipt::Gap`] (refused; nothing is held back for later, so the transport
//! must redeliver in order); position = mark + 1: the mark moves to it, the handler runs, and
//! both commit together. A failed attempt is recorded on the mark's row after the rollback,
//! through another pooled connection (the handler's is free again by then); at the maximum the
//! message is copied to `ordo.inbox` as `failed` and the mark moves past it, so the source is
//! not stuck behind it: a replay of it then runs out of order.

use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use sqlx::{PgPool, Postgres, Transaction};

use super::config::InboxConfig;
use super::handler::InboxHandler;
use super::message::{InboxMessage, Receipt};
use super::rows::{count, position_column};
use super::sql;
use crate::error::{Error, Result};
use crate::telemetry::printable;

/// SQLSTATE `lock_not_available`: `NOWAIT` found the row locked.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// Receives `message` in watermark mode (see the module docs).
pub(crate) async fn receive<H: InboxHandler>(
    pool: &PgPool,
    config: &InboxConfig,
    message: &InboxMessage,
    handler: &H,
) -> Result<Receipt> {
    let (Some(source), Some(position)) = (message.source.as_deref(), message.position) else {
        return Err(Error::InvalidInboxMessage {
            consumer: config.consumer.clone(),
            id: message.id.clone(),
            reason:
                "watermark mode needs the message's source and position (InboxMessage::with_source)"
                    .to_owned(),
        });
    };
    let consumer = config.consumer.as_str();
    let Some((mut tx, mark)) = begin_at_mark(pool, consumer, source).await? else {
        return Ok(Receipt::Busy);
    };
    if position <= mark {
        tx.rollback().await?;
        return Ok(Receipt::Duplicate);
    }
    if position > mark + 1 {
        note_gap(tx, consumer, source, mark + 1, position).await?;
        return Ok(Receipt::Gap { expected: mark + 1 });
    }
    sqlx::query(sql::ADVANCE)
        .bind(consumer)
        .bind(source)
        .bind(position_column(position))
        .execute(&mut *tx)
        .await?;
    let handled = AssertUnwindSafe(handler.handle(&mut tx, message))
        .catch_unwind()
        .await;
    let error = match handled {
        // A COMMIT refused fails the attempt like a handler error; one whose answer was lost
        // and that took effect moved the mark, which the failure record sees.
        Ok(Ok(())) => match tx.commit().await {
            Ok(()) => return Ok(Receipt::Handled),
            Err(error) => {
                let error = Error::from(error);
                let error = format!("the handler's transaction did not commit: {error}");
                return record_failure(pool, config, message, source, position, error).await;
            }
        },
        Ok(Err(error)) => crate::error::failure_text(&*error),
        Err(_) => "the handler panicked".to_owned(),
    };
    let _ = tx.rollback().await;
    tracing::warn!(consumer, source, position, %error, "inbox handler failed");
    record_failure(pool, config, message, source, position, error).await
}

/// Records on the mark's row (locked in `tx`) that `position` was refused as a gap, and logs
/// the wait: when it starts, then at most once a minute across every receiver. A position
/// that never comes (a relay moved past it, its event dropped) leaves the inbox waiting for
/// ever: the log and `ordo inbox watermarks` say so, and `ordo inbox set-watermark` ends it.
async fn note_gap(
    mut tx: Transaction<'static, Postgres>,
    consumer: &str,
    source: &str,
    expected: u64,
    position: u64,
) -> Result<()> {
    let noted: Option<(chrono::DateTime<chrono::Utc>, bool)> = sqlx::query_as(sql::NOTE_GAP)
        .bind(consumer)
        .bind(source)
        .bind(position_column(position))
        .fetch_optional(&mut *tx)
        .await?;
    tx.commit().await?;
    if let Some((since, true)) = noted {
        tracing::warn!(
            consumer = %printable(consumer),
            source = %printable(source),
            expected,
            received = position,
            since = %since.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "inbox waits on a gap: position {expected} from this source has not arrived, later \
             ones are refused (Gap) until it does; if it never will (the sender skipped it), \
             move the mark past it: ordo inbox set-watermark CONSUMER SOURCE POSITION"
        );
    }
    Ok(())
}

/// A transaction holding `source`'s mark locked, and the mark; `None` when another receiver
/// holds it. A source seen for the first time gets its row (mark 0) first.
async fn begin_at_mark(
    pool: &PgPool,
    consumer: &str,
    source: &str,
) -> Result<Option<(Transaction<'static, Postgres>, u64)>> {
    let mut tx = pool.begin().await?;
    match lock_mark(&mut tx, consumer, source).await? {
        Locked::Mark(mark) => return Ok(Some((tx, mark))),
        Locked::Busy => return Ok(None),
        Locked::Missing => tx.rollback().await?,
    }
    // Committed on its own: created inside the handler's transaction, a concurrent receiver's
    // insert of the same row would wait for that transaction to end.
    sqlx::query(sql::CREATE_MARK)
        .bind(consumer)
        .bind(source)
        .execute(pool)
        .await?;
    let mut tx = pool.begin().await?;
    match lock_mark(&mut tx, consumer, source).await? {
        Locked::Mark(mark) => Ok(Some((tx, mark))),
        // Deleted by hand meanwhile, or locked by a receiver that got there first.
        Locked::Busy | Locked::Missing => Ok(None),
    }
}

/// What locking a source's mark found.
enum Locked {
    Mark(u64),
    Busy,
    Missing,
}

async fn lock_mark(
    tx: &mut Transaction<'static, Postgres>,
    consumer: &str,
    source: &str,
) -> Result<Locked> {
    let locked = sqlx::query_scalar::<_, i64>(sql::MARK)
        .bind(consumer)
        .bind(source)
        .fetch_optional(&mut **tx)
        .await;
    match locked {
        Ok(Some(mark)) => Ok(Locked::Mark(u64::try_from(mark).unwrap_or(0))),
        Ok(None) => Ok(Locked::Missing),
        Err(error) if lock_not_available(&error) => Ok(Locked::Busy),
        Err(error) => Err(error.into()),
    }
}

fn lock_not_available(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|code| code == LOCK_NOT_AVAILABLE)
}

/// The failed attempt at mark + 1; at the maximum, the dead letter and the mark moved past it.
async fn record_failure(
    pool: &PgPool,
    config: &InboxConfig,
    message: &InboxMessage,
    source: &str,
    position: u64,
    error: String,
) -> Result<Receipt> {
    let consumer = config.consumer.as_str();
    let attempts: Option<i32> = sqlx::query_scalar(sql::MARK_FAILED)
        .bind(consumer)
        .bind(source)
        .bind(position_column(position))
        .bind(&error)
        .fetch_optional(pool)
        .await?;
    // No row: the mark moved meanwhile; another receiver handled the message.
    let Some(attempts) = attempts else {
        return Ok(Receipt::Duplicate);
    };
    let attempts = count(attempts);
    if attempts < config.max_attempts {
        return Ok(Receipt::Retry { attempts, error });
    }
    let moved = sqlx::query(sql::DEAD_LETTER)
        .bind(consumer)
        .bind(source)
        .bind(position_column(position))
        .bind(&error)
        .bind(&message.id)
        .bind(i32::try_from(attempts).unwrap_or(i32::MAX))
        .bind(&message.payload)
        .bind(sqlx::types::Json(&message.headers))
        .fetch_optional(pool)
        .await?;
    Ok(match moved {
        Some(_) => Receipt::Failed { attempts, error },
        None => Receipt::Duplicate,
    })
}
