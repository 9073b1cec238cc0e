//! The subscription runner's statements, each behind a named, typed function (the constants
//! stay public to the crate for `ops::plans`, which checks their plans).

use std::time::Duration;

use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use super::status::RunStatus;
use crate::position::EventSequence;
use crate::position::Ordering;
use crate::position::Position;

/// Creates the row if it is new, of kind `$4` (`subscription` or `relay`), run by the
/// connected role (the column's default); existing rows are left alone.
pub(crate) const CREATE: &str = r#"
INSERT INTO ordo.subscriptions (name, lane, position, kind) VALUES ($1, $2, $3, $4)
ON CONFLICT (name) DO NOTHING
"#;

/// A row created before ordo recorded kinds and roles takes the starting runner's (row
/// security lets any role adopt it, once). Rows that have both are not touched, so this takes
/// no lock on them.
pub(crate) const ADOPT: &str = r#"
UPDATE ordo.subscriptions
SET kind = coalesce(kind, $2), role = coalesce(role, current_user::text)
WHERE name = $1 AND (kind IS NULL OR role IS NULL)
"#;

/// The row's lane, kind and role, the connected role, and whether it may write the row: it is
/// the row's role or inherits its privileges, or bypasses row security (a superuser, a role
/// with BYPASSRLS, the table's owner or a member of it).
pub(crate) const IDENTITY: &str = r#"
SELECT s.lane, s.kind, s.role, current_user::text AS connected,
       s.role IS NULL OR s.role = current_user::text
       OR EXISTS (SELECT 1 FROM pg_roles AS r
                  WHERE r.rolname::text = s.role AND pg_has_role(current_user, r.oid, 'USAGE'))
       OR EXISTS (SELECT 1 FROM pg_roles AS r
                  WHERE r.rolname = current_user AND (r.rolsuper OR r.rolbypassrls))
       OR pg_has_role(current_user, (SELECT c.relowner FROM pg_class AS c
                                     WHERE c.oid = 'ordo.subscriptions'::regclass), 'USAGE')
           AS writable
FROM ordo.subscriptions AS s
WHERE s.name = $1
"#;

/// Takes the lease if it is free, expired, already ours, or handed over from us by an
/// operator's reset (`md5(owner || ':handover')`, see `admin::RESET`: its runner claims again
/// once its work in hand has ended; nobody else before the lease expires). Returns the row as
/// it stands.
///
/// `SKIP LOCKED`: the claim never queues behind a row lock. A row locked by another transaction
/// (an owner between its checkpoint and its COMMIT, possibly stalled) is treated as taken; the
/// standby claims again at its next turn, by when the server has ended a stalled owner's
/// transaction (see [`begin_bounded`]). A plain `UPDATE` here waited on the lock for as long
/// as the owner stalled, expired lease or not.
pub(crate) const CLAIM: &str = r#"
WITH free AS (
    SELECT name FROM ordo.subscriptions
    WHERE name = $1
      AND (lease_owner IS NULL OR lease_owner = $2 OR lease_expires_at < now()
           OR lease_owner = md5($2::text || ':handover')::uuid)
    FOR UPDATE SKIP LOCKED
)
UPDATE ordo.subscriptions AS s
SET lease_owner = $2,
    lease_expires_at = now() + make_interval(secs => $3::float8 / 1000),
    -- A relay's sink state is its owner's judgement: the claiming runner has made none yet.
    sink_down_since = NULL,
    sink_down_reason = NULL,
    updated_at = now()
FROM free
WHERE s.name = free.name
RETURNING s.position, s.status, s.attempts, s.last_error
"#;

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

/// Extends a lease we hold; no row means we lost it. Also reports the row's state, so an
/// operator's pause, resume or reset is seen while idle.
pub(crate) const RENEW: &str = r#"
UPDATE ordo.subscriptions
SET lease_expires_at = now() + make_interval(secs => $3::float8 / 1000)
WHERE name = $1 AND lease_owner = $2
RETURNING position, status, attempts, last_error
"#;

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

pub(crate) const HALT: &str = r#"
UPDATE ordo.subscriptions
SET status = 'halted', attempts = $3, last_error = $4, updated_at = now()
WHERE name = $1 AND lease_owner = $2 AND position = $5
"#;

/// One dead letter, with the payload as stored (it may not decode).
pub(crate) const DEAD_LETTER: &str = r#"
INSERT INTO ordo.dead_letters (subscription, lane, position, sequence, event_id, payload, error, attempts)
SELECT $1, $2, $3, e.sequence, e.id, e.payload, $5, $6
FROM ordo.events AS e WHERE e.sequence = $4
"#;

pub(crate) const RELEASE: &str = r#"
UPDATE ordo.subscriptions SET lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
WHERE name = $1 AND lease_owner = $2
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
/// lease owner) is checked by [`RETRY_FENCE`] in the same transaction.
pub(crate) const RETRY_DONE: &str = "DELETE FROM ordo.dead_letters WHERE id = $1";

/// The lease fence for a retry, which moves no position: extends our lease, no row if lost.
pub(crate) const RETRY_FENCE: &str = r#"
UPDATE ordo.subscriptions
SET lease_expires_at = now() + make_interval(secs => $3::float8 / 1000)
WHERE name = $1 AND lease_owner = $2
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

/// A subscription's row as a claim or renewal returns it.
pub(crate) struct Stored {
    pub(crate) position: Position,
    pub(crate) status: RunStatus,
    pub(crate) attempts: u32,
    pub(crate) last_error: Option<String>,
}

impl Stored {
    fn read(row: &PgRow, lane: Ordering) -> Result<Self, sqlx::Error> {
        Ok(Self {
            position: Position::read(row, "position", lane)?,
            status: row.try_get("status")?,
            attempts: attempts_read(row.try_get("attempts")?),
            last_error: row.try_get("last_error")?,
        })
    }
}

/// `attempts` is an `integer`; counts past it are stored as its maximum.
fn attempts_bound(attempts: u32) -> i32 {
    i32::try_from(attempts).unwrap_or(i32::MAX)
}

pub(crate) fn attempts_read(stored: i32) -> u32 {
    u32::try_from(stored).unwrap_or(0)
}

/// Leases travel as milliseconds (`$n::float8 / 1000` in the statements).
fn lease_ms(lease: Duration) -> f64 {
    lease.as_secs_f64() * 1000.0
}

/// [`CREATE`]: the row for a new subscription or relay (`kind`) starting after `start` (on
/// `start`'s lane), then [`ADOPT`] for a row from before kinds and roles were recorded.
pub(crate) async fn create(
    pool: &PgPool,
    name: &str,
    start: Position,
    kind: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(CREATE)
        .bind(name)
        .bind(start.lane().as_str())
        .bind(start)
        .bind(kind)
        .execute(pool)
        .await?;
    sqlx::query(ADOPT)
        .bind(name)
        .bind(kind)
        .execute(pool)
        .await?;
    Ok(())
}

/// A row's identity as [`IDENTITY`] reads it.
pub(crate) struct Identity {
    /// The stored lane, as text (a value ordo does not know is reported, not parsed).
    pub(crate) lane: String,
    pub(crate) kind: Option<String>,
    pub(crate) role: Option<String>,
    pub(crate) connected: String,
    pub(crate) writable: bool,
}

/// [`IDENTITY`] of the row `name`.
pub(crate) async fn identity(pool: &PgPool, name: &str) -> Result<Identity, sqlx::Error> {
    let row = sqlx::query(IDENTITY).bind(name).fetch_one(pool).await?;
    Ok(Identity {
        lane: row.try_get("lane")?,
        kind: row.try_get("kind")?,
        role: row.try_get("role")?,
        connected: row.try_get("connected")?,
        writable: row.try_get::<Option<bool>, _>("writable")?.unwrap_or(false),
    })
}

/// [`CLAIM`]: the row if `owner` now holds the lease, `None` if another runner does.
pub(crate) async fn claim(
    pool: &PgPool,
    name: &str,
    lane: Ordering,
    owner: Uuid,
    lease: Duration,
) -> Result<Option<Stored>, sqlx::Error> {
    lease_statement(CLAIM, pool, name, lane, owner, lease).await
}

/// [`RENEW`]: the row if `owner` still holds the lease, `None` if it lost it.
pub(crate) async fn renew(
    pool: &PgPool,
    name: &str,
    lane: Ordering,
    owner: Uuid,
    lease: Duration,
) -> Result<Option<Stored>, sqlx::Error> {
    lease_statement(RENEW, pool, name, lane, owner, lease).await
}

async fn lease_statement(
    statement: &'static str,
    pool: &PgPool,
    name: &str,
    lane: Ordering,
    owner: Uuid,
    lease: Duration,
) -> Result<Option<Stored>, sqlx::Error> {
    let row = sqlx::query(statement)
        .bind(name)
        .bind(owner)
        .bind(lease_ms(lease))
        .fetch_optional(pool)
        .await?;
    row.as_ref().map(|row| Stored::read(row, lane)).transpose()
}

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

/// [`HALT`]: halts the subscription at `at` (fenced by the lease and the position); false when
/// the fence refused (another runner holds the lease, or an operator moved the position).
pub(crate) async fn halt(
    pool: &PgPool,
    name: &str,
    owner: Uuid,
    attempts: u32,
    message: &str,
    at: Position,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(HALT)
        .bind(name)
        .bind(owner)
        .bind(attempts_bound(attempts))
        .bind(message)
        .bind(at)
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

/// [`RELEASE`]: gives up `owner`'s lease, if it still holds it.
pub(crate) async fn release(pool: &PgPool, name: &str, owner: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query(RELEASE)
        .bind(name)
        .bind(owner)
        .execute(pool)
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

/// [`RETRY_DONE`] in the retry's transaction.
pub(crate) async fn retry_done(tx: &mut PgConnection, id: i64) -> Result<(), sqlx::Error> {
    sqlx::query(RETRY_DONE).bind(id).execute(tx).await?;
    Ok(())
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
