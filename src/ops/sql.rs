//! The operations queries, in one place: each statement, and a typed function that runs it.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::postgres::types::PgInterval;
use sqlx::{PgPool, Row};

use super::status::{Backend, LaneLag, PreparedTransaction};
use crate::consumer::{SubscriptionState, SubscriptionStatus};
use crate::position::{CommitSequence, EventSequence};
use crate::position::{Position, read_lane};
use crate::telemetry::HotStatement;

/// The positions, in one statement: drawn head, highest committed row, the commit log's state,
/// and whether commit timestamps are tracked.
pub(crate) const POSITIONS: &str = r#"
SELECT (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM ordo.events_sequence) AS sequence_head,
       coalesce((SELECT max(sequence) FROM ordo.events), 0) AS committed_head,
       s.last_commit_seq, s.logged_through_sequence,
       now() - s.updated_at AS sequencer_idle,
       current_setting('track_commit_timestamp') = 'on' AS commit_timestamps,
       now() AS measured_at
FROM ordo.sequencer_state AS s
"#;

/// What [`POSITIONS`] reads.
#[derive(sqlx::FromRow)]
pub(super) struct Positions {
    pub(super) sequence_head: EventSequence,
    pub(super) committed_head: EventSequence,
    pub(super) last_commit_seq: CommitSequence,
    pub(super) logged_through_sequence: EventSequence,
    pub(super) sequencer_idle: Option<PgInterval>,
    pub(super) commit_timestamps: bool,
    pub(super) measured_at: DateTime<Utc>,
}

pub(super) async fn positions(pool: &PgPool) -> Result<Positions, sqlx::Error> {
    sqlx::query_as(POSITIONS).fetch_one(pool).await
}

/// Events committed above the frontier (waiting on the hole) and the age of the oldest, by
/// commit time where tracked, else by `recorded_at`.
pub(crate) const INSERT_LAG: &str = r#"
SELECT count(*) FILTER (WHERE payload IS NOT NULL) AS events,
       date_part('epoch', now() - min(CASE WHEN $2 THEN coalesce(pg_xact_commit_timestamp(xmin), recorded_at)
                                           ELSE recorded_at END)) AS age
FROM ordo.events WHERE sequence > $1
"#;

pub(super) async fn insert_lag(
    pool: &PgPool,
    frontier: EventSequence,
    commit_timestamps: bool,
) -> Result<LaneLag, sqlx::Error> {
    let row = sqlx::query(INSERT_LAG)
        .bind(frontier)
        .bind(commit_timestamps)
        .fetch_one(pool)
        .await?;
    lane_lag(&row)
}

/// Real events at or below the frontier that the commit log does not hold yet.
pub(crate) const COMMIT_LAG: &str = r#"
SELECT count(*) AS events,
       date_part('epoch', now() - min(CASE WHEN $3 THEN coalesce(pg_xact_commit_timestamp(e.xmin), e.recorded_at)
                                           ELSE e.recorded_at END)) AS age
FROM ordo.events AS e
WHERE e.sequence > $1 AND e.sequence <= $2 AND e.payload IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM ordo.commit_chunks AS c
                  WHERE c.max_sequence >= e.sequence AND e.sequence = ANY (c.sequences))
"#;

pub(super) async fn commit_lag(
    pool: &PgPool,
    logged_through: EventSequence,
    frontier: EventSequence,
    commit_timestamps: bool,
) -> Result<LaneLag, sqlx::Error> {
    let row = sqlx::query(COMMIT_LAG)
        .bind(logged_through)
        .bind(frontier)
        .bind(commit_timestamps)
        .fetch_one(pool)
        .await?;
    lane_lag(&row)
}

fn lane_lag(row: &PgRow) -> Result<LaneLag, sqlx::Error> {
    Ok(LaneLag {
        events: count(row.try_get("events")?),
        seconds: row.try_get("age")?,
    })
}

/// A `count(*)` or a difference of positions, never negative.
fn count(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// Each subscription with its lag, the age of the first event it has not handled, and its dead
/// letters (counted through `dead_letters_subscription_idx`).
pub(crate) const SUBSCRIPTIONS: &str = r#"
SELECT s.name, s.lane, s.position, s.status, s.attempts, s.last_error,
       GREATEST(CASE s.lane WHEN 'commit' THEN $1 ELSE $2 END - s.position, 0) AS lag,
       date_part('epoch', now() - (
           CASE s.lane
           WHEN 'commit' THEN (
               SELECT CASE WHEN $3 THEN coalesce(pg_xact_commit_timestamp(e.xmin), e.recorded_at) ELSE e.recorded_at END
               FROM ordo.commit_log_range(s.position, s.position + 1) AS l
               JOIN ordo.events AS e ON e.sequence = l.sequence)
           ELSE (
               SELECT CASE WHEN $3 THEN coalesce(pg_xact_commit_timestamp(e.xmin), e.recorded_at) ELSE e.recorded_at END
               FROM ordo.events AS e
               WHERE e.sequence > s.position AND e.payload IS NOT NULL
               ORDER BY e.sequence LIMIT 1)
           END)) AS oldest_unprocessed,
       s.lease_owner,
       date_part('epoch', s.lease_expires_at - now()) AS lease_remaining,
       s.sink_down_since, s.sink_down_reason, s.kind, s.role,
       d.dead_letters, d.oldest_dead_letter
FROM ordo.subscriptions AS s
CROSS JOIN LATERAL (
    SELECT count(*) AS dead_letters, min(created_at) AS oldest_dead_letter
    FROM ordo.dead_letters WHERE subscription = s.name) AS d
ORDER BY s.name
"#;

/// Every subscription's progress, its lag measured against these heads; the lease's expiry
/// against `measured_at`, the clock the other figures were read on.
pub(super) async fn subscriptions(
    pool: &PgPool,
    commit_head: CommitSequence,
    committed_head: EventSequence,
    commit_timestamps: bool,
    measured_at: DateTime<Utc>,
) -> Result<Vec<SubscriptionStatus>, sqlx::Error> {
    let rows = sqlx::query(SUBSCRIPTIONS)
        .bind(commit_head)
        .bind(committed_head)
        .bind(commit_timestamps)
        .fetch_all(pool)
        .await?;
    let mut listed = rows
        .iter()
        .map(|row| {
            let lane = read_lane(row, "lane")?;
            let status = row.try_get("status")?;
            let lease_owner: Option<uuid::Uuid> = row.try_get("lease_owner")?;
            let remaining: Option<f64> = row.try_get("lease_remaining")?;
            let leased = lease_owner.is_some() && remaining.is_some_and(|s| s > 0.0);
            Ok(SubscriptionStatus {
                name: row.try_get("name")?,
                lane,
                position: Position::read(row, "position", lane)?,
                lag: count(row.try_get("lag")?),
                state: SubscriptionState::stored(status, leased),
                status,
                attempts: u32::try_from(row.try_get::<i32, _>("attempts")?).unwrap_or(0),
                last_error: row.try_get("last_error")?,
                lease_owner,
                lease_expires_at: remaining
                    .and_then(|s| chrono::Duration::try_milliseconds((s * 1e3) as i64))
                    .map(|left| measured_at + left),
                oldest_unprocessed_seconds: row.try_get("oldest_unprocessed")?,
                stalled: Vec::new(),
                sink_down: crate::consumer::SinkDown::read(row)?,
                dead_letters: Some(crate::consumer::DeadLetterCount::read(row)?),
                backlog: None,
                kind: row.try_get("kind")?,
                role: row.try_get("role")?,
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    crate::consumer::attach_stalled(pool, &mut listed).await?;
    crate::consumer::backlog::attach_backlogs(pool, &mut listed).await?;
    Ok(listed)
}

/// Every dead letter, of every subscription: how many, and the oldest's time.
pub(crate) const DEAD_LETTERS: &str = r#"
SELECT count(*) AS dead_letters, min(created_at) AS oldest_dead_letter FROM ordo.dead_letters
"#;

pub(super) async fn dead_letters(
    pool: &PgPool,
) -> Result<crate::consumer::DeadLetterCount, sqlx::Error> {
    let row = sqlx::query(DEAD_LETTERS).fetch_one(pool).await?;
    crate::consumer::DeadLetterCount::read(&row)
}

/// What operators need to know about a backend. A role without `pg_read_all_stats` sees
/// another role's pid, application name and transaction id, but a NULL state and start time.
const BACKENDS: &str = r#"
SELECT pid, coalesce(application_name, '') AS application_name, coalesce(state, '') AS state,
       date_part('epoch', now() - xact_start) AS transaction_age,
       left(coalesce(query, ''), 200) AS query
FROM pg_stat_activity
WHERE pid = ANY($1)
ORDER BY age(backend_xid) DESC NULLS LAST, xact_start, pid
"#;

pub(super) async fn backends(pool: &PgPool, pids: &[i32]) -> Result<Vec<Backend>, sqlx::Error> {
    if pids.is_empty() {
        return Ok(Vec::new());
    }
    let rows = sqlx::query(BACKENDS).bind(pids).fetch_all(pool).await?;
    rows.iter()
        .map(|row| {
            Ok(Backend {
                pid: row.try_get("pid")?,
                application_name: row.try_get("application_name")?,
                state: row.try_get("state")?,
                transaction_seconds: row.try_get("transaction_age")?,
                query: row.try_get("query")?,
            })
        })
        .collect()
}

/// Open transactions of this database that have drawn from `ordo.events_sequence`: `nextval`
/// holds a `RowExclusiveLock` on the sequence until its transaction ends, so the transaction
/// behind an unresolved sequence, while it lives, is one of these. Read-only (`pg_locks` is
/// public), and it never lists ordo's own placeholder writes, which name their sequences
/// instead of drawing them. Oldest transaction id first.
const SEQUENCE_DRAWERS: &str = r#"
SELECT l.pid
FROM pg_locks AS l
LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.mode = 'RowExclusiveLock' AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.relation = 'ordo.events_sequence'::regclass
  AND l.pid IS NOT NULL AND l.pid <> pg_backend_pid()
ORDER BY age(a.backend_xid) DESC NULLS LAST, l.pid
"#;

/// The pids of [`SEQUENCE_DRAWERS`].
pub(super) async fn sequence_drawers(pool: &PgPool) -> Result<Vec<i32>, sqlx::Error> {
    sqlx::query_scalar(SEQUENCE_DRAWERS).fetch_all(pool).await
}

/// Prepared transactions (two-phase commit) that have drawn from `ordo.events_sequence`: they
/// keep the sequence's lock with no backend (`pid` NULL), and their own transaction id lock
/// ties the lock to `pg_prepared_xacts`.
const PREPARED_DRAWERS: &str = r#"
SELECT p.gid, p.owner::text AS owner, p.transaction::text AS transaction,
       date_part('epoch', now() - p.prepared) AS prepared_age
FROM pg_locks AS s
JOIN pg_locks AS x
  ON x.virtualtransaction = s.virtualtransaction AND x.locktype = 'transactionid'
 AND x.mode = 'ExclusiveLock'
JOIN pg_prepared_xacts AS p ON p.transaction = x.transactionid
WHERE s.locktype = 'relation' AND s.mode = 'RowExclusiveLock' AND s.pid IS NULL
  AND s.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND s.relation = 'ordo.events_sequence'::regclass
ORDER BY p.prepared
"#;

pub(super) async fn prepared_drawers(
    pool: &PgPool,
) -> Result<Vec<PreparedTransaction>, sqlx::Error> {
    let rows = sqlx::query(PREPARED_DRAWERS).fetch_all(pool).await?;
    rows.iter()
        .map(|row| {
            Ok(PreparedTransaction {
                gid: row.try_get("gid")?,
                owner: row.try_get("owner")?,
                transaction_id: row.try_get("transaction")?,
                prepared_seconds: row.try_get("prepared_age")?,
            })
        })
        .collect()
}

/// This file's statements on ordo's hot paths, with sample arguments, for `ops::plans`
/// (`tests/ops/plans.rs` fails if PostgreSQL would JIT-compile any).
pub(crate) const HOT_PATH: &[HotStatement] = &[
    HotStatement {
        name: "status: positions",
        sql: POSITIONS,
        types: "",
        args: "",
        session: &[],
    },
    HotStatement {
        name: "status: insert lag",
        sql: INSERT_LAG,
        types: "bigint, boolean",
        args: "0, false",
        session: &[],
    },
    HotStatement {
        name: "status: commit lag",
        sql: COMMIT_LAG,
        types: "bigint, bigint, boolean",
        args: "0, 100, false",
        session: &[],
    },
    HotStatement {
        name: "status: subscriptions",
        sql: SUBSCRIPTIONS,
        types: "bigint, bigint, boolean",
        args: "100, 100, false",
        session: &[],
    },
];
