//! Reading `ordo.events` rows into slots: the lane's page statements, their decoding, and the
//! retention floor a read checks. Where the lane stands (the sequence head, the contiguous end)
//! is `heads.rs`.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{Connection, PgPool, Postgres, Row};
use uuid::Uuid;

use super::cache::{Slot, SlotItem, Undecodable};
use crate::envelope::{Envelope, Headers};
use crate::error::{Error, Result};
use crate::position::{CommitSequence, EventSequence, Ordering};
use crate::telemetry::HotStatement;

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

/// A page whose payloads weigh more than this hands its connection's grown buffers back.
pub(crate) const SHRINK_AFTER_BYTES: usize = 1024 * 1024;

/// A row's `sequence`, raw: slots and the cache index by the plain number.
fn sequence_of(row: &PgRow) -> Result<u64> {
    Ok(row.try_get::<EventSequence, _>("sequence")?.get())
}

/// A `LIMIT`, which PostgreSQL takes as a `bigint`.
fn limit(rows: usize) -> i64 {
    i64::try_from(rows).unwrap_or(i64::MAX)
}

pub(crate) fn decode_full<P: DeserializeOwned>(row: &PgRow) -> Result<Slot<P>> {
    let sequence = sequence_of(row)?;
    let commit_xid: Option<i64> = row.try_get("commit_xid")?;
    let payload: Option<String> = row.try_get("payload")?;
    let (Some(xid), Some(payload)) = (commit_xid, payload) else {
        return Ok(placeholder(sequence));
    };
    let headers: String = row.try_get("headers")?;
    let bytes = payload.len() + headers.len();
    let event_type: Option<String> = row.try_get("event_type")?;
    let (item, bytes) = match serde_json::from_str::<P>(&payload) {
        Ok(payload) => {
            // Headers are a JSON object by construction; anything else reads as empty.
            let headers = serde_json::from_str::<Headers>(&headers).unwrap_or_default();
            let event = SlotItem::Event(Arc::new(Envelope {
                id: row.try_get::<Uuid, _>("id")?,
                sequence: EventSequence::new(sequence),
                commit_xid: xid,
                payload,
                headers,
                recorded_at: row.try_get::<DateTime<Utc>, _>("recorded_at")?,
                event_type,
            }));
            (event, bytes)
        }
        // serde's error does not hold the payload: nothing to weigh.
        Err(error) => (
            SlotItem::Undecodable(Arc::new(Undecodable {
                error: Arc::new(error),
                event_type,
            })),
            0,
        ),
    };
    Ok(Slot {
        sequence,
        commit_xid: Some(xid),
        bytes,
        item,
    })
}

fn decode_meta<P>(row: &PgRow) -> Result<Slot<P>> {
    let sequence = sequence_of(row)?;
    let commit_xid: Option<i64> = row.try_get("commit_xid")?;
    Ok(match commit_xid {
        Some(xid) => Slot {
            sequence,
            commit_xid: Some(xid),
            bytes: 0,
            item: SlotItem::Meta,
        },
        None => placeholder(sequence),
    })
}

fn placeholder<P>(sequence: u64) -> Slot<P> {
    Slot {
        sequence,
        commit_xid: None,
        bytes: 0,
        item: SlotItem::Placeholder,
    }
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
    let query = sqlx::query(sql)
        .bind(EventSequence::new(after))
        .bind(EventSequence::new(upto))
        .bind(self::limit(limit));
    match mode {
        ReadMode::Full => fetch_slots(pool, query, decode_full).await,
        ReadMode::Meta => fetch_slots(pool, query, decode_meta).await,
    }
}

/// Runs a statement that reads slots, and gives the connection's buffers back after a large
/// result. sqlx keeps a connection's read buffer at the largest message it has read (and a
/// row's bytes share it), so without this one 100 MB payload read pins 100 MB in every pooled
/// connection that ever read it, long after the event was delivered.
async fn fetch_slots<P>(
    pool: &PgPool,
    query: Query<'_, Postgres, PgArguments>,
    decode: fn(&PgRow) -> Result<Slot<P>>,
) -> Result<Vec<Slot<P>>> {
    let mut conn = pool.acquire().await?;
    let rows = query.fetch_all(&mut *conn).await?;
    let slots = rows.iter().map(decode).collect::<Result<Vec<_>>>()?;
    drop(rows);
    if slots.iter().map(|slot| slot.bytes).sum::<usize>() > SHRINK_AFTER_BYTES {
        conn.shrink_buffers();
    }
    Ok(slots)
}

/// Reads the listed sequences and up to `limit` rows above `above`.
pub(crate) async fn fetch<P: DeserializeOwned>(
    pool: &PgPool,
    missing: &[EventSequence],
    above: u64,
    limit: usize,
) -> Result<Vec<Slot<P>>> {
    let query = sqlx::query(FETCH)
        .bind(missing)
        .bind(EventSequence::new(above))
        .bind(self::limit(limit));
    fetch_slots(pool, query, decode_full).await
}

pub(crate) const FLOORS: &str = "SELECT events_floor, commit_floor FROM ordo.partitioning";

/// Refuses a read of `lane` from `requested` when retention has dropped that position: every
/// reader checks here, so one below the floor fails the same way in every process (a cache
/// may still hold dropped events).
///
/// # Errors
/// [`Error::BelowRetentionFloor`] naming the lowest readable position, or a database error.
pub(crate) async fn check_retention_floor(
    pool: &PgPool,
    lane: Ordering,
    requested: u64,
) -> Result<()> {
    // `events_floor` is the lowest sequence kept, `commit_floor` the highest commit sequence
    // dropped.
    let (events, commit): (EventSequence, CommitSequence) =
        sqlx::query_as(FLOORS).fetch_one(pool).await?;
    let floor = match lane {
        Ordering::Insert => events.get(),
        Ordering::Commit => commit.next().get(),
    };
    if requested < floor {
        return Err(Error::BelowRetentionFloor {
            lane,
            requested,
            floor,
        });
    }
    Ok(())
}

/// This file's statements on ordo's hot paths, with sample arguments, for `ops::plans`
/// (`tests/ops/plans.rs` fails if PostgreSQL would JIT-compile any).
pub(crate) const HOT_PATH: &[HotStatement] = &[
    HotStatement {
        name: "insert lane: page",
        sql: PAGE_FULL,
        types: "bigint, bigint, bigint",
        args: "0, 512, 512",
        session: &[],
    },
    HotStatement {
        name: "insert lane: page without payloads",
        sql: PAGE_META,
        types: "bigint, bigint, bigint",
        args: "0, 512, 512",
        session: &[],
    },
    HotStatement {
        name: "insert lane: fetch",
        sql: FETCH,
        types: "bigint[], bigint, bigint",
        args: "ARRAY[5]::bigint[], 10, 512",
        session: &[],
    },
    HotStatement {
        name: "insert lane: retention floors",
        sql: FLOORS,
        types: "",
        args: "",
        session: &[],
    },
];
