//! Operating stuck keys' backlogs: what waits in them, per key and per consumer; an
//! operator's skip of a stalled event and purge of a key's backlog, each recorded in
//! `ordo.backlog_actions` with who did it, when, and what it dropped.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgPool, Row};
use uuid::Uuid;

use crate::consumer::status::{BacklogSize, SubscriptionStatus};
use crate::error::{Error, Result};

/// Per key of one consumer: its events in the backlog, what they weigh, since when.
const BY_KEY: &str = r#"
SELECT k.key, count(*) AS events,
       sum(octet_length(b.payload::text) + octet_length(b.headers::text)) AS bytes,
       min(b.moved_at) AS oldest
FROM ordo.key_backlogs AS b
CROSS JOIN LATERAL unnest(CASE WHEN cardinality(b.keys) = 0 THEN ARRAY[''] ELSE b.keys END)
    AS k(key)
WHERE b.subscription = $1
GROUP BY k.key
ORDER BY min(b.position)
"#;

/// Per consumer: its backlogs' size.
const SIZES: &str = r#"
SELECT b.subscription, count(*) AS events,
       sum(octet_length(b.payload::text) + octet_length(b.headers::text)) AS bytes,
       min(b.moved_at) AS oldest,
       (SELECT count(DISTINCT k) FROM ordo.key_backlogs AS c, unnest(c.keys) AS k
        WHERE c.subscription = b.subscription) AS keys
FROM ordo.key_backlogs AS b
GROUP BY b.subscription
"#;

/// The stalled events of key `$2` in the backlog (`''`: an event with no key), or with
/// `$3`, every event of the key's backlog; dropped, and the stalled ones' runner asked to go
/// on without them (a retry request it takes within a second, or at its next claim), in one
/// statement, recorded with who and what.
const DROP: &str = r#"
WITH stalled AS (
    SELECT p.position FROM ordo.subscription_progress AS p
    WHERE p.subscription = $1 AND p.state = 'stalled'
      AND ($2 = ANY(p.keys) OR ($2 = '' AND cardinality(p.keys) = 0))
      AND EXISTS (SELECT 1 FROM ordo.key_backlogs AS b
                  WHERE b.subscription = $1 AND b.position = p.position)
    FOR UPDATE OF p
), gone AS (
    DELETE FROM ordo.key_backlogs AS b
    WHERE b.subscription = $1
      AND (b.position IN (SELECT position FROM stalled) OR ($3 AND $2 = ANY(b.keys)))
    RETURNING b.position, b.id, octet_length(b.payload::text) + octet_length(b.headers::text) AS bytes
), asked AS (
    UPDATE ordo.subscription_progress AS p
    SET retry_requested_at = now(), updated_at = now()
    WHERE p.subscription = $1 AND p.position IN (SELECT position FROM stalled)
)
INSERT INTO ordo.backlog_actions (subscription, action, key, positions, ids, bytes)
SELECT $1, CASE WHEN $3 THEN 'purge' ELSE 'skip' END, $2,
       array_agg(position ORDER BY position), array_agg(id ORDER BY position),
       coalesce(sum(bytes), 0)
FROM gone
HAVING count(*) > 0
RETURNING action, key, positions, ids, bytes, done_by, done_at
"#;

const ACTIONS: &str = r#"
SELECT action, key, positions, ids, bytes, done_by, done_at
FROM ordo.backlog_actions WHERE subscription = $1 ORDER BY done_at, id
"#;

const EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM ordo.subscriptions WHERE name = $1)";

/// One key's backlog: see [`list_backlog`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct KeyBacklog {
    /// The key (empty: events with no key).
    pub key: String,
    /// Its events in the backlog, its stalled (parked) one included.
    pub events: u64,
    /// What their payloads and headers weigh, as stored.
    pub bytes: u64,
    /// When the oldest was moved aside.
    pub oldest_at: Option<DateTime<Utc>>,
}

/// An operator's skip or purge, as `ordo.backlog_actions` records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct BacklogAction {
    /// `skip` (a stalled event dropped) or `purge` (a key's whole backlog dropped).
    pub action: String,
    /// The key it was asked for.
    pub key: String,
    /// The positions of the events it dropped, never delivered.
    pub positions: Vec<u64>,
    /// Their event ids.
    pub ids: Vec<Uuid>,
    /// What they weighed.
    pub bytes: u64,
    /// The database role that did it.
    pub done_by: String,
    /// When.
    pub done_at: DateTime<Utc>,
}

impl BacklogAction {
    fn read(row: &sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        let positions: Vec<i64> = row.try_get("positions")?;
        Ok(Self {
            action: row.try_get("action")?,
            key: row.try_get("key")?,
            positions: positions
                .into_iter()
                .filter_map(|at| u64::try_from(at).ok())
                .collect(),
            ids: row.try_get("ids")?,
            bytes: u64::try_from(row.try_get::<i64, _>("bytes")?).unwrap_or(0),
            done_by: row.try_get("done_by")?,
            done_at: row.try_get("done_at")?,
        })
    }
}

/// A keyed subscription's or relay's stuck keys' backlogs, one row per key, oldest first:
/// the events that wait behind a stalled (parked) event, out of its window, until an operator
/// retries (requeues) it.
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> ordo::Result<()> {
/// for key in ordo::admin::list_backlog(&pool, "webhooks").await? {
///     println!("{}: {} events, {} bytes", key.key, key.events, key.bytes);
/// }
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::UnknownSubscription`] if there is no such subscription or relay;
/// [`Error::Database`] if a statement fails.
pub async fn list_backlog(pool: &PgPool, name: &str) -> Result<Vec<KeyBacklog>> {
    ensure_exists(pool, name).await?;
    let rows = sqlx::query(BY_KEY).bind(name).fetch_all(pool).await?;
    let mut keys = Vec::with_capacity(rows.len());
    for row in rows {
        keys.push(KeyBacklog {
            key: row.try_get("key")?,
            events: u64::try_from(row.try_get::<i64, _>("events")?).unwrap_or(0),
            bytes: u64::try_from(row.try_get::<Option<i64>, _>("bytes")?.unwrap_or(0)).unwrap_or(0),
            oldest_at: row.try_get("oldest")?,
        });
    }
    Ok(keys)
}

/// The skips and purges operators did on a subscription's or relay's backlogs, oldest first.
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> ordo::Result<()> {
/// for done in ordo::admin::backlog_actions(&pool, "webhooks").await? {
///     println!("{} {} by {}: {:?}", done.done_at, done.action, done.done_by, done.positions);
/// }
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::UnknownSubscription`] if there is no such subscription or relay;
/// [`Error::Database`] if a statement fails.
pub async fn backlog_actions(pool: &PgPool, name: &str) -> Result<Vec<BacklogAction>> {
    ensure_exists(pool, name).await?;
    let rows = sqlx::query(ACTIONS).bind(name).fetch_all(pool).await?;
    Ok(rows
        .iter()
        .map(BacklogAction::read)
        .collect::<Result<_, _>>()?)
}

/// Drops the stalled (parked) event holding `key` (`""`: an event with no key) without
/// delivering it, and lets the rest of the key's backlog go on, in order: the runner takes the
/// request within a second, or at its next claim. Recorded in `ordo.backlog_actions` (see
/// [`backlog_actions`]); the event stays in `ordo.events` until retention.
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> ordo::Result<()> {
/// let skipped = ordo::admin::skip_stalled_event(&pool, "webhooks", "tenant-7").await?;
/// println!("skipped positions {:?}", skipped.positions);
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::UnknownSubscription`] if there is no such subscription or relay;
/// [`Error::UnknownStalledKey`] if no stalled event in a backlog holds `key`;
/// [`Error::Database`] if a statement fails.
pub async fn skip_stalled_event(pool: &PgPool, name: &str, key: &str) -> Result<BacklogAction> {
    drop_events(pool, name, key, false).await
}

/// Drops every event of `key`'s backlog, its stalled (parked) event included, without
/// delivering them; an event that also carries other keys goes too. The key rejoins the live
/// flow: its events from now on are delivered. Recorded in `ordo.backlog_actions` with their
/// positions and ids (see [`backlog_actions`]).
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> ordo::Result<()> {
/// let purged = ordo::admin::purge_backlog(&pool, "webhooks", "tenant-7").await?;
/// println!("{} events dropped, {} bytes", purged.positions.len(), purged.bytes);
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::UnknownSubscription`] if there is no such subscription or relay;
/// [`Error::UnknownStalledKey`] if `key` has nothing in a backlog;
/// [`Error::Database`] if a statement fails.
pub async fn purge_backlog(pool: &PgPool, name: &str, key: &str) -> Result<BacklogAction> {
    drop_events(pool, name, key, true).await
}

async fn drop_events(pool: &PgPool, name: &str, key: &str, purge: bool) -> Result<BacklogAction> {
    ensure_exists(pool, name).await?;
    let row = sqlx::query(DROP)
        .bind(name)
        .bind(key)
        .bind(purge)
        .fetch_optional(pool)
        .await?;
    match row {
        Some(row) => Ok(BacklogAction::read(&row)?),
        None => Err(Error::UnknownStalledKey {
            subscription: name.to_owned(),
            key: key.to_owned(),
        }),
    }
}

/// Fills each status's [`backlog`](SubscriptionStatus::backlog) from the database.
pub(crate) async fn attach_backlogs(
    pool: &PgPool,
    statuses: &mut [SubscriptionStatus],
) -> Result<(), sqlx::Error> {
    let mut sizes: HashMap<String, BacklogSize> = HashMap::new();
    for row in sqlx::query(SIZES).fetch_all(pool).await? {
        let count = |column: &str| -> Result<u64, sqlx::Error> {
            Ok(u64::try_from(row.try_get::<Option<i64>, _>(column)?.unwrap_or(0)).unwrap_or(0))
        };
        sizes.insert(
            row.try_get("subscription")?,
            BacklogSize {
                events: count("events")?,
                bytes: count("bytes")?,
                keys: count("keys")?,
                oldest_at: row.try_get("oldest")?,
            },
        );
    }
    for status in statuses {
        status.backlog = Some(sizes.remove(&status.name).unwrap_or_default());
    }
    Ok(())
}

async fn ensure_exists(pool: &PgPool, name: &str) -> Result<()> {
    let exists: bool = sqlx::query_scalar(EXISTS)
        .bind(name)
        .fetch_one(pool)
        .await?;
    if exists {
        Ok(())
    } else {
        Err(Error::UnknownSubscription {
            name: name.to_owned(),
        })
    }
}
