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
//! window ([`WRITE`](sql::WRITE)), so no flush passes an event before its copy is stored; a claim reads
//! the positions of the copies above the stored watermark as finished ([`progress::LOAD`]).
//! A copy leaves in the transaction that delivers it (the handler's, or a relay's marks),
//! fenced by the lease ([`TAKEN`](sql::TAKEN)). Events whose keys cannot be known (a barrier) never go
//! aside: they hold everything, as before.
//!
//! [`progress::LOAD`]: super::progress::LOAD

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use sqlx::{PgPool, Row};

use super::keys::Keys;
use super::lanes::Slot;
use super::source::Item;
use super::status::StalledKey;

mod admin;
mod sql;

pub(crate) use admin::attach_backlogs;
pub use admin::{
    BacklogAction, KeyBacklog, backlog_actions, list_backlog, purge_backlog, skip_stalled_event,
};

pub(crate) use sql::{page, taken, write};

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
    /// The stalled events in the backlogs, as the status shows them (one per key).
    shown: BTreeMap<u64, Vec<StalledKey>>,
    groups: HashMap<u64, Group>,
    by_key: HashMap<Arc<str>, u64>,
    next: u64,
    /// Events set aside in the window whose copy is not written yet, with the keys their row
    /// holds.
    pending: Vec<(Slot, Vec<String>)>,
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
        let rows = sqlx::query(sql::GROUPS).bind(name).fetch_all(pool).await?;
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
        for row in sqlx::query(sql::HEADS).bind(name).fetch_all(pool).await? {
            let position: i64 = row.try_get("position")?;
            let lane = crate::position::read_lane(&row, "lane").map_err(|error| {
                sqlx::Error::Decode(Box::new(std::io::Error::other(error.to_string())))
            })?;
            let at = crate::position::Position::new(lane, u64::try_from(position).unwrap_or(0));
            let mut keys: Vec<String> = row.try_get("keys")?;
            if keys.is_empty() {
                keys.push(String::new());
            }
            let attempts = super::sql::attempts_read(row.try_get("attempts")?);
            let error: String = row.try_get("error")?;
            let since = row.try_get("updated_at")?;
            let shown = keys
                .into_iter()
                .map(|key| StalledKey {
                    key,
                    position: at,
                    attempts,
                    error: error.clone(),
                    retry_requested: false,
                    since,
                    holds_watermark: false,
                })
                .collect();
            backlogs.shown.insert(at.get(), shown);
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
        self.shown.remove(&position);
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

    /// A stalled event moved to the backlog, as the status shows it (one per key).
    pub(crate) fn show(&mut self, position: u64, shown: Vec<StalledKey>) {
        self.shown.insert(position, shown);
    }

    /// The stalled events in the backlogs, oldest first, one per key.
    pub(crate) fn shown(&self) -> impl Iterator<Item = &StalledKey> {
        self.shown.values().flatten()
    }
}
