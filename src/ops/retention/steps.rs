//! The changes retention makes, one partition pair per short transaction.
//!
//! Each step takes a pooled connection, opens a transaction, sets a short lock timeout, takes
//! the advisory lock that serialises retention across processes, re-reads what it decides on
//! (another run may have acted since the plan), makes one change and commits. Writers then
//! wait at most for one step, never for a whole run. A step that meets a lock it cannot have at
//! once gives way, and is tried again after a pause, for a bounded time.

use std::time::Duration;

use sqlx::{Acquire, PgConnection, PgPool};
use tokio::time::Instant;

use super::plan::{self, PAST_RETENTION};
use super::sql;
use super::{PartitionInfo, RetentionConfig};
use crate::error::{Error, Result};
use crate::position::EventSequence;

/// lock_not_available: the step's lock timeout expired.
const LOCK_NOT_AVAILABLE: &str = "55P03";
/// deadlock_detected: a reader locked the log before the events while a step locked the events.
const DEADLOCK_DETECTED: &str = "40P01";
/// check_violation: a row landed in the default partition, in the range being created, between
/// the step's look at the default and its `CREATE`; the next attempt folds it.
const CHECK_VIOLATION: &str = "23514";
/// insufficient_privilege: the role may not create or drop partitions.
pub(crate) const INSUFFICIENT_PRIVILEGE: &str = "42501";

const FIRST_PAUSE: Duration = Duration::from_millis(50);
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// The SQLSTATE of a database error.
pub(crate) fn sqlstate(error: &Error) -> Option<String> {
    match error {
        Error::Database(sqlx::Error::Database(db)) => db.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// One change a run makes.
#[derive(Clone, Copy)]
pub(super) enum Step<'a> {
    /// See [`extend`].
    Extend,
    /// See [`drop_oldest`], for the partition named.
    DropOldest(&'a str),
}

/// What a [`Step`] did.
pub(super) enum Done {
    Extended(Extended),
    /// Whether the partition was dropped.
    Dropped(bool),
}

/// Runs `step` on a fresh pooled connection until it succeeds, fails for a reason other than a
/// lock it could not have, or [`RetentionConfig::retry_for`] has passed since its first try
/// (then that last error is returned). The connection goes back to the pool between attempts:
/// nothing is held while pausing.
pub(super) async fn retrying(
    pool: &PgPool,
    config: &RetentionConfig,
    step: Step<'_>,
) -> Result<Done> {
    let deadline = Instant::now() + config.retry_for;
    let mut pause = FIRST_PAUSE;
    loop {
        let result = {
            let mut conn = pool.acquire().await?;
            match step {
                Step::Extend => extend(&mut conn, config).await.map(Done::Extended),
                Step::DropOldest(name) => drop_oldest(&mut conn, config, name)
                    .await
                    .map(Done::Dropped),
            }
        };
        let retry = matches!(
            sqlstate_of(&result).as_deref(),
            Some(LOCK_NOT_AVAILABLE | DEADLOCK_DETECTED | CHECK_VIOLATION)
        );
        // Jitter, so that two runs that collided do not collide again in step.
        let wait = pause.mul_f64(0.5 + fastrand::f64());
        if !retry || Instant::now() + wait >= deadline {
            return result;
        }
        tokio::time::sleep(wait).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

fn sqlstate_of<T>(result: &Result<T>) -> Option<String> {
    result.as_ref().err().and_then(sqlstate)
}

/// Opens a step's transaction: short lock timeout first, so that even the advisory lock is
/// waited for only that long.
async fn begin(conn: &mut PgConnection) -> Result<sqlx::Transaction<'_, sqlx::Postgres>> {
    let mut tx = conn.begin().await?;
    sql::lock_step(&mut tx).await?;
    Ok(tx)
}

/// What one extending step did.
pub(super) enum Extended {
    /// The default partition's rows became this range partition.
    Folded(String),
    /// This range partition pair was created ahead of the head.
    Created(String),
    /// The partitions reach far enough above the head.
    Enough,
    /// The default partition holds rows both below and above where the range partitions end:
    /// it cannot become one range partition, and only an operator can place the rows below
    /// (they were inserted with explicit sequences under the retention floor).
    CannotFold(String),
}

/// One step towards `ahead` partitions above the head: folds the default partition first if it
/// holds rows (no range partition may be created over its rows, and every creation would scan
/// them), otherwise creates the next range partition pair.
async fn extend(conn: &mut PgConnection, config: &RetentionConfig) -> Result<Extended> {
    let mut tx = begin(conn).await?;
    let (head, size) = plan::head_and_size(&mut tx).await?;
    let bounds = plan::partitions(&mut tx).await?;
    let top = bounds.last().map_or(1, |b| b.to);
    let waiting = plan::default_rows(&mut tx, &bounds).await?;
    // Rows below the range partitions (written with explicit sequences under the floor) are
    // not the maintainer's to place; they do not stop it from extending above them.
    if waiting.high.is_some_and(|high| high >= top) {
        let done = fold(&mut tx, top, size).await?;
        if let Extended::Folded(_) = done {
            tx.commit().await?;
        }
        return Ok(done);
    }
    let wanted_top = head + u64::from(config.ahead) * size + 1;
    if top >= wanted_top {
        return Ok(Extended::Enough);
    }
    for table in sql::PARTITIONED {
        let create = sql::create_partition(table, top, top + size);
        sqlx::raw_sql(sqlx::AssertSqlSafe(create))
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(Extended::Created(format!("{}_{top}", sql::EVENTS)))
}

/// Folds the default partitions into the range partition `[top, to)`, `to` the first multiple
/// of `size` above `top` past both the highest row and the drawn head (so the writers of
/// sequences already drawn land in a range partition, not in the new default).
async fn fold(tx: &mut PgConnection, top: u64, size: u64) -> Result<Extended> {
    let events = sql::EVENTS;
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql::detach_default(events)))
        .execute(&mut *tx)
        .await?;
    // Detached and locked: nobody adds a row now, so these reads are final.
    let (low, high) = plan::detached_range(tx).await?;
    let (head, _) = plan::head_and_size(tx).await?;
    if let Some(low) = low.filter(|low| *low < top) {
        return Ok(Extended::CannotFold(format!(
            "ordo.events_default holds sequence {low}, below the range partitions (from {top}): \
             move or delete such rows by hand"
        )));
    }
    let high = high.unwrap_or(top).max(head);
    let to = top + (high + 1 - top).div_ceil(size).max(1) * size;
    for statement in sql::fold_detached(events, top, to) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut *tx)
            .await?;
    }
    Ok(Extended::Folded(format!("{events}_{top}")))
}

/// Drops the oldest partition pair if it is still `name` and still past retention on what the
/// database shows now; `false` (nothing done) otherwise.
async fn drop_oldest(
    conn: &mut PgConnection,
    config: &RetentionConfig,
    name: &str,
) -> Result<bool> {
    let mut tx = begin(conn).await?;
    let snapshot = plan::snapshot(&mut tx, config.force).await?;
    if snapshot.bounds.first().map(|b| b.name.as_str()) != Some(name) {
        return Ok(false);
    }
    let ages = plan::seal_ages(&mut tx).await?;
    let PartitionInfo {
        drop, reason, to, ..
    } = plan::verdict(&mut tx, config, &snapshot, &ages, 0).await?;
    if !drop {
        tracing::debug!(partition = name, %reason, "no longer droppable");
        return Ok(false);
    }
    debug_assert_eq!(reason, PAST_RETENTION);
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql::drop_partition(name)))
        .execute(&mut *tx)
        .await?;
    // The log entries of exactly the dropped events (a prefix of the log: no group straddles
    // `to`, checked by the verdict) go in the same transaction.
    let to = EventSequence::new(to);
    let commit_floor = crate::commit_lane::trim_below(&mut tx, to).await?;
    sql::set_floors(&mut tx, to, commit_floor).await?;
    sql::forget_seal(&mut tx, to).await?;
    tx.commit().await?;
    Ok(true)
}
