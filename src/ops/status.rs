//! [`OutboxStatus`]: is it delivering, how far behind is each consumer, and if it is stuck,
//! who is holding it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use super::sql;
use crate::consumer::SubscriptionStatus;
use crate::error::Result;
use crate::insert_lane::heads::initial_frontier;
use crate::position::{CommitSequence, EventSequence, Ordering};

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
    /// The lane held back.
    pub lane: Ordering,
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
    /// Events in the default partition `ordo.events_default`: the partitions made ahead ran out
    /// (no maintainer ran, or its role may not create tables). Writes still succeed; `ordo
    /// retention --apply`, as a role that owns `ordo.events`, folds them into a range
    /// partition. Normally 0.
    pub default_partition_events: u64,
    /// Migrations recorded in `ordo._sqlx_migrations` that this build of ordo does not know,
    /// oldest first: a newer ordo migrated the database, and this one reads a schema it was
    /// not written for. Empty too when this role may not read that table. Normally empty.
    pub unknown_migrations: Vec<i64>,
    /// Every dead letter in `ordo.dead_letters`, of every subscription (also of one whose row
    /// was deleted since): how many, and when the oldest was written. Each subscription's own
    /// are in its [`SubscriptionStatus::dead_letters`]. Normally 0: each is an event a handler
    /// gave up on, waiting for an operator (`ordo dead-letters list`, `retry`, `purge`).
    pub dead_letters: crate::consumer::DeadLetterCount,
    /// The receiving side, where this database runs an inbox: consumers holding failed
    /// messages, and each watermark consumer's marks with what holds them (a failing message,
    /// a gap that outlived [`GAP_SHOWN_AFTER`](crate::inbox::GAP_SHOWN_AFTER)). Empty
    /// elsewhere.
    pub inbox: crate::inbox::InboxStatus,
    /// What an operator should act on that is not a stall, one sentence each (the default
    /// partition holding events, a schema migrated by a newer ordo); `ordo status` prints each
    /// as a `warning:` line. Normally empty.
    pub warnings: Vec<String>,
}

/// Below this, a wait is a transaction committing out of order, not a stall worth naming.
const STALL_AFTER: Duration = Duration::from_millis(200);

/// Reads the outbox's state from the database behind `pool`, names the transactions holding a
/// lane, and returns it all. Cheap on large tables while a sequencer keeps up (every query is
/// bounded by the frontier or the log's cursor). It only reads: a role with `SELECT` on the
/// `ordo` schema is enough (add `pg_read_all_stats` to see other roles' states and queries).
///
/// # Errors
/// [`Error::Database`](crate::Error::Database) if a query fails (for instance, the schema is
/// not migrated).
pub async fn status(pool: &PgPool) -> Result<OutboxStatus> {
    let at = sql::positions(pool).await?;
    let frontier = EventSequence::new(initial_frontier(pool).await?);
    let insert_lane = sql::insert_lag(pool, frontier, at.commit_timestamps).await?;
    let commit_lane = sql::commit_lag(
        pool,
        at.logged_through_sequence,
        frontier,
        at.commit_timestamps,
    )
    .await?;
    let subscriptions = sql::subscriptions(
        pool,
        at.last_commit_seq,
        at.committed_head,
        at.commit_timestamps,
        at.measured_at,
    )
    .await?;
    let sequencer_idle_seconds = idle_seconds(&at);
    let rows_above_head = rows_above_head(pool, at.sequence_head, at.committed_head).await?;
    let dead_letters = sql::dead_letters(pool).await?;
    let inbox = crate::inbox::status::inbox_status(pool).await?;
    let (default_partition_events, default_warning) =
        crate::ops::retention::default_partition(pool).await?;
    let unknown_migrations = crate::migrate::unknown_migrations(pool).await?;
    let warnings = schema_warning(&unknown_migrations)
        .into_iter()
        .chain(default_warning)
        .collect();
    let stalls = stalls(
        pool,
        &at,
        frontier,
        &insert_lane,
        &commit_lane,
        &rows_above_head,
    )
    .await?;
    Ok(OutboxStatus {
        measured_at: at.measured_at,
        sequence_head: at.sequence_head,
        committed_head: at.committed_head,
        insert_frontier: frontier,
        commit_head: at.last_commit_seq,
        logged_through_sequence: at.logged_through_sequence,
        sequencer_idle_seconds,
        lag_clock: if at.commit_timestamps {
            LagClock::CommitTimestamp
        } else {
            LagClock::RecordedAt
        },
        insert_lane,
        commit_lane,
        subscriptions,
        stalls,
        rows_above_head,
        default_partition_events,
        unknown_migrations,
        dead_letters,
        inbox,
        warnings,
    })
}

/// What holds each lane, once it has waited long enough to call it a stall.
async fn stalls(
    pool: &PgPool,
    at: &sql::Positions,
    frontier: EventSequence,
    insert_lane: &LaneLag,
    commit_lane: &LaneLag,
    rows_above_head: &[EventSequence],
) -> Result<Vec<Stall>> {
    let mut stalls = Vec::new();
    let stuck_for = insert_lane.seconds.unwrap_or(0.0);
    if insert_lane.events > 0 && stuck_for >= STALL_AFTER.as_secs_f64() {
        if frontier >= at.sequence_head && !rows_above_head.is_empty() {
            // Nobody holds the hole: no transaction has drawn it yet.
            let reason = format!(
                "rows above the sequence head {} (first: {}) were not written by a publish; the lane waits for writers to draw up to them",
                at.sequence_head, rows_above_head[0]
            );
            stalls.push(Stall {
                waiting_on: Some(frontier.next()),
                ..Stall::new(Ordering::Insert, reason, stuck_for)
            });
        } else {
            stalls.push(insert_stall(pool, frontier.next(), stuck_for).await?);
        }
    }
    let folded_late = commit_lane.seconds.unwrap_or(0.0);
    if commit_lane.events > 0 && folded_late >= 1.0 {
        let reason = format!(
            "{} resolved events wait for the sequencer, which last appended {} ago; is any process folding (an Outbox with the sequencer on, or `ordo fold`)?",
            commit_lane.events,
            idle_seconds(at).map_or("never".to_owned(), |s| format!("{s:.1}s"))
        );
        stalls.push(Stall::new(Ordering::Commit, reason, folded_late));
    }
    Ok(stalls)
}

/// Seconds since the sequencer last appended, as the state row says.
fn idle_seconds(at: &sql::Positions) -> Option<f64> {
    at.sequencer_idle
        .map(|i| i.microseconds as f64 / 1e6 + i.days as f64 * 86_400.0)
}

/// Every subscription and relay, by name, as [`status`] reports them:
/// each one's `state` says whether some runner holds a live lease (see
/// [`SubscriptionStatus`]), with its lag, the age of its oldest unhandled event, its dead
/// letters and its stalled keys.
///
/// # Errors
/// [`Error::Database`](crate::Error::Database) if the table cannot be read.
pub async fn list_subscriptions(pool: &PgPool) -> Result<Vec<SubscriptionStatus>> {
    let at = sql::positions(pool).await?;
    Ok(sql::subscriptions(
        pool,
        at.last_commit_seq,
        at.committed_head,
        at.commit_timestamps,
        at.measured_at,
    )
    .await?)
}

/// The warning for migrations this build does not know, if there are any.
fn schema_warning(unknown: &[i64]) -> Option<String> {
    let newest = unknown.last()?;
    let known = crate::migrate::newest_known();
    let listed: Vec<String> = unknown.iter().map(i64::to_string).collect();
    Some(format!(
        "ordo._sqlx_migrations holds {} migration(s) this ordo does not know ({}; the newest it knows is {known}): \
         a newer ordo migrated this database{}. Run that version (or newer) of ordo and its CLI against it",
        unknown.len(),
        listed.join(", "),
        if *newest > known {
            ""
        } else {
            " (or one from another branch)"
        }
    ))
}

/// Rows above the sequence head, which no legitimate writer leaves (it draws its sequence
/// before inserting). Free unless the highest committed row is above the head.
async fn rows_above_head(
    pool: &PgPool,
    sequence_head: EventSequence,
    committed_head: EventSequence,
) -> Result<Vec<EventSequence>> {
    if committed_head <= sequence_head {
        return Ok(Vec::new());
    }
    let rows = crate::insert_lane::heads::rows_above(pool, sequence_head.get()).await?;
    Ok(rows
        .into_iter()
        .map(|(sequence, _)| EventSequence::new(sequence))
        .collect())
}

/// Names the transaction holding `hole`, without writing anything (a monitoring role may only
/// read, and a probe write could collide with the very writer it looks for).
///
/// The transaction that drew `hole` keeps a lock on `ordo.events_sequence` until it ends, so
/// while it lives it is one of the transactions holding that lock: one of them is the holder,
/// and when there is only one it is named as such. No such transaction means the writer has
/// already ended and the lane will prove the hole abandoned.
async fn insert_stall(pool: &PgPool, hole: EventSequence, stuck_for: f64) -> Result<Stall> {
    let pids = sql::sequence_drawers(pool).await?;
    let live = sql::backends(pool, &pids).await?;
    let prepared = sql::prepared_drawers(pool).await?;
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
        waiting_on: Some(hole),
        holder,
        suspects,
        prepared,
        ..Stall::new(Ordering::Insert, reason, stuck_for)
    })
}

impl Stall {
    /// A stall of `lane` for `seconds`, with no transaction named yet.
    fn new(lane: Ordering, reason: String, seconds: f64) -> Self {
        Self {
            lane,
            reason,
            waiting_on: None,
            seconds: Some(seconds),
            holder: None,
            suspects: Vec::new(),
            prepared: Vec::new(),
        }
    }
}
