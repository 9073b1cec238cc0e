//! The backlog's statements: copies written aside, taken back a page at a time, and taken
//! out when delivered.

use serde::de::DeserializeOwned;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use super::{Aside, PAGE_ROWS, Taken};
use crate::consumer::source::Item;
use crate::insert_lane::cache::SlotItem;
use crate::position::{EventSequence, Ordering, Position};

/// Copies events into the backlog from `ordo.events`, fenced by the lease (`FOR SHARE` holds
/// off a takeover until COMMIT). `$3`: a JSON array of `{position, sequence, keys, route,
/// previous}`. Returns
/// whether the fence held and how many rows are in the backlog for the positions asked (a
/// copy already there, an event stalled again, counts): fewer means an event's row is gone.
pub(super) const WRITE: &str = r#"
WITH fence AS (
    SELECT s.name FROM ordo.subscriptions AS s
    WHERE s.name = $1 AND s.lease_owner = $2 AND s.status = 'active'
    FOR SHARE
), copied AS (
    INSERT INTO ordo.key_backlogs AS b
        (subscription, position, keys, sequence, commit_xid, id, payload, headers, recorded_at,
         event_type, route, previous)
    SELECT f.name, a.position, a.keys, e.sequence, e.commit_xid, e.id, e.payload, e.headers,
           e.recorded_at, e.event_type, a.route, a.previous
    FROM fence AS f
    CROSS JOIN jsonb_to_recordset($3::jsonb)
        AS a(position bigint, sequence bigint, keys text[], route text, previous bigint)
    JOIN ordo.events AS e ON e.sequence = a.sequence AND e.payload IS NOT NULL
    ON CONFLICT (subscription, position) DO UPDATE SET keys = excluded.keys
    RETURNING b.position
)
SELECT EXISTS (SELECT 1 FROM fence) AS fenced, (SELECT count(*) FROM copied) AS copied
"#;

/// A delivered copy leaves the backlog, in the delivering transaction and fenced by the
/// lease; the stalled event's state goes with it, or becomes `done` while the stored
/// watermark is still below it (a claim then reads it as finished, not as to deliver). True
/// if the fence held and the copy was there.
pub(crate) const TAKEN: &str = r#"
WITH fence AS (
    SELECT s.name, s.position FROM ordo.subscriptions AS s
    WHERE s.name = $1 AND s.lease_owner = $2 AND s.status = 'active'
    FOR SHARE
), gone AS (
    DELETE FROM ordo.key_backlogs AS b USING fence AS f
    WHERE b.subscription = f.name AND b.position = ANY($3::bigint[])
    RETURNING b.position
), below AS (
    DELETE FROM ordo.subscription_progress AS p USING fence AS f
    WHERE p.subscription = f.name AND p.position = ANY($3::bigint[]) AND p.position <= f.position
), above AS (
    INSERT INTO ordo.subscription_progress (subscription, position, state)
    SELECT f.name, g.position, 'done' FROM fence AS f, gone AS g WHERE g.position > f.position
    ON CONFLICT (subscription, position) DO UPDATE
    SET state = 'done', last_error = NULL, retry_requested_at = NULL, updated_at = now()
)
SELECT EXISTS (SELECT 1 FROM fence) AND (SELECT count(*) FROM gone) = cardinality($3::bigint[])
"#;

/// The stuck groups as a claim finds them: each distinct key set in the backlog, with the
/// stalled events among its rows that no operator asked to retry, and its key-less rows.
pub(super) const GROUPS: &str = r#"
SELECT b.keys,
       coalesce(array_agg(b.position) FILTER (
           WHERE p.state = 'stalled' AND p.retry_requested_at IS NULL), '{}') AS heads,
       coalesce(array_agg(b.position) FILTER (WHERE cardinality(b.keys) = 0), '{}') AS keyless
FROM ordo.key_backlogs AS b
LEFT JOIN ordo.subscription_progress AS p
       ON p.subscription = b.subscription AND p.position = b.position
WHERE b.subscription = $1
GROUP BY b.keys
"#;

/// The stalled events in the backlog no operator asked to retry, with their lane.
pub(super) const HEADS: &str = r#"
SELECT p.position, s.lane, p.keys, p.attempts, coalesce(p.last_error, '') AS error, p.updated_at
FROM ordo.subscription_progress AS p
JOIN ordo.subscriptions AS s ON s.name = p.subscription
JOIN ordo.key_backlogs AS b ON b.subscription = p.subscription AND b.position = p.position
WHERE p.subscription = $1 AND p.state = 'stalled' AND p.retry_requested_at IS NULL
ORDER BY p.position
"#;

/// The next page of a group's rows, in lane order, with the stalled event's attempts. Each
/// event as `ordo.events` holds it now (an operator may have mended a poison row before
/// retrying it), or as copied once retention pruned the row.
const PAGE: &str = r#"
SELECT b.position, b.sequence, b.commit_xid, b.id,
       coalesce(e.payload, b.payload)::text AS payload,
       coalesce(e.headers, b.headers)::text AS headers,
       b.recorded_at, coalesce(e.event_type, b.event_type) AS event_type, b.route, b.previous,
       coalesce(p.attempts, 0) AS attempts
FROM ordo.key_backlogs AS b
LEFT JOIN ordo.events AS e ON e.sequence = b.sequence AND e.id = b.id
LEFT JOIN ordo.subscription_progress AS p
       ON p.subscription = b.subscription AND p.position = b.position AND p.state <> 'done'
WHERE b.subscription = $1 AND (b.keys && $2::text[] OR b.position = ANY($3::bigint[]))
  AND b.position > $4
ORDER BY b.position
LIMIT $5
"#;

/// [`WRITE`]: the copies of `events`; `Ok(false)` when the fence refused. An event whose row is gone (retention pruned it) is an
/// error: it is not finished, and the runner claims again.
pub(crate) async fn write(
    pool: &PgPool,
    name: &str,
    owner: Uuid,
    events: &[Aside],
) -> crate::Result<bool> {
    let rows: Vec<serde_json::Value> = events
        .iter()
        .map(|event| {
            let (route, previous) = match &event.link {
                Some((route, previous)) => (route.clone(), Some(*previous)),
                None => (None, None),
            };
            serde_json::json!({
                "position": event.position,
                "sequence": event.sequence,
                "keys": event.keys,
                "route": route,
                "previous": previous,
            })
        })
        .collect();
    let row = sqlx::query(WRITE)
        .bind(name)
        .bind(owner)
        .bind(serde_json::Value::Array(rows))
        .fetch_one(pool)
        .await?;
    let fenced: bool = row.try_get("fenced")?;
    let copied: i64 = row.try_get("copied")?;
    if !fenced {
        return Ok(false);
    }
    if usize::try_from(copied).unwrap_or(0) != events.len() {
        return Err(crate::Error::Database(sqlx::Error::Protocol(format!(
            "moving {} events of stuck keys aside copied {copied}: an event's row is gone from ordo.events",
            events.len()
        ))));
    }
    Ok(true)
}

/// [`TAKEN`] in the delivering transaction: false when the fence refused or a copy was gone.
pub(crate) async fn taken(
    connection: &mut PgConnection,
    name: &str,
    owner: Uuid,
    positions: &[i64],
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(TAKEN)
        .bind(name)
        .bind(owner)
        .bind(positions)
        .fetch_one(connection)
        .await
}

/// [`PAGE`]: up to [`PAGE_ROWS`] of a group's rows after `after`, as items taken back, each
/// with its failed attempts.
pub(crate) async fn page<P: DeserializeOwned>(
    pool: &PgPool,
    name: &str,
    ordering: Ordering,
    (keys, keyless, after): (&[String], &[i64], u64),
) -> crate::Result<Vec<Taken<P>>> {
    let rows = sqlx::query(PAGE)
        .bind(name)
        .bind(keys)
        .bind(keyless)
        .bind(i64::try_from(after).unwrap_or(i64::MAX))
        .bind(i64::try_from(PAGE_ROWS).unwrap_or(i64::MAX))
        .fetch_all(pool)
        .await?;
    let mut items = Vec::with_capacity(rows.len());
    for row in rows {
        let position = u64::try_from(row.try_get::<i64, _>("position")?).unwrap_or(0);
        let attempts = crate::consumer::sql::attempts_read(row.try_get("attempts")?);
        let route: Option<String> = row.try_get("route")?;
        let previous: Option<i64> = row.try_get("previous")?;
        let link = previous.map(|previous| (route, u64::try_from(previous).unwrap_or(0)));
        let slot = crate::insert_lane::rows::decode_full::<P>(&row)?;
        let event = match slot.item {
            SlotItem::Event(event) => Ok(event),
            SlotItem::Undecodable(undecodable) => Err(undecodable),
            // A copy always has a payload.
            SlotItem::Meta | SlotItem::Placeholder => continue,
        };
        let item = Item {
            position: Position::new(ordering, position),
            sequence: EventSequence::new(slot.sequence),
            boundary: true,
            event,
            skipped: false,
            refused: None,
            aside: true,
        };
        items.push(Taken {
            item,
            attempts,
            link,
        });
    }
    Ok(items)
}
