//! Watermark mode: one row per (consumer, source) in `ordo.inbox_watermarks`, for messages that
//! carry a dense position (another ordo's commit lane, relayed).
//!
//! One attempt: `BEGIN`; the mark of the message's source and route is locked `FOR UPDATE
//! NOWAIT` (locked by another receiver: [`Receipt::Busy`] at once); position ≤ mark:
//! [`Receipt::Duplicate`]; a message whose predecessor on its route is not handled yet (its
//! `previous` above the mark; with no `previous`, a position past mark + 1): [`Receipt::Gap`]
//! (refused; nothing is held back for later, so the transport must redeliver in order);
//! otherwise the mark moves to it, the handler runs, and both commit together. A failed attempt is recorded on the mark's row after the rollback,
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
use crate::pooler::Statements;
use crate::position::ServerHistory;
use crate::telemetry::metrics::INBOX_REWOUND_POSITIONS;
use crate::telemetry::printable;

/// SQLSTATE `lock_not_available`: `NOWAIT` found the row locked.
mod gap;

use gap::note_gap;

const LOCK_NOT_AVAILABLE: &str = "55P03";

// UNNAMED_ALONE: sqlx runs an unnamed statement in two steps, each ended by a `Sync` (prepare
// and describe, then bind and run). Outside a transaction a transaction-mode pooler may hand
// the second step to another server connection, which has no such statement (`26000`). Inside
// one it keeps the same server connection, so every statement here runs inside a transaction.

/// Where a message belongs in watermark mode: its source, route (`""` for none) and position.
struct Place<'a> {
    source: &'a str,
    route: &'a str,
    position: u64,
}

/// Receives `message` in watermark mode (see the module docs).
pub(crate) async fn receive<H: InboxHandler>(
    pool: &PgPool,
    statements: Statements,
    config: &InboxConfig,
    message: &InboxMessage,
    handler: &H,
) -> Result<Receipt> {
    let place = place_of(config, message)?;
    let consumer = config.consumer.as_str();
    let Some((mut tx, mut mark)) = begin_at_mark(pool, statements, consumer, &place).await? else {
        return Ok(Receipt::Busy);
    };
    match (message.history, mark.history) {
        // A newer history that began at or below the mark: the sender gave those positions
        // again (it lost their events: a failover, a restore, a crash). The mark goes back
        // below them.
        (Some(history), Some(older))
            if history.id > older && history.first_position <= mark.position =>
        {
            mark = note_rewind(tx, consumer, &place, mark, history).await?;
            tx = match begin_at_mark(pool, statements, consumer, &place).await? {
                Some((tx, again)) if again == mark => tx,
                // Another receiver moved it meanwhile: this message is for another attempt.
                _ => return Ok(Receipt::Busy),
            };
        }
        // An older history above the mark: an event the sender lost, from positions a newer
        // history has given again.
        (Some(history), Some(newer)) if history.id < newer && place.position > mark.position => {
            tx.rollback().await?;
            tracing::warn!(
                consumer = %printable(consumer),
                source = %printable(place.source),
                route = %printable(place.route),
                position = place.position,
                history = history.id,
                mark_history = newer,
                id = %printable(&message.id),
                "inbox: a message from a server history the sender has left, above the mark: \
                 its event was lost when the sender's database went back, and its position \
                 belongs to a newer event; dropped as a duplicate"
            );
            return Ok(Receipt::Duplicate);
        }
        _ => {}
    }
    if place.position <= mark.position {
        tx.rollback().await?;
        return Ok(Receipt::Duplicate);
    }
    if let Some(expected) = missing_before(message, &mark) {
        note_gap(tx, consumer, &place, expected).await?;
        return Ok(Receipt::Gap { expected });
    }
    sqlx::query(sql::ADVANCE)
        .persistent(statements.persistent())
        .bind(consumer)
        .bind(place.source)
        .bind(position_column(place.position))
        .bind(message.history.map(|history| history_column(history.id)))
        .bind(place.route)
        .execute(&mut *tx)
        .await?;
    handle(pool, config, message, &place, tx, handler).await
}

/// The message's source, route and position, or why watermark mode cannot take it.
fn place_of<'a>(config: &InboxConfig, message: &'a InboxMessage) -> Result<Place<'a>> {
    let refuse = |reason: String| Error::InvalidInboxMessage {
        consumer: config.consumer.clone(),
        id: message.id.clone(),
        reason,
    };
    let (Some(source), Some(position)) = (message.source.as_deref(), message.position) else {
        return Err(refuse(
            "watermark mode needs the message's source and position (InboxMessage::with_source)"
                .to_owned(),
        ));
    };
    if let Some(history) = message.history
        && !(1..=position).contains(&history.first_position)
    {
        return Err(refuse(format!(
            "its server history begins at position {}, which is not between 1 and its \
             position {position}",
            history.first_position
        )));
    }
    Ok(Place {
        source,
        route: message.route.as_deref().unwrap_or(""),
        position,
    })
}

/// The position that must arrive before `message` (above the mark), if one must: the
/// message's previous position on its route when it names one (nothing of the route lies
/// between it and the message, so a mark at or above it lets the message in), else the next
/// dense position. Inside a rewound range, positions the newer history gave to events this
/// inbox already handled may never come (a broker that deduplicates by message id, JetStream,
/// drops them): there, the next position that comes is taken.
fn missing_before(message: &InboxMessage, mark: &Mark) -> Option<u64> {
    let position = message.position.unwrap_or(0);
    let in_rewound_range = mark
        .rewound_through
        .is_some_and(|through| position <= through)
        && message
            .history
            .is_some_and(|history| Some(history.id) == mark.history);
    if in_rewound_range {
        return None;
    }
    match message.previous {
        Some(previous) => (previous > mark.position).then_some(previous),
        None => (position > mark.position + 1).then_some(mark.position + 1),
    }
}

/// Runs the handler in `tx`, which holds the mark moved to the message: committed together,
/// or the failure recorded.
async fn handle<H: InboxHandler>(
    pool: &PgPool,
    config: &InboxConfig,
    message: &InboxMessage,
    place: &Place<'_>,
    mut tx: Transaction<'static, Postgres>,
    handler: &H,
) -> Result<Receipt> {
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
                return record_failure(pool, config, message, place, error).await;
            }
        },
        Ok(Err(error)) => crate::error::failure_text(&*error),
        Err(_) => "the handler panicked".to_owned(),
    };
    let _ = tx.rollback().await;
    tracing::warn!(
        consumer = %printable(&config.consumer),
        source = %printable(place.source),
        route = %printable(place.route),
        position = place.position,
        error = %printable(&error),
        "inbox handler failed"
    );
    record_failure(pool, config, message, place, error).await
}

/// Records a rewind on the mark's row (locked in `tx`) and commits: the positions from where
/// `newer` began to the mark were given again by the sender, whose events there are gone. Logs
/// it, counts the positions, and returns the mark moved back below them.
async fn note_rewind(
    mut tx: Transaction<'static, Postgres>,
    consumer: &str,
    place: &Place<'_>,
    mark: Mark,
    newer: ServerHistory,
) -> Result<Mark> {
    let from = newer.first_position;
    sqlx::query(sql::NOTE_REWIND)
        .persistent(false)
        .bind(consumer)
        .bind(place.source)
        .bind(position_column(from))
        .bind(position_column(mark.position))
        .bind(mark.history.map(history_column))
        .bind(history_column(newer.id))
        .bind(place.route)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    let positions = mark.position - from + 1;
    metrics::counter!(
        INBOX_REWOUND_POSITIONS,
        "consumer" => consumer.to_owned(),
        "source" => printable(place.source).to_string()
    )
    .increment(positions);
    tracing::error!(
        consumer = %printable(consumer),
        source = %printable(place.source),
        route = %printable(place.route),
        lost_from = from,
        lost_through = mark.position,
        lost_history = mark.history,
        history = newer.id,
        "inbox: the sender's positions went back: positions {from} to {} of its server history \
         {} are not in its database any more (lost when its database went back: a failover to \
         a standby that had not received them, a restore, a crash); this inbox handled them \
         before. History {} gives these positions to new events, which are taken as new. ordo \
         inbox watermarks shows the rewind",
        mark.position,
        mark.history.unwrap_or(0),
        newer.id
    );
    Ok(Mark {
        position: from - 1,
        history: Some(newer.id),
        rewound_through: Some(mark.position),
    })
}

/// A source's mark as locked: its position, the server history that set it, and the end of
/// the last rewound range (see [`note_rewind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mark {
    position: u64,
    history: Option<u64>,
    rewound_through: Option<u64>,
}

/// A history id as the table stores it (`BIGINT`).
fn history_column(history: u64) -> i64 {
    i64::try_from(history).unwrap_or(i64::MAX)
}

/// A transaction holding the mark of the place's source and route locked, and the mark;
/// `None` when another receiver holds it. A route seen for the first time gets its row
/// (mark 0) first.
async fn begin_at_mark(
    pool: &PgPool,
    statements: Statements,
    consumer: &str,
    place: &Place<'_>,
) -> Result<Option<(Transaction<'static, Postgres>, Mark)>> {
    let mut tx = pool.begin().await?;
    match lock_mark(&mut tx, statements, consumer, place).await? {
        Locked::Mark(mark) => return Ok(Some((tx, mark))),
        Locked::Busy => return Ok(None),
        Locked::Missing => tx.rollback().await?,
    }
    // Committed on its own: created inside the handler's transaction, a concurrent receiver's
    // insert of the same row would wait for that transaction to end. Rare statements are
    // unnamed and inside a transaction, so that they run through a transaction-mode pooler
    // (see `UNNAMED_ALONE`).
    let mut create = pool.begin().await?;
    sqlx::query(sql::CREATE_MARK)
        .persistent(false)
        .bind(consumer)
        .bind(place.source)
        .bind(place.route)
        .execute(&mut *create)
        .await?;
    create.commit().await?;
    let mut tx = pool.begin().await?;
    match lock_mark(&mut tx, statements, consumer, place).await? {
        Locked::Mark(mark) => Ok(Some((tx, mark))),
        // Deleted by hand meanwhile, or locked by a receiver that got there first.
        Locked::Busy | Locked::Missing => Ok(None),
    }
}

/// What locking a source's mark found.
enum Locked {
    Mark(Mark),
    Busy,
    Missing,
}

async fn lock_mark(
    tx: &mut Transaction<'static, Postgres>,
    statements: Statements,
    consumer: &str,
    place: &Place<'_>,
) -> Result<Locked> {
    let locked = sqlx::query_as::<_, (i64, Option<i64>, Option<i64>)>(sql::MARK)
        .persistent(statements.persistent())
        .bind(consumer)
        .bind(place.source)
        .bind(place.route)
        .fetch_optional(&mut **tx)
        .await;
    match locked {
        Ok(Some((position, history, rewound_through))) => Ok(Locked::Mark(Mark {
            position: u64::try_from(position).unwrap_or(0),
            history: history.and_then(|history| u64::try_from(history).ok()),
            rewound_through: rewound_through.and_then(|through| u64::try_from(through).ok()),
        })),
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

/// The failed attempt at the message's position (the next one of its route); at the maximum,
/// the dead letter and the mark moved past it.
async fn record_failure(
    pool: &PgPool,
    config: &InboxConfig,
    message: &InboxMessage,
    place: &Place<'_>,
    error: String,
) -> Result<Receipt> {
    let (source, position) = (place.source, place.position);
    let consumer = config.consumer.as_str();
    let mut failed = pool.begin().await?;
    let attempts: Option<i32> = sqlx::query_scalar(sql::MARK_FAILED)
        .persistent(false)
        .bind(consumer)
        .bind(source)
        .bind(position_column(position))
        .bind(&error)
        .bind(place.route)
        .fetch_optional(&mut *failed)
        .await?;
    failed.commit().await?;
    // No row: the mark moved meanwhile; another receiver handled the message.
    let Some(attempts) = attempts else {
        return Ok(Receipt::Duplicate);
    };
    let attempts = count(attempts);
    if attempts < config.max_attempts {
        return Ok(Receipt::Retry { attempts, error });
    }
    let mut dead = pool.begin().await?;
    let moved = sqlx::query(sql::DEAD_LETTER)
        .persistent(false)
        .bind(consumer)
        .bind(source)
        .bind(position_column(position))
        .bind(&error)
        .bind(&message.id)
        .bind(i32::try_from(attempts).unwrap_or(i32::MAX))
        .bind(&message.payload)
        .bind(sqlx::types::Json(&message.headers))
        .bind(place.route)
        .fetch_optional(&mut *dead)
        .await?;
    dead.commit().await?;
    Ok(match moved {
        Some(_) => Receipt::Failed { attempts, error },
        None => Receipt::Duplicate,
    })
}
