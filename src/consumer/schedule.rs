//! One claim's keyed work, as keyed subscriptions and relays both keep it: the schedule of the
//! events held past the low watermark (`lanes.rs`), what the stored progress knows of events
//! not read yet, the watermark as stored, and the timers of the periodic work (the flush that
//! also renews the lease, operators' retries of stalled events).
//!
//! What an executor does with a ready event (a handler task, a place in a batch) and how it
//! stores the watermark (a relay first waits for its marks) are its own; when each is due, and
//! what a retry or a read event does to the schedule, are here.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use super::Consumer;
use super::backlog::{self, Aside, Backlogs, Taken};
use super::keys::Keys;
use super::lanes::{Arrival, Lanes, Slot, State};
use super::progress::{self, Known};
use super::source::Item;
use crate::envelope::Envelope;
use crate::position::Position;

/// The stored watermark follows the finished events this often (when it moved).
pub(crate) const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// Operators' retries of stalled events are looked for at least this often.
pub(crate) const RETRIES_EVERY: Duration = Duration::from_secs(1);

/// The keyed work of one claim, from the stored watermark on.
pub(crate) struct Schedule<P> {
    pub(crate) lanes: Lanes<Item<P>>,
    /// What the stored progress says about events not read yet.
    pub(crate) known: HashMap<u64, Known>,
    /// The watermark as stored.
    pub(crate) stored: Position,
    pub(crate) flush_at: Instant,
    pub(crate) renew_at: Instant,
    pub(crate) retries_at: Instant,
    /// The stalled events changed since the status last listed them.
    pub(crate) stalled_changed: bool,
    /// The stuck keys, whose events go aside (`backlog.rs`).
    pub(crate) backlogs: Backlogs,
}

/// A relay's route chain link of the event at a position (see [`Aside::link`]).
pub(crate) type LinkOf<'a> = &'a (dyn Fn(u64) -> Option<(Option<String>, u64)> + Sync);

/// What the timers ask of the executor ([`Schedule::due`]).
pub(crate) struct Due {
    /// Look for operators' retries ([`Schedule::take_retries`]).
    pub(crate) retries: bool,
    /// Store the watermark (which renews the lease).
    pub(crate) flush: bool,
}

impl<P> Schedule<P> {
    /// The work of a claim whose row stands at `watermark`, with the progress stored above it.
    pub(crate) fn new(
        lanes: Lanes<Item<P>>,
        known: HashMap<u64, Known>,
        watermark: Position,
        renew_every: Duration,
        backlogs: Backlogs,
    ) -> Self {
        let now = Instant::now();
        Self {
            lanes,
            known,
            stored: watermark,
            flush_at: now + FLUSH_EVERY,
            renew_at: now + renew_every,
            retries_at: now,
            stalled_changed: true,
            backlogs,
        }
    }

    /// When the next timer is due, or a backoff ends; `also`, an executor's own (a relay's
    /// tenure), counts too.
    pub(crate) fn wake(&self, also: Option<Instant>) -> Instant {
        [
            Some(self.flush_at),
            Some(self.renew_at),
            Some(self.retries_at),
            also,
            self.lanes.next_due(),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(self.renew_at)
    }

    /// Wakes the events whose backoff ended, and says what else is due now: retries every
    /// [`RETRIES_EVERY`] (sooner with a short lease), a flush when the watermark moved and
    /// [`FLUSH_EVERY`] passed, or when the lease is due for renewal.
    pub(crate) fn due(&mut self, renew_every: Duration) -> Due {
        let now = Instant::now();
        self.lanes.wake_due(now);
        let retries = now >= self.retries_at;
        if retries {
            self.retries_at = now + RETRIES_EVERY.min(renew_every);
        }
        let moved = self.lanes.watermark() != self.stored.get();
        let flush = (moved && now >= self.flush_at) || now >= self.renew_at;
        if !flush && now >= self.flush_at {
            self.flush_at = now + FLUSH_EVERY;
        }
        Due { retries, flush }
    }

    /// The watermark `to` was stored, and the lease renewed, by a statement sent at `asked`.
    pub(crate) fn flushed(&mut self, to: Position, asked: Instant, renew_every: Duration) {
        self.stored = to;
        self.flush_at = Instant::now() + FLUSH_EVERY;
        self.renew_at = asked + renew_every;
    }

    /// Storing the watermark failed: tried again after `backoff`; true if the lease is past
    /// its renewal (the executor claims again).
    pub(crate) fn flush_failed(&mut self, backoff: Duration) -> bool {
        let now = Instant::now();
        self.flush_at = now + backoff;
        now >= self.renew_at
    }

    /// Takes operators' retries of stalled events (`ordo subscriptions retry-keys`,
    /// `ordo relay requeue`): a held event runs again, one not read yet arrives fresh. A
    /// failure to look is logged and tried at the next turn.
    pub(crate) async fn take_retries(&mut self, core: &Consumer) {
        let taken = progress::take_retries(&core.pool, &core.name, core.owner).await;
        let positions = match taken {
            Ok(positions) => positions,
            Err(error) => {
                tracing::warn!(%error, subscription = %core.name, kind = core.kind.as_str(), "looking for operators' retries failed");
                return;
            }
        };
        for position in positions {
            self.stalled_changed = true;
            if self.backlogs.retried(position) {
                tracing::info!(subscription = %core.name, kind = core.kind.as_str(), position, "stalled event retried by an operator: its key's backlog is taken back in order");
                continue;
            }
            match self.lanes.find(position) {
                Some(slot) => self.lanes.retry(slot),
                None => {
                    self.known.insert(position, Known::Failing { attempts: 0 });
                }
            }
            tracing::info!(subscription = %core.name, kind = core.kind.as_str(), position, "stalled event retried by an operator");
        }
    }

    /// Takes the next event of the lane into the schedule, with what the stored progress knows
    /// about it, its keys (`keys_of`; `None`: they cannot be known) and what it weighs. An
    /// event whose keys cannot be known (its payload does not decode) is a barrier, and one
    /// its consumer skips is done.
    pub(crate) fn admit(
        &mut self,
        item: Item<P>,
        keys_of: impl FnOnce(&std::sync::Arc<Envelope<P>>) -> Option<Keys>,
        weight: usize,
    ) {
        let position = item.position.get();
        let arrival = match self.known.remove(&position) {
            Some(Known::Done | Known::Aside) => Arrival::Done,
            Some(Known::Failing { attempts }) => Arrival::Pending { attempts },
            Some(Known::Stalled { attempts, error }) => {
                self.stalled_changed = true;
                Arrival::Stalled { attempts, error }
            }
            None if item.skipped => Arrival::Done,
            None => Arrival::Pending { attempts: 0 },
        };
        let keys = match &item.event {
            Ok(event) if !item.skipped => keys_of(event),
            Ok(_) => Some(Keys::none()),
            Err(_) => None,
        };
        // Keys that cannot be known: it waits for everything before it, holds everything after.
        let barrier = keys.is_none();
        let keys = keys.unwrap_or_else(Keys::none);
        let stalled = matches!(arrival, Arrival::Stalled { .. });
        let pending = matches!(arrival, Arrival::Pending { .. });
        let slot = self
            .lanes
            .push_weighed(position, keys, barrier, item, arrival, weight);
        if barrier {
            // Its keys cannot be known: it holds everything, stalled or not.
            return;
        }
        if stalled {
            // Stalled by an earlier runner that stopped before moving it aside.
            self.stuck(slot);
        } else if pending
            && let Some(entry) = self.lanes.entry(slot)
            && self.backlogs.holds(&entry.keys)
        {
            let keys = entry.keys.clone();
            self.backlogs.follows(&keys);
            self.set_aside(slot);
        }
    }

    /// The event at `slot` stalled (attempts exhausted under `Halt`, or a relay parked it):
    /// it goes aside, and with it every event of its keys held and still to come, unless it is
    /// a barrier (its keys cannot be known: it holds everything until retried).
    pub(crate) fn stall(&mut self, slot: Slot, attempts: u32, error: String) {
        self.lanes.stall(slot, attempts, error);
        self.stalled_changed = true;
        self.stuck(slot);
    }

    fn stuck(&mut self, slot: Slot) {
        let Some(entry) = self.lanes.entry(slot) else {
            return;
        };
        if entry.barrier {
            return;
        }
        let (position, taken_back) = (entry.position, entry.aside);
        let mut shown = self.lanes.stalled_keys_of(slot, self.stored.lane());
        for key in &mut shown {
            // In the backlog, it holds only its keys.
            key.holds_watermark = false;
        }
        self.backlogs.show(position, shown);
        // A relay's parked event under `OnParked::Continue` holds no key: it goes aside alone.
        let keys = if self.lanes.lets_stalled_go() {
            Keys::none()
        } else {
            entry.keys.clone()
        };
        let group = self.backlogs.stalled(position, &keys);
        if taken_back {
            // Its copy is still in the backlog.
            self.lanes.complete(slot);
        } else {
            let row_keys = keys.iter().map(str::to_owned).collect();
            if self.lanes.set_aside(slot) {
                self.backlogs.set_aside(slot, row_keys);
            }
        }
        if !group.is_empty() {
            self.sweep();
        }
    }

    /// Every waiting event holding a stuck key leaves the window: one taken back from the
    /// backlog finishes here (its copy stays there), a live one goes aside after it. Their keys
    /// join the stuck group, so this repeats until no waiting event holds one.
    fn sweep(&mut self) {
        loop {
            let caught: Vec<(Slot, bool, Keys)> = self
                .lanes
                .entries()
                .filter(|(_, entry)| {
                    entry.state == State::Waiting && self.backlogs.holds(&entry.keys)
                })
                .map(|(slot, entry)| (slot, entry.aside, entry.keys.clone()))
                .collect();
            if caught.is_empty() {
                return;
            }
            for (slot, taken_back, keys) in caught {
                self.backlogs.follows(&keys);
                if taken_back {
                    self.lanes.complete(slot);
                } else {
                    self.set_aside(slot);
                }
            }
        }
    }

    fn set_aside(&mut self, slot: Slot) {
        let Some(keys) = self
            .lanes
            .entry(slot)
            .map(|entry| entry.keys.iter().map(str::to_owned).collect())
        else {
            return;
        };
        if self.lanes.set_aside(slot) {
            self.backlogs.set_aside(slot, keys);
        }
    }

    /// The stalled events' keys, as the status shows them: those held in the window (an
    /// event whose keys cannot be known), then those in the backlogs.
    pub(crate) fn stalled_keys(&self) -> Vec<crate::consumer::StalledKey> {
        let mut stalled = self.lanes.stalled_keys(self.stored.lane());
        stalled.extend(self.backlogs.shown().cloned());
        stalled
    }

    /// Whether [`tend`](Self::tend) has work: copies to write, or a backlog to take back a page
    /// of (once the page before it is finished).
    pub(crate) fn needs_tending(&self) -> bool {
        self.backlogs.has_pending()
            || (self.backlogs.any()
                && self.lanes.aside_unfinished() == 0
                && self.backlogs.draining().is_some())
    }

    /// Writes the copies of the events set aside (then finished here), or takes the next page
    /// of a backlog being taken back into the window, with its keys (`keys_of`) and weight.
    /// `Ok(false)` when the fence refused (the lease is lost).
    pub(crate) async fn tend(
        &mut self,
        core: &Consumer,
        link_of: LinkOf<'_>,
        keys_of: impl Fn(&Arc<Envelope<P>>) -> Keys,
        weigh: impl Fn(&Item<P>) -> usize,
    ) -> crate::Result<Option<Vec<(u64, Option<(Option<String>, u64)>)>>>
    where
        P: DeserializeOwned,
    {
        if self.backlogs.has_pending() {
            let mut events = Vec::new();
            let mut slots = Vec::new();
            for (slot, keys) in self.backlogs.take_pending() {
                let Some(entry) = self.lanes.entry(slot) else {
                    continue;
                };
                let Some(item) = entry.item.as_ref().filter(|_| entry.state == State::Aside) else {
                    continue;
                };
                events.push(Aside {
                    position: entry.position,
                    sequence: item.sequence.get(),
                    keys,
                    link: link_of(entry.position),
                });
                slots.push(slot);
            }
            if !events.is_empty() {
                if !backlog::write(&core.pool, &core.name, core.owner, &events).await? {
                    return Ok(None);
                }
                metrics::counter!(crate::telemetry::metrics::BACKLOG_MOVED, "subscription" => core.name.clone(), "kind" => core.kind.as_str())
                    .increment(events.len() as u64);
                for slot in slots {
                    self.lanes.complete(slot);
                }
            }
            return Ok(Some(Vec::new()));
        }
        if self.lanes.aside_unfinished() > 0 {
            return Ok(Some(Vec::new()));
        }
        let Some((id, keys, keyless, after)) = self.backlogs.draining() else {
            return Ok(Some(Vec::new()));
        };
        let ordering = self.stored.lane();
        let page: Vec<Taken<P>> =
            backlog::page(&core.pool, &core.name, ordering, (&keys, &keyless, after)).await?;
        let done = page.len() < backlog::PAGE_ROWS;
        let last = page.last().map(|taken| taken.item.position.get());
        let mut links = Vec::with_capacity(page.len());
        for taken in page {
            let keys = match &taken.item.event {
                Ok(event) => keys_of(event),
                Err(_) => Keys::none(),
            };
            let position = taken.item.position.get();
            let weight = weigh(&taken.item);
            links.push((position, taken.link));
            self.lanes
                .push_aside(position, keys, taken.item, taken.attempts, weight);
        }
        metrics::counter!(crate::telemetry::metrics::BACKLOG_TAKEN_BACK, "subscription" => core.name.clone(), "kind" => core.kind.as_str())
            .increment(links.len() as u64);
        self.backlogs.page_taken(id, last, done);
        if done {
            let stuck: BTreeSet<&str> = keys.iter().map(String::as_str).collect();
            tracing::info!(subscription = %core.name, kind = core.kind.as_str(), keys = ?stuck, "a stuck group's backlog is taken back: its keys rejoin the live flow");
        }
        self.stalled_changed = true;
        Ok(Some(links))
    }
}
