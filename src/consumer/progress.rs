//! A keyed subscription's stored progress: the low watermark (`ordo.subscriptions.position`)
//! and the rows of `ordo.subscription_progress` above it. Every statement that writes is
//! fenced by the lease, as a serial subscription's checkpoint is: a runner that lost its lease
//! (or whose subscription an operator paused or moved) changes nothing.
//!
//! **Why a completion cannot be lost or doubled.** A completion is a row written in the
//! handler's transaction by [`COMPLETE`], which share-locks the subscription's row: a claim
//! (`FOR UPDATE SKIP LOCKED`) cannot take the lease while a completion is between its
//! statement and its COMMIT, so a new runner that reads the progress after taking the lease
//! sees every completion of the old one. The row's key (subscription, position) refuses a
//! second completion of the same event, and the fence `position < $3` refuses one below the
//! watermark.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use super::status::RunStatus;
use crate::position::Position;
use crate::telemetry::HotStatement;

/// The rows above the watermark, as a runner finds them when it takes the lease; an event
/// moved aside to a stuck key's backlog (`backlog.rs`) reads as `aside`, whatever its row says.
pub(crate) const LOAD: &str = r#"
SELECT p.position, p.state, p.attempts, coalesce(p.last_error, '') AS last_error,
       p.retry_requested_at IS NOT NULL AS retry_requested
FROM ordo.subscription_progress AS p
WHERE p.subscription = $1 AND p.position > $2
  AND NOT EXISTS (SELECT 1 FROM ordo.key_backlogs AS b
                  WHERE b.subscription = $1 AND b.position = p.position)
UNION ALL
SELECT b.position, 'aside', 0, '', FALSE
FROM ordo.key_backlogs AS b
WHERE b.subscription = $1 AND b.position > $2
"#;

/// The completion, in the handler's transaction: `done` at `$3`, fenced by the lease (`$2`),
/// the status and the watermark; `FOR SHARE` holds off a takeover until COMMIT. No row
/// inserted or updated: the fence refused, or the event was already done.
pub(crate) const COMPLETE: &str = r#"
INSERT INTO ordo.subscription_progress (subscription, position, state)
SELECT s.name, $3, 'done'
FROM ordo.subscriptions AS s
WHERE s.name = $1 AND s.lease_owner = $2 AND s.status = 'active' AND s.position < $3
FOR SHARE OF s
ON CONFLICT (subscription, position) DO UPDATE
SET state = 'done', last_error = NULL, retry_requested_at = NULL, updated_at = now()
WHERE ordo.subscription_progress.state <> 'done'
"#;

/// A failed attempt (`failing`) or exhausted attempts (`stalled`) at `$3`, fenced by the lease.
pub(crate) const FAILED: &str = r#"
INSERT INTO ordo.subscription_progress (subscription, position, state, attempts, keys, last_error)
SELECT s.name, $3, $4, $5, $6, $7
FROM ordo.subscriptions AS s
WHERE s.name = $1 AND s.lease_owner = $2 AND s.position < $3
ON CONFLICT (subscription, position) DO UPDATE
SET state = excluded.state, attempts = excluded.attempts, keys = excluded.keys,
    last_error = excluded.last_error, retry_requested_at = NULL, updated_at = now()
WHERE ordo.subscription_progress.state <> 'done'
"#;

/// Moves the watermark from `$4` to `$3`, deletes the rows it passed (but a stalled event's in
/// a backlog, `backlog.rs`) and extends the lease, in one statement; with `$3 = $4` it is the idle renewal. Returns the status, NULL when the
/// fence refused (lease lost, or an operator moved the position).
pub(crate) const FLUSH: &str = r#"
WITH moved AS (
    UPDATE ordo.subscriptions
    SET position = $3,
        lease_expires_at = now() + make_interval(secs => $5::float8 / 1000),
        updated_at = now()
    WHERE name = $1 AND lease_owner = $2 AND position = $4
    RETURNING status
), pruned AS (
    DELETE FROM ordo.subscription_progress AS p
    WHERE p.subscription = $1 AND p.position <= $3 AND EXISTS (SELECT 1 FROM moved)
      AND (p.state = 'done'
           OR (p.retry_requested_at IS NULL
               AND NOT EXISTS (SELECT 1 FROM ordo.key_backlogs AS b
                               WHERE b.subscription = $1 AND b.position = p.position)))
)
SELECT (SELECT status FROM moved) AS status
"#;

/// [`FAILED`] for an event taken back from a backlog (below the watermark): fenced by the lease
/// and by its copy being there.
pub(crate) const FAILED_ASIDE: &str = r#"
INSERT INTO ordo.subscription_progress (subscription, position, state, attempts, keys, last_error)
SELECT s.name, $3, $4, $5, $6, $7
FROM ordo.subscriptions AS s
WHERE s.name = $1 AND s.lease_owner = $2
  AND EXISTS (SELECT 1 FROM ordo.key_backlogs AS b WHERE b.subscription = $1 AND b.position = $3)
ON CONFLICT (subscription, position) DO UPDATE
SET state = excluded.state, attempts = excluded.attempts, keys = excluded.keys,
    last_error = excluded.last_error, retry_requested_at = NULL, updated_at = now()
"#;

/// Stalled events an operator asked to retry, made `failing` again with no attempts (fenced).
pub(crate) const TAKE_RETRIES: &str = r#"
UPDATE ordo.subscription_progress AS p
SET state = 'failing', attempts = 0, retry_requested_at = NULL, updated_at = now()
FROM ordo.subscriptions AS s
WHERE p.subscription = $1 AND p.state = 'stalled' AND p.retry_requested_at IS NOT NULL
  AND s.name = $1 AND s.lease_owner = $2
RETURNING p.position
"#;

/// Whether a subscription holds keyed progress above its watermark (a serial runner would
/// handle those events again).
pub(crate) const HAS_PROGRESS: &str = r#"
SELECT EXISTS (
    SELECT 1 FROM ordo.subscription_progress AS p
    JOIN ordo.subscriptions AS s ON s.name = p.subscription
    WHERE p.subscription = $1 AND p.position > s.position
)
"#;

/// Whether a subscription has events in a stuck key's backlog (a serial runner would never
/// deliver them); false on a schema from before backlogs.
pub(crate) const HAS_BACKLOG: &str =
    "SELECT EXISTS (SELECT 1 FROM ordo.key_backlogs WHERE subscription = $1)";

/// Whether the backlog table exists (a library newer than the schema it is given refuses that
/// elsewhere; this check only keeps it from failing first).
const BACKLOGS_EXIST: &str = "SELECT to_regclass('ordo.key_backlogs') IS NOT NULL";

/// What the stored progress says about one event above the watermark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Known {
    Done,
    /// In a stuck key's backlog: finished as far as the window goes.
    Aside,
    Failing {
        attempts: u32,
    },
    Stalled {
        attempts: u32,
        error: String,
    },
}

/// [`LOAD`]: the events above `watermark` the stored progress knows, by position. A stalled
/// event an operator asked to retry counts as failing with no attempts (the runner takes the
/// request at its next look).
pub(crate) async fn load(
    pool: &PgPool,
    name: &str,
    watermark: Position,
) -> Result<HashMap<u64, Known>, sqlx::Error> {
    let rows = sqlx::query(LOAD)
        .bind(name)
        .bind(watermark)
        .fetch_all(pool)
        .await?;
    let mut known = HashMap::with_capacity(rows.len());
    for row in rows {
        let position = u64::try_from(row.try_get::<i64, _>("position")?).unwrap_or(0);
        let attempts = crate::consumer::sql::attempts_read(row.try_get("attempts")?);
        let state: String = row.try_get("state")?;
        let entry = match state.as_str() {
            "done" => Known::Done,
            "aside" => Known::Aside,
            "stalled" if !row.try_get::<bool, _>("retry_requested")? => Known::Stalled {
                attempts,
                error: row.try_get("last_error")?,
            },
            "stalled" => Known::Failing { attempts: 0 },
            _ => Known::Failing { attempts },
        };
        known.insert(position, entry);
    }
    Ok(known)
}

/// [`COMPLETE`] in the handler's transaction; false when the fence refused.
pub(crate) async fn complete(
    tx: &mut PgConnection,
    name: &str,
    owner: Uuid,
    at: Position,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(COMPLETE)
        .bind(name)
        .bind(owner)
        .bind(at)
        .execute(tx)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// A failed event's record for [`FAILED`].
pub(crate) struct Failed<'a> {
    pub(crate) at: Position,
    pub(crate) stalled: bool,
    pub(crate) attempts: u32,
    pub(crate) keys: Vec<String>,
    pub(crate) error: &'a str,
    /// Taken back from a backlog ([`FAILED_ASIDE`]).
    pub(crate) aside: bool,
}

/// [`FAILED`]; false when the fence refused.
pub(crate) async fn failed(
    pool: &PgPool,
    name: &str,
    owner: Uuid,
    failed: Failed<'_>,
) -> Result<bool, sqlx::Error> {
    let mut connection = pool.acquire().await?;
    failed_in(&mut connection, name, owner, failed).await
}

/// [`FAILED`] on `connection` (in a transaction of the caller's); false when the fence refused.
pub(crate) async fn failed_in(
    connection: &mut PgConnection,
    name: &str,
    owner: Uuid,
    failed: Failed<'_>,
) -> Result<bool, sqlx::Error> {
    let state = if failed.stalled { "stalled" } else { "failing" };
    let statement = if failed.aside { FAILED_ASIDE } else { FAILED };
    let done = sqlx::query(statement)
        .bind(name)
        .bind(owner)
        .bind(failed.at)
        .bind(state)
        .bind(i32::try_from(failed.attempts).unwrap_or(i32::MAX))
        .bind(failed.keys)
        .bind(failed.error)
        .execute(connection)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// [`FLUSH`]: the stored status after moving the watermark from `from` to `to`; `None` when
/// the fence refused.
pub(crate) async fn flush(
    pool: &PgPool,
    name: &str,
    owner: Uuid,
    from: Position,
    to: Position,
    lease: Duration,
) -> Result<Option<RunStatus>, sqlx::Error> {
    sqlx::query_scalar(FLUSH)
        .bind(name)
        .bind(owner)
        .bind(to)
        .bind(from)
        .bind(lease.as_secs_f64() * 1000.0)
        .fetch_one(pool)
        .await
}

/// [`TAKE_RETRIES`]: the positions of the stalled events to run again.
pub(crate) async fn take_retries(
    pool: &PgPool,
    name: &str,
    owner: Uuid,
) -> Result<Vec<u64>, sqlx::Error> {
    let positions: Vec<i64> = sqlx::query_scalar(TAKE_RETRIES)
        .bind(name)
        .bind(owner)
        .fetch_all(pool)
        .await?;
    Ok(positions
        .into_iter()
        .filter_map(|position| u64::try_from(position).ok())
        .collect())
}

/// [`HAS_PROGRESS`], or [`HAS_BACKLOG`].
pub(crate) async fn has_progress(pool: &PgPool, name: &str) -> Result<bool, sqlx::Error> {
    let above: bool = sqlx::query_scalar(HAS_PROGRESS)
        .bind(name)
        .fetch_one(pool)
        .await?;
    if above
        || !sqlx::query_scalar::<_, bool>(BACKLOGS_EXIST)
            .fetch_one(pool)
            .await?
    {
        return Ok(above);
    }
    sqlx::query_scalar(HAS_BACKLOG)
        .bind(name)
        .fetch_one(pool)
        .await
}

/// This file's statements on ordo's hot paths, with sample arguments, for `ops::plans`
/// (`tests/ops/plans.rs` fails if PostgreSQL would JIT-compile any).
pub(crate) const HOT_PATH: &[HotStatement] = &[
    HotStatement {
        name: "keyed subscription: load progress",
        sql: LOAD,
        types: "text, bigint",
        args: "'s', 0",
        session: &[],
    },
    HotStatement {
        name: "keyed subscription: completion",
        sql: COMPLETE,
        types: "text, uuid, bigint",
        args: "'s', '0190c9d2-0000-7000-8000-000000000001'::uuid, 10",
        session: &[],
    },
    HotStatement {
        name: "keyed subscription: failed attempt",
        sql: FAILED,
        types: "text, uuid, bigint, text, integer, text[], text",
        args: "'s', '0190c9d2-0000-7000-8000-000000000001'::uuid, 10, 'failing', 1, ARRAY['k'], 'boom'",
        session: &[],
    },
    HotStatement {
        name: "keyed subscription: watermark",
        sql: FLUSH,
        types: "text, uuid, bigint, bigint, float8",
        args: "'s', '0190c9d2-0000-7000-8000-000000000001'::uuid, 10, 9, 30000",
        session: &[],
    },
    HotStatement {
        name: "keyed subscription: take retries",
        sql: TAKE_RETRIES,
        types: "text, uuid",
        args: "'s', '0190c9d2-0000-7000-8000-000000000001'::uuid",
        session: &[],
    },
];
