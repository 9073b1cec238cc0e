//! The sequencer's statements as typed calls: what each sends and what comes back.

use std::collections::HashMap;

use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};

use super::LogEntry;
use super::sql::{APPEND, CATCH_UP, HEAD_AND_CURSOR, RESTART};
use crate::error::Result;
use crate::insert_lane::OwnCommit;
use crate::position::{CommitSequence, EventSequence, ServerHistory};
use crate::telemetry::metrics as m;

/// A peer further ahead than this many entries is followed by a restart (one statement that
/// reads only what lies above the cursor) rather than by reading every entry it appended.
const CATCH_UP_MAX: i64 = 8192;

/// The state row as read at a restart.
pub(crate) struct Restart {
    pub(crate) head: u64,
    pub(crate) cursor: u64,
    /// Groups logged above the cursor: commit_xid → highest logged sequence.
    pub(crate) logged: HashMap<i64, u64>,
    /// The server's newest history and when it started, in the same snapshot.
    pub(crate) server: ServerRead,
}

/// One group of an append's plan: its transaction and the first (lowest) sequence the fold met.
#[derive(Clone, Debug)]
pub(crate) struct Planned {
    pub(crate) xid: i64,
    pub(crate) low: u64,
    /// Committed by this process: the sequencer appends it without waiting for a peer.
    pub(crate) own: bool,
    /// The group's members, when they are known before the append: this process committed it
    /// through `commit`, and the fold met first the lowest sequence that commit inserted (so
    /// no row of the transaction lies below it; see `sequencer::promise`).
    pub(crate) members: Option<OwnCommit>,
}

/// One entry an append wrote, with the plan group (1-based) it belongs to (0: none).
pub(crate) struct AppendedEntry {
    pub(crate) entry: LogEntry,
    pub(crate) ord: usize,
}

/// How an append ended.
pub(crate) enum Appended {
    Done(Vec<AppendedEntry>),
    /// A peer moved the cursor first.
    Refused,
}

/// What peers appended since this process's head, as [`CATCH_UP`] read it.
pub(crate) struct PeerAppends {
    pub(crate) head: u64,
    pub(crate) cursor: u64,
    /// The server's newest history and when it started, in the same snapshot.
    pub(crate) server: ServerRead,
    /// Each entry with its event's transaction.
    pub(crate) entries: Vec<(LogEntry, i64)>,
}

pub(crate) async fn restart(pool: &PgPool) -> Result<Restart> {
    metrics::counter!(m::FOLD_RESTARTS).increment(1);
    let row = sqlx::query(RESTART).fetch_one(pool).await?;
    let xids: Vec<i64> = row.try_get("xids")?;
    let maxes: Vec<EventSequence> = row.try_get("maxes")?;
    Ok(Restart {
        head: row.try_get::<CommitSequence, _>("last_commit_seq")?.get(),
        cursor: row
            .try_get::<EventSequence, _>("logged_through_sequence")?
            .get(),
        logged: xids
            .into_iter()
            .zip(maxes.into_iter().map(EventSequence::get))
            .collect(),
        server: server(&row)?,
    })
}

/// Appends the groups first met in `(expected, covered]` if the cursor is still `expected`,
/// moving it to `covered`; each entry is matched to its group of `plan` (the same groups, in
/// log order, as the fold planned them).
pub(crate) async fn append(
    pool: &PgPool,
    expected: u64,
    covered: u64,
    plan: &[Planned],
) -> Result<Appended> {
    let rows = sqlx::query(APPEND)
        .bind(EventSequence::new(expected))
        .bind(EventSequence::new(covered))
        .fetch_all(pool)
        .await?;
    if rows.is_empty() {
        return Ok(Appended::Refused);
    }
    // 1-based, as `record_appended` reads it; 0 for a transaction the plan does not name.
    let ords: HashMap<i64, usize> = plan
        .iter()
        .enumerate()
        .map(|(index, group)| (group.xid, index + 1))
        .collect();
    let mut entries = Vec::with_capacity(rows.len());
    for row in &rows {
        let xid: Option<i64> = row.try_get("commit_xid")?;
        if let (Some(entry), Some(xid)) = (log_entry(row)?, xid) {
            entries.push(AppendedEntry {
                entry,
                ord: ords.get(&xid).copied().unwrap_or(0),
            });
        }
    }
    Ok(Appended::Done(entries))
}

/// What peers appended above `head`; `None` when they are too far ahead to read it all.
pub(crate) async fn catch_up(pool: &PgPool, head: u64) -> Result<Option<PeerAppends>> {
    let rows = sqlx::query(CATCH_UP)
        .bind(CommitSequence::new(head))
        .bind(CATCH_UP_MAX)
        .fetch_all(pool)
        .await?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let peer_head = first.try_get::<CommitSequence, _>("last_commit_seq")?.get();
    let cursor = first
        .try_get::<EventSequence, _>("logged_through_sequence")?
        .get();
    let server = server(first)?;
    let mut entries = Vec::with_capacity(rows.len());
    for row in &rows {
        let xid: Option<i64> = row.try_get("commit_xid")?;
        if let (Some(entry), Some(xid)) = (log_entry(row)?, xid) {
            entries.push((entry, xid));
        }
    }
    // Every entry above our head must be here, in order, or we fall back to a restart.
    let complete = peer_head >= head
        && entries.len() as u64 == peer_head - head
        && entries
            .iter()
            .enumerate()
            .all(|(i, (e, _))| e.commit_seq == head + 1 + i as u64);
    Ok(complete.then_some(PeerAppends {
        head: peer_head,
        cursor,
        server,
        entries,
    }))
}

/// Tells other processes' sequencers on `channel` (the wake-up channel) that this one appended
/// up to `head`, or, from a yielding one, that it leaves its appends to them (see
/// [`turns`](super::turns)).
pub(crate) async fn announce(
    pool: &PgPool,
    channel: &str,
    covered: u64,
    instance: u64,
    head: u64,
) -> Result<()> {
    sqlx::query(crate::insert_lane::wakeup::NOTIFY)
        .bind(channel)
        .bind(crate::insert_lane::wakeup::log_payload(
            covered, instance, head,
        ))
        .execute(pool)
        .await?;
    Ok(())
}

/// The log head as the watcher reads it.
pub(crate) struct HeadRead {
    pub(crate) head: u64,
    /// How far the log covers the insert lane.
    pub(crate) cursor: u64,
    /// The server's newest history and when it started, in the same snapshot.
    pub(crate) server: ServerRead,
}

/// The log head, how far it covers the insert lane, and the newest server history.
pub(crate) async fn head_and_cursor(pool: &PgPool) -> Result<HeadRead> {
    let row = sqlx::query(HEAD_AND_CURSOR).fetch_one(pool).await?;
    Ok(HeadRead {
        head: row.try_get::<CommitSequence, _>("last_commit_seq")?.get(),
        cursor: row
            .try_get::<EventSequence, _>("logged_through_sequence")?
            .get(),
        server: server(&row)?,
    })
}

/// What a read of the log's state learns of the server itself (see
/// [`WentBack`](super::went_back::WentBack)).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ServerRead {
    /// The newest server history of the log.
    pub(crate) history: Option<ServerHistory>,
    /// The PostgreSQL timeline that history was begun on.
    pub(crate) timeline: Option<u32>,
    /// When the server last started (`pg_postmaster_start_time()`, in microseconds since the
    /// epoch): a change is a restart, after which appends and, with `synchronous_commit` off,
    /// transactions the crash lost may be gone on the same history.
    pub(crate) started: Option<i64>,
}

/// The server's history and start from a row with `history`, `history_from`,
/// `history_timeline` and `server_started`.
fn server(row: &PgRow) -> Result<ServerRead> {
    let timeline: Option<i32> = row.try_get("history_timeline")?;
    Ok(ServerRead {
        history: history(row)?,
        timeline: timeline.and_then(|timeline| u32::try_from(timeline).ok()),
        started: row.try_get("server_started")?,
    })
}

/// The newest server history from a row with `history` and `history_from` (NULL: none yet).
fn history(row: &PgRow) -> Result<Option<ServerHistory>> {
    let id: Option<i64> = row.try_get("history")?;
    let from: Option<i64> = row.try_get("history_from")?;
    Ok(match (id, from) {
        (Some(id), Some(from)) => u64::try_from(id)
            .ok()
            .zip(u64::try_from(from).ok())
            .map(|(id, first_position)| ServerHistory { id, first_position }),
        _ => None,
    })
}

/// A log entry from a row with `commit_seq`, `sequence` and `group_last`, all NULL for none.
fn log_entry(row: &PgRow) -> Result<Option<LogEntry>> {
    let (Some(commit_seq), Some(sequence), Some(group_last)) = (
        row.try_get::<Option<CommitSequence>, _>("commit_seq")?,
        row.try_get::<Option<EventSequence>, _>("sequence")?,
        row.try_get::<Option<bool>, _>("group_last")?,
    ) else {
        return Ok(None);
    };
    Ok(Some(LogEntry {
        commit_seq: commit_seq.get(),
        sequence: sequence.get(),
        group_last,
    }))
}
