//! Stuck keys and their backlogs: a stalled event (a relay's parked one, a keyed
//! subscription's under `Halt`) and every later event of its keys leave the window for
//! `ordo.key_backlogs`, so the low watermark moves past them and the window holds only live
//! keys, however long a key stays stuck.
//!
//! **Groups.** Keys are stuck together: a stalled event's keys form a group; an event read
//! later with a key of a group goes aside too, and its other keys join that group (a later
//! event of one of them must not overtake it). A group holds *heads*, its stalled events not
//! retried yet; while it holds one, every event of its keys goes aside.
//!
//! **Taking a group back.** When an operator's retry (or requeue) leaves a group without a
//! head, its backlog drains: pages of its rows, in lane order, enter the window as events
//! taken back ([`Lanes::push_aside`](super::lanes::Lanes::push_aside)), behind the events of
//! their keys held now; the keys stay stuck (later events still go aside, after the rows
//! already there) until a page comes back short, and then rejoin the live flow. A page is
//! loaded only when the one before it is finished, so memory stays bounded by the page. An
//! event taken back that stalls again forms a group anew: the rest of the group's rows stay
//! in the backlog, the events of its keys held live go aside after them.
//!
//! **Durability.** A copy is written, fenced by the lease, before the event is finished in the
//! window ([`WRITE`]), so no flush passes an event before its copy is stored; a claim reads
//! the positions of the copies above the stored watermark as finished ([`progress::LOAD`]).
//! A copy leaves in the transaction that delivers it (the handler's, or a relay's marks),
//! fenced by the lease ([`TAKEN`]). Events whose keys cannot be known (a barrier) never go
//! aside: they hold everything, as before.
//!
//! [`progress::LOAD`]: super::progress::LOAD

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use super::keys::Keys;
use super::lanes::Slot;
use super::source::Item;
use crate::insert_lane::cache::SlotItem;
use crate::position::{EventSequence, Ordering, Position};

/// Copies events into the backlog from `ordo.events`, fenced by the lease (`FOR SHARE` holds
/// off a takeover until COMMIT). `$3`: a JSON array of `{position, sequence, keys, route,
/// previous}`. Returns
/// whether the fence held and how many rows are in the backlog for the positions asked (a
/// copy already there, an event stalled again, counts): fewer means an event's row is gone.
const WRITE: &str = r#"
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
const GROUPS: &str = r#"
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

/// The next page of a group's rows, in lane order, with the stalled event's attempts.
const PAGE: &str = r#"
SELECT b.position, b.sequence, b.commit_xid, b.id, b.payload::text AS payload,
       b.headers::text AS headers, b.recorded_at, b.event_type, b.route, b.previous,
       coalesce(p.attempts, 0) AS attempts
FROM ordo.key_backlogs AS b
LEFT JOIN ordo.subscription_progress AS p
       ON p.subscription = b.subscription AND p.position = b.position AND p.state <> 'done'
WHERE b.subscription = $1 AND (b.keys && $2::text[] OR b.position = ANY($3::bigint[]))
  AND b.position > $4
ORDER BY b.position
LIMIT $5
"#;

/// At most this many events of a backlog are taken back into the window at once.
pub(crate) const PAGE_ROWS: usize = 256;

/// A group of keys stuck together.
#[derive(Debug, Default)]
struct Group {
    keys: BTreeSet<Arc<str>>,
    /// Its stalled events not retried yet, by position.
    heads: BTreeSet<u64>,
    /// Its rows without a key (a stalled event with none, or a relay's parked event under
    /// `OnParked::Continue`, which holds no key).
    keyless: BTreeSet<u64>,
    /// Taking it back: the last position loaded so far.
    drain: Option<u64>,
}

/// One claim's stuck keys (see the module's docs).
#[derive(Debug, Default)]
pub(crate) struct Backlogs {
    groups: HashMap<u64, Group>,
    by_key: HashMap<Arc<str>, u64>,
    next: u64,
    /// Events set aside in the window whose copy is not written yet, with the keys their row
    /// holds.
    pending: Vec<(Slot, Vec<String>)>,
    /// Events taken back from a backlog since the claim (for the status).
    pub(crate) taken_back: u64,
}

/// One event taken back from a backlog.
pub(crate) struct Taken<P> {
    pub(crate) item: Item<P>,
    /// Its failed attempts (a stalled event's; 0 for the rest).
    pub(crate) attempts: u32,
    /// A relay's route chain link as first read (see [`Aside::link`]).
    pub(crate) link: Option<(Option<String>, u64)>,
}

/// An event to copy aside.
pub(crate) struct Aside {
    pub(crate) position: u64,
    pub(crate) sequence: u64,
    /// The keys its row holds (none for a relay's parked event under `OnParked::Continue`).
    pub(crate) keys: Vec<String>,
    /// A relay's route and the position before it on the route, kept so that a send from the
    /// backlog carries the link every earlier send of it did.
    pub(crate) link: Option<(Option<String>, u64)>,
}

impl Backlogs {
    /// The groups stored for `name`, as a claim finds them.
    pub(crate) async fn load(pool: &PgPool, name: &str) -> Result<Self, sqlx::Error> {
        let rows = sqlx::query(GROUPS).bind(name).fetch_all(pool).await?;
        let mut backlogs = Self::default();
        for row in rows {
            let keys: Vec<String> = row.try_get("keys")?;
            let heads: Vec<i64> = row.try_get("heads")?;
            let keyless: Vec<i64> = row.try_get("keyless")?;
            let keys: Vec<Arc<str>> = keys.into_iter().map(Arc::from).collect();
            let id = backlogs.join(&keys);
            let group = backlogs.groups.entry(id).or_default();
            group
                .heads
                .extend(heads.iter().filter_map(|at| u64::try_from(*at).ok()));
            group
                .keyless
                .extend(keyless.iter().filter_map(|at| u64::try_from(*at).ok()));
        }
        // A group without a stalled event (retried before the claim, or reset) drains now.
        for group in backlogs.groups.values_mut() {
            if group.heads.is_empty() {
                group.drain = Some(0);
            }
        }
        Ok(backlogs)
    }

    /// Whether any of `keys` is stuck: an event carrying it goes aside.
    pub(crate) fn holds(&self, keys: &Keys) -> bool {
        !self.by_key.is_empty()
            && keys
                .shared()
                .iter()
                .any(|key| self.by_key.contains_key(key))
    }

    /// Whether any key is stuck.
    pub(crate) fn any(&self) -> bool {
        !self.groups.is_empty()
    }

    /// `keys` stuck together (with every group one of them is in already); the group's id.
    fn join(&mut self, keys: &[Arc<str>]) -> u64 {
        let mut ids: BTreeSet<u64> = keys
            .iter()
            .filter_map(|key| self.by_key.get(key).copied())
            .collect();
        let id = match ids.pop_first() {
            Some(id) => id,
            None => {
                self.next += 1;
                self.groups.insert(self.next, Group::default());
                self.next
            }
        };
        for other in ids {
            if let Some(merged) = self.groups.remove(&other) {
                for key in &merged.keys {
                    self.by_key.insert(Arc::clone(key), id);
                }
                if let Some(group) = self.groups.get_mut(&id) {
                    group.keys.extend(merged.keys);
                    group.heads.extend(merged.heads);
                    group.keyless.extend(merged.keyless);
                    // A merged group being taken back starts over (its rows are all still in
                    // the backlog, or taken back and finished).
                    if merged.drain.is_some() && group.heads.is_empty() {
                        group.drain = Some(0);
                    }
                }
            }
        }
        if let Some(group) = self.groups.get_mut(&id) {
            for key in keys {
                if group.keys.insert(Arc::clone(key)) {
                    self.by_key.insert(Arc::clone(key), id);
                }
            }
        }
        id
    }

    /// An event stalled at `position` with `keys` (none under `OnParked::Continue`): its group
    /// holds it as a head, and stops taking its rows back. Returns the group's keys.
    pub(crate) fn stalled(&mut self, position: u64, keys: &Keys) -> BTreeSet<Arc<str>> {
        let keys: Vec<Arc<str>> = keys.shared().to_vec();
        let id = self.join(&keys);
        let group = self.groups.entry(id).or_default();
        group.heads.insert(position);
        if keys.is_empty() {
            group.keyless.insert(position);
        }
        group.drain = None;
        group.keys.clone()
    }

    /// An event read with a stuck key goes aside: its keys join the group.
    pub(crate) fn follows(&mut self, keys: &Keys) {
        let keys: Vec<Arc<str>> = keys.shared().to_vec();
        self.join(&keys);
    }

    /// An operator retried the stalled event at `position`: true if it is in a backlog (its
    /// group drains once no other head holds it).
    pub(crate) fn retried(&mut self, position: u64) -> bool {
        let Some(group) = self
            .groups
            .values_mut()
            .find(|group| group.heads.contains(&position))
        else {
            return false;
        };
        group.heads.remove(&position);
        if group.heads.is_empty() && group.drain.is_none() {
            group.drain = Some(0);
        }
        true
    }

    /// An event to write aside, with the keys its row holds.
    pub(crate) fn set_aside(&mut self, slot: Slot, keys: Vec<String>) {
        self.pending.push((slot, keys));
    }

    /// Whether copies wait to be written.
    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The events waiting for their copy, taken.
    pub(crate) fn take_pending(&mut self) -> Vec<(Slot, Vec<String>)> {
        std::mem::take(&mut self.pending)
    }

    /// A group to take back a page of, if one is draining: its id, keys, key-less rows and
    /// where its last page ended.
    pub(crate) fn draining(&self) -> Option<(u64, Vec<String>, Vec<i64>, u64)> {
        let (id, group) = self
            .groups
            .iter()
            .filter(|(_, group)| group.drain.is_some())
            .min_by_key(|(id, _)| **id)?;
        Some((
            *id,
            group.keys.iter().map(|key| key.to_string()).collect(),
            group
                .keyless
                .iter()
                .filter_map(|at| i64::try_from(*at).ok())
                .collect(),
            group.drain.unwrap_or(0),
        ))
    }

    /// A page of group `id` was taken back up to `last`; a short one (`done`) was the last:
    /// its keys rejoin the live flow.
    pub(crate) fn page_taken(&mut self, id: u64, last: Option<u64>, done: bool) {
        if done {
            if let Some(group) = self.groups.remove(&id) {
                for key in group.keys {
                    self.by_key.remove(&key);
                }
            }
        } else if let Some(group) = self.groups.get_mut(&id)
            && let (Some(drain), Some(last)) = (group.drain.as_mut(), last)
        {
            *drain = last;
        }
    }

    /// The stuck keys, each with the positions of its group's stalled events.
    pub(crate) fn stuck_keys(&self) -> impl Iterator<Item = (&Arc<str>, bool)> {
        self.groups.values().flat_map(|group| {
            let draining = group.drain.is_some();
            group.keys.iter().map(move |key| (key, draining))
        })
    }
}

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
