//! A relay event's attempt history (`ordo.relay_attempts`, migration
//! `20261205000100_relay_attempts.sql`): every failed attempt with its time, error and the
//! process that sent it, written in the transaction of the marks that count it, and read by
//! [`relay_attempts`] ("was this event sent, when, and why not").

use std::sync::OnceLock;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use super::marks::Mark;
use crate::error::{Error, Result};
use crate::position::{Position, read_lane};
use crate::telemetry::HotStatement;

/// Attempts kept per event: the newest.
pub(crate) const KEPT: i32 = 20;

/// One failed attempt, then the event's attempts past the newest [`KEPT`] and every attempt
/// of events retention dropped (below the oldest stored sequence) go, so the table stays
/// bounded by the events still stored and [`KEPT`] rows each.
pub(crate) const RECORD: &str = r#"
WITH added AS (
    INSERT INTO ordo.relay_attempts (relay, position, sequence, attempt, error, parked, host, pid, owner)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
), too_old AS (
    DELETE FROM ordo.relay_attempts
    WHERE relay = $1 AND position = $2 AND id IN (
        SELECT id FROM ordo.relay_attempts WHERE relay = $1 AND position = $2
        ORDER BY failed_at DESC, id DESC OFFSET $10 - 1
    )
)
DELETE FROM ordo.relay_attempts
WHERE sequence < (SELECT coalesce(min(sequence), 0) FROM ordo.events)
"#;

/// The relay's lane and stored position, and what its progress row says of the event at `$2`.
pub(crate) const EVENT_STATE: &str = r#"
SELECT s.lane, s.position AS stored, p.state, p.attempts, p.last_error, p.updated_at,
       EXISTS (SELECT 1 FROM ordo.key_backlogs AS b
               WHERE b.subscription = s.name AND b.position = $2) AS in_backlog
FROM ordo.subscriptions AS s
LEFT JOIN ordo.subscription_progress AS p ON p.subscription = s.name AND p.position = $2
WHERE s.name = $1
"#;

/// The event's attempts, oldest first, with the event's id where it is still stored.
pub(crate) const LIST: &str = r#"
SELECT a.attempt, a.failed_at, a.error, a.parked, a.host, a.pid, a.owner, a.sequence, e.id
FROM ordo.relay_attempts AS a
LEFT JOIN ordo.events AS e ON e.sequence = a.sequence
WHERE a.relay = $1 AND a.position = $2
ORDER BY a.failed_at, a.id
"#;

/// The id and insert sequence of the event at position `$1` of the commit lane (`$2`) or the
/// insert lane.
pub(crate) const EVENT_AT: &str = r#"
SELECT e.id, e.sequence FROM ordo.events AS e
WHERE e.payload IS NOT NULL AND e.sequence = CASE
    WHEN $2 THEN (SELECT c.sequence FROM ordo.commit_log_range($1 - 1, $1) AS c
                  WHERE c.commit_seq = $1)
    ELSE $1 END
"#;

/// The position of the event with id `$2` on the lane of relay `$1`: from its attempts if it
/// has any; else on the insert lane its sequence, on the commit lane its row of the log (a
/// scan of the log: an operator's lookup, not a hot path). Where several stored events carry
/// the id, the first (the lowest sequence: the one relays send, see `reused_ids.rs`).
pub(crate) const POSITION_OF: &str = r#"
WITH event AS (
    SELECT sequence FROM ordo.events WHERE id = $2 AND payload IS NOT NULL
    ORDER BY sequence LIMIT 1
)
SELECT coalesce(
    (SELECT a.position FROM ordo.relay_attempts AS a, event
     WHERE a.relay = $1 AND a.sequence = event.sequence LIMIT 1),
    (SELECT event.sequence FROM event, ordo.subscriptions AS s
     WHERE s.name = $1 AND s.lane = 'insert'),
    (SELECT c.commit_seq FROM ordo.commit_log AS c, event, ordo.subscriptions AS s
     WHERE s.name = $1 AND s.lane = 'commit' AND c.sequence = event.sequence)
)
"#;

/// The insert sequences of every stored event with id `$1`, lowest first.
pub(crate) const HOLDERS: &str = r#"
SELECT sequence FROM ordo.events WHERE id = $1 AND payload IS NOT NULL ORDER BY sequence
"#;

/// The head of the commit lane (`$1`) or the insert lane (the highest sequence drawn).
pub(crate) const LANE_HEAD: &str = r#"
SELECT CASE WHEN $1 THEN (SELECT last_commit_seq FROM ordo.sequencer_state)
       ELSE (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM ordo.events_sequence)
       END
"#;

/// This process, as an attempt records it.
fn host() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|name| name.trim().to_owned())
            .filter(|name| !name.is_empty())
            .unwrap_or_else(|| "unknown".to_owned())
    })
}

/// [`RECORD`] for `mark`, in the marks' transaction.
pub(crate) async fn record(
    tx: &mut PgConnection,
    relay: &str,
    owner: Uuid,
    mark: &Mark,
) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(RECORD)
        .bind(relay)
        .bind(mark.at)
        .bind(i64::try_from(mark.sequence).unwrap_or(i64::MAX))
        .bind(i32::try_from(mark.attempts).unwrap_or(i32::MAX))
        .bind(&mark.error)
        .bind(mark.parked)
        .bind(host())
        .bind(i32::try_from(std::process::id()).unwrap_or(i32::MAX))
        .bind(owner)
        .bind(KEPT)
        .execute(tx)
        .await?;
    Ok(())
}

/// Which event of a relay [`relay_attempts`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RelayEvent {
    /// The event at this position of the relay's lane (what `ordo relay parked` shows).
    Position(u64),
    /// The event with this id (the message id receivers see).
    Id(Uuid),
}

/// Where a relay's event stands now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RelayEventState {
    /// The receiver took it (at or below the relay's stored position, or recorded done above
    /// it).
    Delivered,
    /// Parked: its attempts ran out, or it failed permanently; it waits for `ordo relay
    /// requeue`.
    Parked,
    /// It failed and is tried again.
    Failing,
    /// Not delivered yet, and no failure stored: not sent yet, or in flight now.
    Waiting,
    /// In a stuck key's backlog (`ordo.key_backlogs`): an earlier event of its key is parked;
    /// it goes out, in order, once that one is requeued.
    Backlogged,
    /// Never sent: an earlier event (a lower insert sequence, first in
    /// [`RelayEventAttempts::id_holders`]) carries the same id, and a relay sends an id only
    /// for the first event stored with it (a later copy would make receivers that deduplicate
    /// by id drop the first). Its position is passed as done.
    Refused,
}

/// One failed attempt of a relay's event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RelayAttempt {
    /// The event's failed attempts when this one failed (1 for the first; counted from 1 again
    /// after an operator's requeue).
    pub attempt: u32,
    /// When the relay recorded the failure.
    pub failed_at: DateTime<Utc>,
    /// Why it failed, as the sink said.
    pub error: String,
    /// Whether this failure parked it.
    pub parked: bool,
    /// The host of the process that sent it.
    pub host: String,
    /// That process's id.
    pub pid: u32,
    /// The relay's lease owner in that process.
    pub owner: Uuid,
}

/// A relay's event, where it stands and its failed attempts (the newest 20).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RelayEventAttempts {
    /// The relay.
    pub relay: String,
    /// The event's position on the relay's lane.
    pub position: Position,
    /// The event's id, while `ordo.events` holds it.
    pub event_id: Option<Uuid>,
    /// The insert sequences of every stored event carrying that id, lowest first, when more
    /// than one does (a copy inserted with another event's id, or a retry of a commit that
    /// took effect); empty when the id is this event's alone. Relays send the first only.
    pub id_holders: Vec<u64>,
    /// Where it stands now.
    pub state: RelayEventState,
    /// Since when it stands so (the last change of its progress row), if it has one.
    pub since: Option<DateTime<Utc>>,
    /// Its failed attempts, oldest first (empty: it never failed, or retention dropped it).
    pub attempts: Vec<RelayAttempt>,
}

/// Whether relay `relay` delivered `event`, when and why not: where it stands now and its
/// failed attempts, each with its time, error, host and pid (`ordo relay attempts`).
///
/// Asked by id where several stored events carry it, the answer is about the first of them
/// (the one relays send), and [`id_holders`](RelayEventAttempts::id_holders) lists them all.
///
/// # Errors
/// [`Error::UnknownSubscription`] if there is no such relay; [`Error::InvalidConfig`] if no
/// stored event has that id; [`Error::BeyondHead`] if the position is past the head of the
/// relay's lane (no event is there yet); [`Error::Database`] if a statement fails.
pub async fn relay_attempts(
    pool: &PgPool,
    relay: &str,
    event: RelayEvent,
) -> Result<RelayEventAttempts> {
    let position = position_of(pool, relay, event).await?;
    let at = i64::try_from(position).unwrap_or(i64::MAX);
    let Some(row) = sqlx::query(EVENT_STATE)
        .bind(relay)
        .bind(at)
        .fetch_optional(pool)
        .await?
    else {
        return Err(Error::UnknownSubscription {
            name: relay.to_owned(),
        });
    };
    let lane = read_lane(&row, "lane")?;
    let stored: i64 = row.try_get("stored")?;
    let progress: Option<String> = row.try_get("state")?;
    let state = state_of(
        progress.as_deref(),
        row.try_get("in_backlog")?,
        at <= stored,
    );
    let since = row.try_get("updated_at")?;
    let (mut event_id, mut sequence, attempts) = attempts_at(pool, relay, at).await?;
    if event_id.is_none() {
        let found: Option<(Uuid, i64)> = sqlx::query_as(EVENT_AT)
            .bind(at)
            .bind(lane == crate::Ordering::Commit)
            .fetch_optional(pool)
            .await?;
        (event_id, sequence) = found.map_or((None, None), |(id, at)| (Some(id), Some(at)));
    }
    if event_id.is_none() && state == RelayEventState::Waiting {
        let head: i64 = sqlx::query_scalar(LANE_HEAD)
            .bind(lane == crate::Ordering::Commit)
            .fetch_one(pool)
            .await?;
        if at > head {
            return Err(Error::BeyondHead {
                subscription: relay.to_owned(),
                lane,
                position,
                head: u64::try_from(head).unwrap_or(0),
            });
        }
    }
    let id_holders = match event_id {
        Some(id) => holders(pool, id).await?,
        None => Vec::new(),
    };
    let first = id_holders.first().copied();
    let sequence = sequence.and_then(|at| u64::try_from(at).ok());
    let state = match (first, sequence) {
        (Some(first), Some(sequence)) if first < sequence => RelayEventState::Refused,
        _ => state,
    };
    Ok(RelayEventAttempts {
        relay: relay.to_owned(),
        position: Position::new(lane, position),
        event_id,
        id_holders,
        state,
        since,
        attempts,
    })
}

/// The lane position `event` names on `relay`'s lane: given, or looked up by the event's id.
async fn position_of(pool: &PgPool, relay: &str, event: RelayEvent) -> Result<u64> {
    match event {
        RelayEvent::Position(position) => Ok(position),
        RelayEvent::Id(id) => {
            let found: Option<i64> = sqlx::query_scalar(POSITION_OF)
                .bind(relay)
                .bind(id)
                .fetch_one(pool)
                .await?;
            match found.and_then(|at| u64::try_from(at).ok()) {
                Some(position) => Ok(position),
                None => Error::invalid_config(
                    "event id",
                    &format!(
                        "no stored event {id} is on relay {relay:?}'s lane (unknown, a placeholder, not yet logged, or dropped by retention)"
                    ),
                ),
            }
        }
    }
}

/// The failed attempts stored for the event at `at` on `relay`'s lane, oldest first, with the
/// event's id and sequence as the attempts recorded them.
async fn attempts_at(
    pool: &PgPool,
    relay: &str,
    at: i64,
) -> Result<(Option<Uuid>, Option<i64>, Vec<RelayAttempt>)> {
    let rows = sqlx::query(LIST)
        .bind(relay)
        .bind(at)
        .fetch_all(pool)
        .await?;
    let mut event_id = None;
    let mut sequence = None;
    let mut attempts = Vec::with_capacity(rows.len());
    for row in rows {
        event_id = event_id.or(row.try_get("id")?);
        sequence = sequence.or(Some(row.try_get::<i64, _>("sequence")?));
        attempts.push(RelayAttempt {
            attempt: u32::try_from(row.try_get::<i32, _>("attempt")?).unwrap_or(0),
            failed_at: row.try_get("failed_at")?,
            error: row.try_get("error")?,
            parked: row.try_get("parked")?,
            host: row.try_get("host")?,
            pid: u32::try_from(row.try_get::<i32, _>("pid")?).unwrap_or(0),
            owner: row.try_get("owner")?,
        });
    }
    Ok((event_id, sequence, attempts))
}

/// [`HOLDERS`] of `id` when more than one event carries it, else empty.
async fn holders(pool: &PgPool, id: Uuid) -> Result<Vec<u64>> {
    let found: Vec<i64> = sqlx::query_scalar(HOLDERS).bind(id).fetch_all(pool).await?;
    if found.len() < 2 {
        return Ok(Vec::new());
    }
    Ok(found
        .into_iter()
        .filter_map(|at| u64::try_from(at).ok())
        .collect())
}

/// Where an event stands from its progress row's state, whether it is in a stuck key's
/// backlog, and whether the stored position covers it.
fn state_of(progress: Option<&str>, in_backlog: bool, covered: bool) -> RelayEventState {
    match progress {
        // A parked event waits in its key's backlog, below the stored position.
        Some("stalled") => RelayEventState::Parked,
        Some("failing") if in_backlog => RelayEventState::Failing,
        _ if in_backlog => RelayEventState::Backlogged,
        _ if covered => RelayEventState::Delivered,
        Some("done") => RelayEventState::Delivered,
        Some(_) => RelayEventState::Failing,
        None => RelayEventState::Waiting,
    }
}

/// This file's statements on ordo's hot paths, with sample arguments, for `ops::plans`
/// (`tests/ops/plans.rs` fails if PostgreSQL would JIT-compile any).
pub(crate) const HOT_PATH: &[HotStatement] = &[
    // On the failure path only, but once per failed attempt of a relay that may fail often.
    HotStatement {
        name: "relay: failed attempt's history",
        sql: RECORD,
        types: "text, bigint, bigint, integer, text, boolean, text, integer, uuid, integer",
        args: "'s', 10, 10, 1, 'boom', false, 'host', 1, '0190c9d2-0000-7000-8000-000000000001'::uuid, 20",
        session: &[],
    },
];
