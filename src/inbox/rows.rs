//! Row-per-message mode: a message's row in `ordo.inbox`, claimed under a session advisory
//! lock, completed in the handler's transaction.
//!
//! One attempt, on one pooled connection:
//! 1. `pg_try_advisory_lock(hash(consumer, id))`: taken, or [`Receipt::Busy`] at once.
//! 2. The claim, committed on its own: the row becomes `processing`. A row already
//!    `completed` or `failed` is answered without running anything. A row found `processing`
//!    while we hold the lock is an attempt that died: it is counted. Steps 1 and 2 are one
//!    statement ([`sql::LOCK_AND_CLAIM`]).
//! 3. `BEGIN`; the row is set `completed` ([`sql::COMPLETE`]); the handler runs; `COMMIT`.
//!    The record and the handler's effects commit together or not at all.
//! 4. On a handler error: `ROLLBACK`, then the attempt, error and payload are written in a
//!    transaction of their own ([`sql::FAIL`]), still under the lock, so no other receiver
//!    runs the message between the rollback and the record. If this connection is broken,
//!    through another one from the pool.
//! 5. The lock is released. A connection whose lock could not be released (a cancelled
//!    future, a lost connection) is closed instead of returned to the pool, which releases it.
//!
//! Why a session lock and not a transaction lock: the claim commits before the handler's
//! transaction begins, and both must be covered. Why the same connection for the failure
//! record: the handler's transaction is over by then (its rollback is what must not take the
//! count with it), and asking the pool for a second connection while holding one could
//! deadlock a pool whose every connection is held by a receiver waiting the same way.

use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgPool, Postgres, Row};

use super::config::InboxConfig;
use super::handler::InboxHandler;
use super::message::{InboxMessage, Receipt};
use super::sql;
use crate::error::Result;

/// A pooled connection holding (or trying to take) a message's advisory lock.
struct Held {
    conn: PoolConnection<Postgres>,
    /// True once the lock is known not to be held: never taken, or released.
    free: bool,
}

impl Held {
    /// Takes the lock on `message` and claims it: `None` when another session holds the lock;
    /// otherwise the claimed row's attempts so far, or `None` if it is not claimable.
    async fn take(
        pool: &PgPool,
        consumer: &str,
        message: &InboxMessage,
    ) -> Result<Option<(Held, Option<i32>)>> {
        let conn = pool.acquire().await?;
        let mut held = Held { conn, free: false };
        let (locked, attempts): (bool, Option<i32>) = sqlx::query_as(sql::LOCK_AND_CLAIM)
            .bind(consumer)
            .bind(&message.id)
            .bind(message.source.as_deref())
            .bind(message.position.map(position_column))
            .bind(sql::ABANDONED)
            .fetch_one(&mut *held.conn)
            .await?;
        if !locked {
            held.free = true;
            return Ok(None);
        }
        Ok(Some((held, attempts)))
    }

    /// Releases the lock; if that fails, the connection is closed on drop (which releases it).
    async fn release(mut self, consumer: &str, id: &str) {
        let released = sqlx::query_scalar::<_, bool>(sql::UNLOCK)
            .bind(consumer)
            .bind(id)
            .fetch_one(&mut *self.conn)
            .await;
        self.free = matches!(released, Ok(true));
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.free {
            // A session lock outlives a cancelled future: never hand it back to the pool.
            self.conn.close_on_drop();
        }
    }
}

/// Receives `message` in row-per-message mode (see the module docs).
pub(crate) async fn receive<H: InboxHandler>(
    pool: &PgPool,
    config: &InboxConfig,
    message: &InboxMessage,
    handler: &H,
) -> Result<Receipt> {
    let consumer = config.consumer.as_str();
    let Some((mut held, claimed)) = Held::take(pool, consumer, message).await? else {
        return Ok(Receipt::Busy);
    };
    let receipt = attempt(pool, &mut held, claimed, config, message, handler).await;
    held.release(consumer, &message.id).await;
    receipt
}

/// Steps 3 and 4, under the lock, for a message claimed with `claimed` attempts so far (none:
/// not claimable).
async fn attempt<H: InboxHandler>(
    pool: &PgPool,
    held: &mut Held,
    claimed: Option<i32>,
    config: &InboxConfig,
    message: &InboxMessage,
    handler: &H,
) -> Result<Receipt> {
    let consumer = config.consumer.as_str();
    let Some(attempts) = claimed else {
        return settled(&mut held.conn, consumer, &message.id).await;
    };
    let attempts = count(attempts);
    if attempts >= config.max_attempts {
        give_up(&mut held.conn, consumer, message).await?;
        return Ok(Receipt::Failed {
            attempts,
            error: sql::ABANDONED.to_owned(),
        });
    }
    match run(&mut held.conn, consumer, message, handler).await? {
        Ran::Committed => Ok(Receipt::Handled),
        // The claim was taken from us: whoever took it answers for the message.
        Ran::Taken => Ok(Receipt::Busy),
        Ran::Failed(error) => {
            tracing::warn!(consumer, message = %message.id, %error, "inbox handler failed");
            record_failure(pool, held, config, message, error).await
        }
    }
}

/// How the handler's transaction ended.
enum Ran {
    Committed,
    Taken,
    Failed(String),
}

/// Step 3: the record, the handler and the commit, in one transaction.
async fn run<H: InboxHandler>(
    conn: &mut PoolConnection<Postgres>,
    consumer: &str,
    message: &InboxMessage,
    handler: &H,
) -> Result<Ran> {
    let mut tx = conn.begin().await?;
    let recorded = sqlx::query(sql::COMPLETE)
        .bind(consumer)
        .bind(&message.id)
        .execute(&mut *tx)
        .await?;
    if recorded.rows_affected() == 0 {
        tx.rollback().await?;
        return Ok(Ran::Taken);
    }
    let handled = AssertUnwindSafe(handler.handle(&mut tx, message))
        .catch_unwind()
        .await;
    let error = match handled {
        // A COMMIT refused (a deferred constraint, a serialization failure) fails the attempt
        // like a handler error. One whose answer was lost may have committed: the failure
        // record then finds the row completed and says so.
        Ok(Ok(())) => match tx.commit().await {
            Ok(()) => return Ok(Ran::Committed),
            Err(error) => {
                return Ok(Ran::Failed(format!(
                    "the handler's transaction did not commit: {}",
                    crate::error::Error::from(error)
                )));
            }
        },
        Ok(Err(error)) => crate::error::failure_text(&*error),
        Err(_) => "the handler panicked".to_owned(),
    };
    // A failed rollback means a broken connection, which rolls back as well.
    let _ = tx.rollback().await;
    Ok(Ran::Failed(error))
}

/// Step 4: the failed attempt, in a transaction of its own; through the pool if this
/// connection is broken.
async fn record_failure(
    pool: &PgPool,
    held: &mut Held,
    config: &InboxConfig,
    message: &InboxMessage,
    error: String,
) -> Result<Receipt> {
    let fail = || {
        sqlx::query(sql::FAIL)
            .bind(&config.consumer)
            .bind(&message.id)
            .bind(&error)
            .bind(i32::try_from(config.max_attempts).unwrap_or(i32::MAX))
            .bind(&message.payload)
            .bind(sqlx::types::Json(&message.headers))
            .bind(message.source.as_deref())
            .bind(message.position.map(position_column))
    };
    let row = match fail().fetch_optional(&mut *held.conn).await {
        Ok(row) => row,
        Err(_) => {
            // This connection is broken (its lock went with it): through another one.
            let row = fail().fetch_optional(pool).await?;
            if row.is_none() {
                let mut conn = pool.acquire().await?;
                return settled(&mut conn, &config.consumer, &message.id).await;
            }
            row
        }
    };
    let Some(row) = row else {
        // Not claimable any more: a commit whose answer was lost took effect, or a receiver
        // that found our connection dead got there first.
        return settled(&mut held.conn, &config.consumer, &message.id).await;
    };
    let status: String = row.try_get("status")?;
    let attempts = count(row.try_get("attempts")?);
    Ok(if status == "failed" {
        Receipt::Failed { attempts, error }
    } else {
        Receipt::Retry { attempts, error }
    })
}

/// Attempts that died reached the maximum: the message is `failed` with its payload.
async fn give_up(
    conn: &mut PoolConnection<Postgres>,
    consumer: &str,
    message: &InboxMessage,
) -> Result<()> {
    sqlx::query(sql::GIVE_UP)
        .bind(consumer)
        .bind(&message.id)
        .bind(&message.payload)
        .bind(sqlx::types::Json(&message.headers))
        .execute(&mut **conn)
        .await?;
    Ok(())
}

/// The answer for a message that could not be claimed: its row is not claimable.
async fn settled(conn: &mut PoolConnection<Postgres>, consumer: &str, id: &str) -> Result<Receipt> {
    let row = sqlx::query(sql::READ)
        .bind(consumer)
        .bind(id)
        .fetch_optional(&mut **conn)
        .await?;
    let Some(row) = row else {
        return Ok(Receipt::Busy);
    };
    let status: String = row.try_get("status")?;
    Ok(match status.as_str() {
        "completed" => Receipt::Duplicate,
        "failed" => Receipt::Failed {
            attempts: count(row.try_get("attempts")?),
            error: row
                .try_get::<Option<String>, _>("last_error")?
                .unwrap_or_default(),
        },
        _ => Receipt::Busy,
    })
}

/// A stored attempt count (never negative: a CHECK) as a `u32`.
pub(crate) fn count(attempts: i32) -> u32 {
    u32::try_from(attempts).unwrap_or(0)
}

/// A position as its `BIGINT` column (checked to fit by [`InboxMessage::check`]).
pub(crate) fn position_column(position: u64) -> i64 {
    i64::try_from(position).unwrap_or(i64::MAX)
}
