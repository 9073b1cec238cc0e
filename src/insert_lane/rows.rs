//! Reading `ordo.events` rows into slots: the lane's statements and their decoding.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};
use uuid::Uuid;

use super::cache::{Slot, SlotItem, Undecodable};
use crate::envelope::{Envelope, Headers};
use crate::error::Result;
use crate::position::EventSequence;

/// Rows in `(after, upto]`, in order, at most `limit`.
pub(crate) const PAGE_FULL: &str = r#"
SELECT sequence, commit_xid, id, payload::text AS payload, headers::text AS headers, recorded_at,
       event_type
FROM ordo.events
WHERE sequence > $1 AND sequence <= $2
ORDER BY sequence
LIMIT $3
"#;

/// The same page without payloads, for readers that only need positions and groups.
pub(crate) const PAGE_META: &str = r#"
SELECT sequence, commit_xid
FROM ordo.events
WHERE sequence > $1 AND sequence <= $2
ORDER BY sequence
LIMIT $3
"#;

/// The lane's fetch: the holes it is waiting on, plus whatever is new above what it knows.
pub(crate) const FETCH: &str = r#"
(SELECT sequence, commit_xid, id, payload::text AS payload, headers::text AS headers, recorded_at,
        event_type
 FROM ordo.events WHERE sequence = ANY($1::bigint[]))
UNION ALL
(SELECT sequence, commit_xid, id, payload::text AS payload, headers::text AS headers, recorded_at,
        event_type
 FROM ordo.events WHERE sequence > $2 ORDER BY sequence LIMIT $3)
"#;

/// The highest sequence any transaction has drawn (committed or not).
pub(crate) const HEAD: &str =
    "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM ordo.events_sequence";

/// The end of the contiguous run of rows that starts right above `$1`, or `$1` itself.
pub(crate) const CONTIGUOUS_END: &str = r#"
SELECT CASE
    WHEN NOT EXISTS (SELECT 1 FROM ordo.events WHERE sequence = $1 + 1) THEN $1
    ELSE (SELECT min(sequence) FROM (
            SELECT sequence, lead(sequence) OVER (ORDER BY sequence) AS next
            FROM ordo.events WHERE sequence > $1) AS run
          WHERE next IS DISTINCT FROM sequence + 1)
END
"#;

/// Every position at or below the sequencer's cursor is resolved, so the start-up scan for
/// the frontier begins there instead of at the first event.
pub(crate) const RESOLVED_FLOOR: &str = "SELECT logged_through_sequence FROM ordo.sequencer_state";

pub(crate) fn decode_full<P: DeserializeOwned>(row: &PgRow) -> Result<Slot<P>> {
    let sequence = to_u64(row.try_get("sequence")?);
    let commit_xid: Option<i64> = row.try_get("commit_xid")?;
    let payload: Option<String> = row.try_get("payload")?;
    let (Some(xid), Some(payload)) = (commit_xid, payload) else {
        return Ok(placeholder(sequence));
    };
    let headers: String = row.try_get("headers")?;
    let event_type: Option<String> = row.try_get("event_type")?;
    let item = match serde_json::from_str::<P>(&payload) {
        Ok(payload) => {
            // Headers are a JSON object by construction; anything else reads as empty.
            let headers = serde_json::from_str::<Headers>(&headers).unwrap_or_default();
            SlotItem::Event(Arc::new(Envelope {
                id: row.try_get::<Uuid, _>("id")?,
                sequence: EventSequence::new(sequence),
                commit_xid: xid,
                payload,
                headers,
                recorded_at: row.try_get::<DateTime<Utc>, _>("recorded_at")?,
                event_type,
            }))
        }
        Err(error) => SlotItem::Undecodable(Arc::new(Undecodable {
            error: Arc::new(error),
            event_type,
        })),
    };
    Ok(Slot {
        sequence,
        commit_xid: Some(xid),
        item,
    })
}

fn decode_meta<P>(row: &PgRow) -> Result<Slot<P>> {
    let sequence = to_u64(row.try_get("sequence")?);
    let commit_xid: Option<i64> = row.try_get("commit_xid")?;
    Ok(match commit_xid {
        Some(xid) => Slot {
            sequence,
            commit_xid: Some(xid),
            item: SlotItem::Meta,
        },
        None => placeholder(sequence),
    })
}

fn placeholder<P>(sequence: u64) -> Slot<P> {
    Slot {
        sequence,
        commit_xid: None,
        item: SlotItem::Placeholder,
    }
}

pub(crate) fn to_u64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

pub(crate) fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Whether a page read carries payloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadMode {
    Full,
    Meta,
}

/// Reads the rows in `(after, upto]` in sequence order, at most `limit`.
pub(crate) async fn read_page<P: DeserializeOwned>(
    pool: &PgPool,
    mode: ReadMode,
    after: u64,
    upto: u64,
    limit: usize,
) -> Result<Vec<Slot<P>>> {
    let sql = match mode {
        ReadMode::Full => PAGE_FULL,
        ReadMode::Meta => PAGE_META,
    };
    let rows = sqlx::query(sql)
        .bind(to_i64(after))
        .bind(to_i64(upto))
        .bind(to_i64(limit as u64))
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|row| match mode {
            ReadMode::Full => decode_full(row),
            ReadMode::Meta => decode_meta(row),
        })
        .collect()
}

/// Reads the listed sequences and up to `limit` rows above `above`.
pub(crate) async fn fetch<P: DeserializeOwned>(
    pool: &PgPool,
    missing: &[i64],
    above: u64,
    limit: usize,
) -> Result<Vec<Slot<P>>> {
    let rows = sqlx::query(FETCH)
        .bind(missing)
        .bind(to_i64(above))
        .bind(to_i64(limit as u64))
        .fetch_all(pool)
        .await?;
    rows.iter().map(decode_full).collect()
}

pub(crate) const FLOORS: &str = "SELECT events_floor, commit_floor FROM ordo.partitioning";

/// The lowest insert sequence and the highest dropped commit sequence after retention.
pub(crate) async fn retention_floors(pool: &PgPool) -> Result<(u64, u64)> {
    let (events, commit): (i64, i64) = sqlx::query_as(FLOORS).fetch_one(pool).await?;
    Ok((to_u64(events), to_u64(commit)))
}

pub(crate) async fn head(pool: &PgPool) -> Result<u64> {
    let head: i64 = sqlx::query_scalar(HEAD).fetch_one(pool).await?;
    Ok(to_u64(head))
}

/// The insert lane's frontier as the table shows it: the end of the contiguous run of rows
/// above the sequencer's cursor.
pub(crate) async fn initial_frontier(pool: &PgPool) -> Result<u64> {
    let floor: Option<i64> = sqlx::query_scalar(RESOLVED_FLOOR)
        .fetch_optional(pool)
        .await?;
    let end: Option<i64> = sqlx::query_scalar(CONTIGUOUS_END)
        .bind(floor.unwrap_or(0))
        .fetch_one(pool)
        .await?;
    Ok(to_u64(end.unwrap_or(0)))
}
