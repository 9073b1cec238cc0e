//! [`OutboxStatus`]: is it delivering, how far behind is each consumer, and if it is stuck,
//! who is holding it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};

use super::sql;
use crate::error::Result;
use crate::insert_lane::rows::{initial_frontier, to_i64, to_u64};
use crate::position::{CommitSequence, EventSequence};
use crate::subscription::handle::{Position, read_lane};
use crate::subscription::{SubscriptionState, SubscriptionStatus};

/// Which clock the ages are measured on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LagClock {
    /// `track_commit_timestamp` is on: ages run from the source transaction's commit.
    CommitTimestamp,
    /// Ages run from `recorded_at`, the source transaction's start (an overestimate by the
    /// transaction's duration). Turn on `track_commit_timestamp` for commit-time lag.
    RecordedAt,
}

/// How far a lane is behind.
#[derive(Debug, Clone, Default, Serialize)]
#[non_exhaustive]
pub struct LaneLag {
    /// Committed events the lane has not passed yet.
    pub events: u64,
    /// The age of the oldest of them, in seconds, on [`OutboxStatus::lag_clock`].
    pub seconds: Option<f64>,
}

/// A database backend, as `pg_stat_activity` shows it.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Backend {
    /// Its process id (`pg_terminate_backend(pid)` ends it).
    pub pid: i32,
    /// Its `application_name`.
    pub application_name: String,
    /// Its state (`active`, `idle in transaction`, …).
    pub state: String,
    /// Seconds since its transaction started.
    pub transaction_seconds: Option<f64>,
    /// The first 200 characters of its current or last query.
    pub query: String,
}

/// A lane waiting on something, and who is holding it.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Stall {
    /// `insert` or `commit`.
    pub lane: &'static str,
    /// What the lane waits on, in words.
    pub reason: String,
    /// The unresolved sequence the insert lane waits on.
    pub waiting_on: Option<EventSequence>,
    /// How long it has been waiting, in seconds, at least.
    pub seconds: Option<f64>,
    /// The transaction holding it, when only one open transaction could be (the only one that
    /// has drawn an event sequence and not ended).
    pub holder: Option<Backend>,
    /// When several could: the open transactions that have drawn an event sequence, oldest
    /// first; one of them holds the lane.
    pub suspects: Vec<Backend>,
    /// Prepared transactions (`PREPARE TRANSACTION`) that have drawn an event sequence: they
    /// hold it until `COMMIT PREPARED` or `ROLLBACK PREPARED`, whatever happens to the session
    /// that prepared them.
    pub prepared: Vec<PreparedTransaction>,
}

/// A prepared transaction, as `pg_prepared_xacts` shows it.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct PreparedTransaction {
    /// Its global identifier (`COMMIT PREPARED 'gid'` ends it).
    pub gid: String,
    /// The role that prepared it.
    pub owner: String,
    /// Its transaction id.
    pub transaction_id: String,
    /// Seconds since it was prepared.
    pub prepared_seconds: Option<f64>,
}

/// Everything `ordo status` shows.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct OutboxStatus {
    /// When the figures were read (database clock).
    pub measured_at: DateTime<Utc>,
    /// The highest sequence drawn (committed or not).
    pub sequence_head: EventSequence,
    /// The highest committed sequence.
    pub committed_head: EventSequence,
    /// Every sequence at or below it is resolved (an event or a placeholder).
    pub insert_frontier: EventSequence,
    /// Rows in the commit log.
    pub commit_head: CommitSequence,
    /// Every real event at or below it is in the commit log.
    pub logged_through_sequence: EventSequence,
    /// Seconds since a sequencer last appended.
    pub sequencer_idle_seconds: Option<f64>,
    /// The clock ages are measured on.
    pub lag_clock: LagClock,
    /// Committed events above the insert frontier (waiting on a hole).
    pub insert_lane: LaneLag,
    /// Resolved real events the commit log does not hold yet.
    pub commit_lane: LaneLag,
    /// Every durable subscription, with the age of its oldest unhandled event.
    pub subscriptions: Vec<SubscriptionStatus>,
    /// What holds a lane back, with the transaction responsible where it can be named.
    pub stalls: Vec<Stall>,
    /// Rows above [`sequence_head`](Self::sequence_head) (the first ten): rows no publish
    /// wrote, inserted with an explicit `sequence` (or left by a sequence set back). They break
    /// the schema contract: the insert lane waits at the head rather than fill placeholders up
    /// to them, and a publish that draws one of their sequences fails with a duplicate key.
    /// Delete them, or move `ordo.events_sequence` past them with `setval`. Normally empty.
    pub rows_above_head: Vec<EventSequence>,
}

/// Below this, a wait is a transaction committing out of order, not a stall worth naming.
const STALL_AFTER: Duration = Duration::from_millis(200);

fn seconds(row: &PgRow, column: &str) -> Result<Option<f64>> {
    Ok(row.try_get::<Option<f64>, _>(column)?)
}

/// Reads the outbox's state from the database behind `pool`, names the transactions holding a
/// lane, and returns it all. Cheap on large tables while a sequencer keeps up (every query is
/// bounded by the frontier or the log's cursor). It only reads: a role with `SELECT` on the
/// `ordo` schema is enough (add `pg_read_all_stats` to see other roles' states and queries).
///
/// # Errors
/// [`Error::Database`](crate::Error::Database) if a query fails (for instance, the schema is
/// not migrated).
pub async fn status(pool: &PgPool) -> Result<OutboxStatus> {
    let row = sqlx::query(sql::POSITIONS).fetch_one(pool).await?;
    let sequence_head = to_u64(row.try_get("sequence_head")?);
    let committed_head = to_u64(row.try_get("committed_head")?);
    let commit_head = to_u64(row.try_get("last_commit_seq")?);
    let logged_through = to_u64(row.try_get("logged_through_sequence")?);
    let idle: Option<sqlx::postgres::types::PgInterval> = row.try_get("sequencer_idle")?;
    let commit_timestamps: bool = row.try_get("commit_timestamps")?;
    let measured_at: DateTime<Utc> = row.try_get("measured_at")?;
    let frontier = initial_frontier(pool).await?;

    let lag = sqlx::query(sql::INSERT_LAG)
        .bind(to_i64(frontier))
        .bind(commit_timestamps)
        .fetch_one(pool)
        .await?;
    let insert_lane = LaneLag {
        events: to_u64(lag.try_get("events")?),
        seconds: seconds(&lag, "age")?,
    };
    let lag = sqlx::query(sql::COMMIT_LAG)
        .bind(to_i64(logged_through))
        .bind(to_i64(frontier))
        .bind(commit_timestamps)
        .fetch_one(pool)
        .await?;
    let commit_lane = LaneLag {
        events: to_u64(lag.try_get("events")?),
        seconds: seconds(&lag, "age")?,
    };
    let subscriptions = subscriptions(
        pool,
        commit_head,
        committed_head,
        commit_timestamps,
        measured_at,
    )
    .await?;
    let sequencer_idle_seconds =
        idle.map(|i| i.microseconds as f64 / 1e6 + i.days as f64 * 86_400.0);

    let rows_above_head = rows_above_head(pool, sequence_head, committed_head).await?;
    let mut stalls = Vec::new();
    let stuck_for = insert_lane.seconds.unwrap_or(0.0);
    if insert_lane.events > 0 && stuck_for >= STALL_AFTER.as_secs_f64() {
        if frontier >= sequence_head && !rows_above_head.is_empty() {
            // Nobody holds the hole: no transaction has drawn it yet.
            stalls.push(Stall {
                lane: "insert",
                reason: format!(
                    "rows above the sequence head {sequence_head} (first: {}) were not written by a publish; the lane waits for writers to draw up to them",
                    rows_above_head[0]
                ),
                waiting_on: Some(EventSequence::new(frontier + 1)),
                seconds: Some(stuck_for),
                holder: None,
                suspects: Vec::new(),
                prepared: Vec::new(),
            });
        } else {
            stalls.push(insert_stall(pool, frontier + 1, stuck_for).await?);
        }
    }
    let folded_late = commit_lane.seconds.unwrap_or(0.0);
    if commit_lane.events > 0 && folded_late >= 1.0 {
        stalls.push(Stall {
            lane: "commit",
            reason: format!(
                "{} resolved events wait for the sequencer, which last appended {} ago; is any process folding (an Outbox with the sequencer on, or `ordo fold`)?",
                commit_lane.events,
                sequencer_idle_seconds.map_or("never".to_owned(), |s| format!("{s:.1}s"))
            ),
            waiting_on: None,
            seconds: Some(folded_late),
            holder: None,
            suspects: Vec::new(),
            prepared: Vec::new(),
        });
    }
    Ok(OutboxStatus {
        measured_at,
        sequence_head: EventSequence::new(sequence_head),
        committed_head: EventSequence::new(committed_head),
        insert_frontier: EventSequence::new(frontier),
        commit_head: CommitSequence::new(commit_head),
        logged_through_sequence: EventSequence::new(logged_through),
        sequencer_idle_seconds,
        lag_clock: if commit_timestamps {
            LagClock::CommitTimestamp
        } else {
            LagClock::RecordedAt
        },
        insert_lane,
        commit_lane,
        subscriptions,
        stalls,
        rows_above_head,
    })
}

/// Rows above the sequence head, which no legitimate writer leaves (it draws its sequence
/// before inserting). Free unless the highest committed row is above the head.
async fn rows_above_head(
    pool: &PgPool,
    sequence_head: u64,
    committed_head: u64,
) -> Result<Vec<EventSequence>> {
    if committed_head <= sequence_head {
        return Ok(Vec::new());
    }
    let rows = crate::insert_lane::rows::rows_above(pool, sequence_head).await?;
    Ok(rows
        .into_iter()
        .map(|(sequence, _)| EventSequence::new(sequence))
        .collect())
}

async fn subscriptions(
    pool: &PgPool,
    commit_head: u64,
    committed_head: u64,
    commit_timestamps: bool,
    measured_at: DateTime<Utc>,
) -> Result<Vec<SubscriptionStatus>> {
    let rows = sqlx::query(sql::SUBSCRIPTIONS)
        .bind(to_i64(commit_head))
        .bind(to_i64(committed_head))
        .bind(commit_timestamps)
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|row| {
            let lane = read_lane(row, "lane")?;
            let status = row.try_get("status")?;
            let lease_owner: Option<uuid::Uuid> = row.try_get("lease_owner")?;
            let remaining = seconds(row, "lease_remaining")?;
            let leased = lease_owner.is_some() && remaining.is_some_and(|s| s > 0.0);
            Ok(SubscriptionStatus {
                name: row.try_get("name")?,
                lane,
                position: Position::read(row, "position", lane)?,
                lag: to_u64(row.try_get("lag")?),
                state: SubscriptionState::stored(status, leased),
                status,
                attempts: u32::try_from(row.try_get::<i32, _>("attempts")?).unwrap_or(0),
                last_error: row.try_get("last_error")?,
                lease_owner,
                // Against the clock the other figures were read on, so that the remaining
                // time renders as the database measured it.
                lease_expires_at: remaining
                    .and_then(|s| chrono::Duration::try_milliseconds((s * 1e3) as i64))
                    .map(|left| measured_at + left),
                oldest_unprocessed_seconds: seconds(row, "oldest_unprocessed")?,
            })
        })
        .collect()
}

/// Names the transaction holding `hole`, without writing anything (a monitoring role may only
/// read, and a probe write could collide with the very writer it looks for).
///
/// The transaction that drew `hole` keeps a lock on `ordo.events_sequence` until it ends, so
/// while it lives it is one of the transactions holding that lock: one of them is the holder,
/// and when there is only one it is named as such. No such transaction means the writer has
/// already ended and the lane will prove the hole abandoned.
async fn insert_stall(pool: &PgPool, hole: u64, stuck_for: f64) -> Result<Stall> {
    let pids: Vec<i32> = sqlx::query_scalar(sql::SEQUENCE_DRAWERS)
        .fetch_all(pool)
        .await?;
    let live = backends(pool, &pids).await?;
    let prepared = prepared_drawers(pool).await?;
    let candidates = live.len() + prepared.len();
    let (holder, reason) = match (live.as_slice(), prepared.as_slice()) {
        ([only], []) => (
            Some(only.clone()),
            format!(
                "sequence {hole} is held by an open transaction that has not committed (pid {}, the only open transaction that has drawn an event sequence)",
                only.pid
            ),
        ),
        ([], [only]) => (
            None,
            format!(
                "sequence {hole} is held by prepared transaction {:?} (owner {}, prepared {} ago): finish it with COMMIT PREPARED or ROLLBACK PREPARED",
                only.gid,
                only.owner,
                only.prepared_seconds
                    .map_or("an unknown time".to_owned(), |s| format!("{s:.1}s"))
            ),
        ),
        ([], []) => (
            None,
            format!(
                "sequence {hole} has no row and no open transaction has drawn an event sequence: its writer ended without committing it, and a running ordo process (an Outbox, or `ordo fold`) will prove it abandoned and move on"
            ),
        ),
        _ => (
            None,
            format!(
                "sequence {hole} is held by one of the {candidates} open transactions that have drawn an event sequence (oldest first); which one cannot be told without writing"
            ),
        ),
    };
    let suspects = if holder.is_some() { Vec::new() } else { live };
    Ok(Stall {
        lane: "insert",
        reason,
        waiting_on: Some(EventSequence::new(hole)),
        seconds: Some(stuck_for),
        holder,
        suspects,
        prepared,
    })
}

async fn prepared_drawers(pool: &PgPool) -> Result<Vec<PreparedTransaction>> {
    let rows = sqlx::query(sql::PREPARED_DRAWERS).fetch_all(pool).await?;
    rows.iter()
        .map(|row| {
            Ok(PreparedTransaction {
                gid: row.try_get("gid")?,
                owner: row.try_get("owner")?,
                transaction_id: row.try_get("transaction")?,
                prepared_seconds: seconds(row, "prepared_age")?,
            })
        })
        .collect()
}

async fn backends(pool: &PgPool, pids: &[i32]) -> Result<Vec<Backend>> {
    if pids.is_empty() {
        return Ok(Vec::new());
    }
    let rows = sqlx::query(sql::BACKENDS)
        .bind(pids)
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|row| {
            Ok(Backend {
                pid: row.try_get("pid")?,
                application_name: row.try_get("application_name")?,
                state: row.try_get("state")?,
                transaction_seconds: seconds(row, "transaction_age")?,
                query: row.try_get("query")?,
            })
        })
        .collect()
}
