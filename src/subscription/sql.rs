//! A subscription's statements in and beside its handler's transaction: the bounded `BEGIN`,
//! the checkpoint, failed attempts, dead letters and their retries, and the progress a wait
//! reads. Each behind a named, typed function; the constants stay public to the crate for
//! `ops::plans`. The row's own statements (claim, renew, release) are the consumer core's.

use std::time::Duration;

use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::consumer::sql::{attempts_bound, lease_ms};
use crate::position::{EventSequence, Position};
use crate::telemetry::HotStatement;

/// The `BEGIN` of a handler's transaction: the server ends the session if the transaction sits
/// idle (the runner stalled, or a handler awaits something else) longer than the lease, so a
/// stalled owner never keeps the subscription's row locked past its lease. The client cannot
/// enforce this: a stalled client is the case in point. Sent with the `BEGIN`, it costs no
/// round trip. The text is built from a number only (the lease in whole milliseconds, at least
/// 1, since 0 turns the timeout off).
pub(crate) fn begin_bounded(lease: Duration) -> sqlx::AssertSqlSafe<String> {
    let ms = lease.as_millis().max(1);
    sqlx::AssertSqlSafe(format!(
        "BEGIN; SET LOCAL idle_in_transaction_session_timeout = {ms}"
    ))
}

/// Ends a failed attempt's transaction now. Dropping a `Transaction` only queues its ROLLBACK
/// until the connection is next used or back in the pool, and a retry on another connection
/// could start while the failed attempt still holds its locks (and its sequences, which hold
/// the insert lane). A ROLLBACK that fails leaves that queued one, as before; the failure
/// being reported is the attempt's, not the rollback's.
pub(crate) async fn roll_back(tx: sqlx::Transaction<'_, sqlx::Postgres>) {
    if let Err(error) = tx.rollback().await {
        tracing::debug!(%error, "rolling back a failed attempt failed");
    }
}

/// The checkpoint, in the handler's transaction, fenced by the lease and the expected position
/// (an operator's reset moves the position, which also fails the fence).
pub(crate) const CHECKPOINT: &str = r#"
UPDATE ordo.subscriptions
SET position = $3,
    attempts = 0,
    last_error = NULL,
    lease_expires_at = now() + make_interval(secs => $5::float8 / 1000),
    updated_at = now()
WHERE name = $1 AND lease_owner = $2 AND position = $4 AND status = 'active'
"#;

/// A failed attempt, recorded for operators (fenced like a checkpoint). It also extends the
/// lease: a runner backing off between retries is alive, not gone.
pub(crate) const FAILED: &str = r#"
UPDATE ordo.subscriptions
SET attempts = $3, last_error = $4, updated_at = now(),
    lease_expires_at = now() + make_interval(secs => $5::float8 / 1000)
WHERE name = $1 AND lease_owner = $2
"#;

/// One dead letter, with the payload as stored (it may not decode).
pub(crate) const DEAD_LETTER: &str = r#"
INSERT INTO ordo.dead_letters (subscription, lane, position, sequence, event_id, payload, error, attempts)
SELECT $1, $2, $3, e.sequence, e.id, e.payload, $5, $6
FROM ordo.events AS e WHERE e.sequence = $4
"#;

/// Dead letters an operator asked to retry, with their events (as the lane reads them), their
/// position, attempts so far and, on the commit lane, whether the event ends its group (true
/// where the log no longer holds it).
pub(crate) const RETRIES: &str = r#"
SELECT d.id AS dead_letter, d.position, d.attempts, e.sequence, e.commit_xid, e.id,
       e.payload::text AS payload, e.headers::text AS headers, e.recorded_at, e.event_type,
       coalesce((SELECT c.group_last FROM ordo.commit_log_range(d.position - 1, d.position) AS c
                 WHERE d.lane = 'commit'), true) AS group_last
FROM ordo.dead_letters AS d
JOIN ordo.events AS e ON e.sequence = d.sequence
WHERE d.subscription = $1 AND d.retry_requested_at IS NOT NULL
ORDER BY d.id
LIMIT 100
"#;

/// A retried dead letter was handled: it goes, in the handler's transaction. The fence (the
/// lease owner) is checked by [`RETRY_FENCE`] in the same transaction. No row: it went
/// meanwhile (purged, or retried by another runner), and the handler's writes must not stay.
pub(crate) const RETRY_DONE: &str = "DELETE FROM ordo.dead_letters WHERE id = $1";

/// The lease fence for a retry, which moves no position: extends our lease, no row if lost
/// or if an operator paused or halted the subscription (as a keyed completion's fence). The
/// row lock it takes holds off a takeover until the retry commits.
pub(crate) const RETRY_FENCE: &str = r#"
UPDATE ordo.subscriptions
SET lease_expires_at = now() + make_interval(secs => $3::float8 / 1000)
WHERE name = $1 AND lease_owner = $2 AND status = 'active'
"#;

/// A retry failed (or its event is gone): the row stays, with the error, one more attempt, and
/// the request cleared.
pub(crate) const RETRY_FAILED: &str = r#"
UPDATE ordo.dead_letters
SET retry_requested_at = NULL, attempts = attempts + 1, error = $2
WHERE id = $1
"#;

/// Retry requests whose event is no longer in `ordo.events` (retention dropped it).
pub(crate) const RETRY_ORPHANS: &str = r#"
UPDATE ordo.dead_letters AS d
SET retry_requested_at = NULL,
    error = 'retry refused: ordo.events no longer holds sequence ' || d.sequence || ' (retention dropped it)'
WHERE d.subscription = $1 AND d.retry_requested_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM ordo.events AS e WHERE e.sequence = d.sequence)
"#;

/// [`CHECKPOINT`] in the handler's transaction: moves the position from `from` to `to`;
/// false when the fence refuses (lease lost, position moved, not active).
pub(crate) async fn checkpoint(
    tx: &mut PgConnection,
    name: &str,
    owner: Uuid,
    from: Position,
    to: Position,
    lease: Duration,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(CHECKPOINT)
        .bind(name)
        .bind(owner)
        .bind(to)
        .bind(from)
        .bind(lease_ms(lease))
        .execute(tx)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// [`FAILED`]: records `attempts` failed tries and the error; false if the lease was lost.
pub(crate) async fn record_failure(
    pool: &PgPool,
    name: &str,
    owner: Uuid,
    attempts: u32,
    message: &str,
    lease: Duration,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(FAILED)
        .bind(name)
        .bind(owner)
        .bind(attempts_bound(attempts))
        .bind(message)
        .bind(lease_ms(lease))
        .execute(pool)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// [`DEAD_LETTER`] in the dead-lettering transaction: the event `sequence` at `position`.
pub(crate) async fn dead_letter(
    tx: &mut PgConnection,
    name: &str,
    position: Position,
    sequence: EventSequence,
    message: &str,
    attempts: u32,
) -> Result<(), sqlx::Error> {
    sqlx::query(DEAD_LETTER)
        .bind(name)
        .bind(position.lane().as_str())
        .bind(position)
        .bind(sequence)
        .bind(message)
        .bind(attempts_bound(attempts))
        .execute(tx)
        .await?;
    Ok(())
}

/// [`RETRY_ORPHANS`]: refuses the retries whose event retention dropped.
pub(crate) async fn refuse_orphan_retries(pool: &PgPool, name: &str) -> Result<(), sqlx::Error> {
    sqlx::query(RETRY_ORPHANS).bind(name).execute(pool).await?;
    Ok(())
}

/// [`RETRIES`]: the requested retries with their events, as rows for
/// `insert_lane::rows::decode_full` (plus `dead_letter`, `position`, `attempts`, `group_last`).
pub(crate) async fn retries(pool: &PgPool, name: &str) -> Result<Vec<PgRow>, sqlx::Error> {
    sqlx::query(RETRIES).bind(name).fetch_all(pool).await
}

/// [`RETRY_FENCE`] in the retry's transaction: false if `owner` lost the lease.
pub(crate) async fn retry_fence(
    tx: &mut PgConnection,
    name: &str,
    owner: Uuid,
    lease: Duration,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(RETRY_FENCE)
        .bind(name)
        .bind(owner)
        .bind(lease_ms(lease))
        .execute(tx)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// [`RETRY_DONE`] in the retry's transaction: false if the dead letter was already gone.
pub(crate) async fn retry_done(tx: &mut PgConnection, id: i64) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(RETRY_DONE).bind(id).execute(tx).await?;
    Ok(done.rows_affected() == 1)
}

/// [`RETRY_FAILED`]: the dead letter `id` stays, with `message`.
pub(crate) async fn retry_failed(pool: &PgPool, id: i64, message: &str) -> Result<(), sqlx::Error> {
    sqlx::query(RETRY_FAILED)
        .bind(id)
        .bind(message)
        .execute(pool)
        .await?;
    Ok(())
}

/// A subscription's lane, position and status, for waits from any process.
pub(crate) const PROGRESS: &str = r#"
SELECT lane, position, status, last_error FROM ordo.subscriptions WHERE name = $1
"#;

/// This file's statements on ordo's hot paths, with sample arguments, for `ops::plans`
/// (`tests/ops/plans.rs` fails if PostgreSQL would JIT-compile any).
pub(crate) const HOT_PATH: &[HotStatement] = &[
    HotStatement {
        name: "subscription: checkpoint",
        sql: CHECKPOINT,
        types: "text, uuid, bigint, bigint, bigint",
        args: "'s', '0190c9d2-0000-7000-8000-000000000001'::uuid, 10, 9, 30000",
        session: &[],
    },
    HotStatement {
        name: "subscription: failed attempt",
        sql: FAILED,
        types: "text, uuid, integer, text, bigint",
        args: "'s', '0190c9d2-0000-7000-8000-000000000001'::uuid, 1, 'boom', 30000",
        session: &[],
    },
    HotStatement {
        name: "subscription: dead letter",
        sql: DEAD_LETTER,
        types: "text, text, bigint, bigint, text, integer",
        args: "'s', 'commit', 9, 9, 'boom', 3",
        session: &[],
    },
];
