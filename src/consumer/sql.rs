//! The statements on a consumer's row in `ordo.subscriptions` (create, identity, claim, renew,
//! halt, release), each behind a named, typed function (the constants stay public to the crate
//! for `ops::plans`, which checks their plans). A subscription's handler-transaction
//! statements (checkpoint, failures, dead letters) are `subscription/sql.rs`.

use std::time::Duration;

use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};
use uuid::Uuid;

use super::status::RunStatus;
use crate::position::Ordering;
use crate::position::Position;
use crate::telemetry::HotStatement;

/// Creates the row if it is new, of kind `$4` (`subscription` or `relay`), run by the
/// connected role (the column's default); existing rows are left alone.
pub(crate) const CREATE: &str = r#"
INSERT INTO ordo.subscriptions (name, lane, position, kind) VALUES ($1, $2, $3, $4)
ON CONFLICT (name) DO NOTHING
"#;

/// A row created before ordo recorded kinds and roles takes the starting runner's kind, and
/// its role where row security lets it write the row: the row's role may be missing only for
/// the owner (and so an operator), which bypasses it; any other role matches nothing here
/// until an operator assigns the row (`admin::adopt_subscription`). Rows that have both are
/// not touched, so this takes no lock on them.
pub(crate) const ADOPT: &str = r#"
UPDATE ordo.subscriptions
SET kind = coalesce(kind, $2), role = coalesce(role, current_user::text)
WHERE name = $1 AND (kind IS NULL OR role IS NULL)
"#;

/// The row's lane, kind and role, the connected role, and whether it may write the row: it is
/// the row's role or inherits its privileges, or bypasses row security (a superuser, a role
/// with BYPASSRLS, the table's owner or a member of it). A row without a role (from before
/// roles were recorded) is writable only by those that bypass row security.
pub(crate) const IDENTITY: &str = r#"
SELECT s.lane, s.kind, s.role, current_user::text AS connected,
       s.role = current_user::text
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

/// Extends a lease we hold; no row means we lost it. Also reports the row's state, so an
/// operator's pause, resume or reset is seen while idle.
pub(crate) const RENEW: &str = r#"
UPDATE ordo.subscriptions
SET lease_expires_at = now() + make_interval(secs => $3::float8 / 1000)
WHERE name = $1 AND lease_owner = $2
RETURNING position, status, attempts, last_error
"#;

pub(crate) const HALT: &str = r#"
UPDATE ordo.subscriptions
SET status = 'halted', attempts = $3, last_error = $4, updated_at = now()
WHERE name = $1 AND lease_owner = $2 AND position = $5
"#;

pub(crate) const RELEASE: &str = r#"
UPDATE ordo.subscriptions SET lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
WHERE name = $1 AND lease_owner = $2
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
pub(crate) fn attempts_bound(attempts: u32) -> i32 {
    i32::try_from(attempts).unwrap_or(i32::MAX)
}

pub(crate) fn attempts_read(stored: i32) -> u32 {
    u32::try_from(stored).unwrap_or(0)
}

/// Leases travel as milliseconds (`$n::float8 / 1000` in the statements).
pub(crate) fn lease_ms(lease: Duration) -> f64 {
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

/// [`CLAIM`] or [`RENEW`]: the row if `owner` now holds the lease, `None` if another runner
/// does (or it lost it).
pub(crate) async fn lease_statement(
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

/// [`RELEASE`]: gives up `owner`'s lease, if it still holds it.
pub(crate) async fn release(pool: &PgPool, name: &str, owner: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query(RELEASE)
        .bind(name)
        .bind(owner)
        .execute(pool)
        .await?;
    Ok(())
}

/// This file's statements on ordo's hot paths, with sample arguments, for `ops::plans`
/// (`tests/ops/plans.rs` fails if PostgreSQL would JIT-compile any).
pub(crate) const HOT_PATH: &[HotStatement] = &[
    HotStatement {
        name: "subscription: create",
        sql: CREATE,
        types: "text, text, bigint, text",
        args: "'s', 'commit', 0, 'subscription'",
        session: &[],
    },
    HotStatement {
        name: "subscription: adopt",
        sql: ADOPT,
        types: "text, text",
        args: "'s', 'subscription'",
        session: &[],
    },
    HotStatement {
        name: "subscription: identity",
        sql: IDENTITY,
        types: "text",
        args: "'s'",
        session: &[],
    },
    HotStatement {
        name: "subscription: claim",
        sql: CLAIM,
        types: "text, uuid, bigint",
        args: LEASE_ARGS,
        session: &[],
    },
    HotStatement {
        name: "subscription: renew",
        sql: RENEW,
        types: "text, uuid, bigint",
        args: LEASE_ARGS,
        session: &[],
    },
    HotStatement {
        name: "subscription: release",
        sql: RELEASE,
        types: "text, uuid",
        args: "'s', '0190c9d2-0000-7000-8000-000000000001'::uuid",
        session: &[],
    },
];

/// Claim and renew take the same arguments.
const LEASE_ARGS: &str = "'s', '0190c9d2-0000-7000-8000-000000000001'::uuid, 30000";
