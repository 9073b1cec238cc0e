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

use super::Consumer;
use super::keys::Keys;
use super::lanes::{Arrival, Lanes};
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
}

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
            Some(Known::Done) => Arrival::Done,
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
        self.lanes
            .push_weighed(position, keys, barrier, item, arrival, weight);
    }
}
