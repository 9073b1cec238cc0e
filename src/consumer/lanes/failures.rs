//! What a failure does to the schedule: an event backing off and waking, stalled (parked)
//! and retried by an operator, and the stalled keys as the status lists them.

use tokio::time::Instant;

#[cfg(test)]
use super::Entry;
use super::{Lanes, Slot, State};
use crate::consumer::status::StalledKey;
use crate::position::{Ordering, Position};

impl<T> Lanes<T> {
    /// The event failed and will be tried again at `at`, first in its lanes until then.
    pub(crate) fn back_off(&mut self, slot: Slot, attempts: u32, error: String, at: Instant) {
        if let Some(index) = self.index(slot) {
            let entry = &mut self.window[index];
            entry.state = State::Backoff(at);
            entry.attempts = attempts;
            entry.error = Some(error);
            self.backoffs.insert((at, slot));
        }
    }

    /// The event's attempts ran out under `Halt` (or a relay parked it): its lanes wait until
    /// [`retry`](Self::retry), unless the lanes [let stalled events go](Self::let_stalled_go).
    pub(crate) fn stall(&mut self, slot: Slot, attempts: u32, error: String) {
        let Some(index) = self.index(slot) else {
            return;
        };
        let entry = &mut self.window[index];
        entry.state = State::Stalled;
        entry.attempts = attempts;
        entry.error = Some(error);
        entry.stalled_at = Some(chrono::Utc::now());
        if self.let_stalled_go && !entry.detached {
            entry.detached = true;
            let (keys, barrier) = (entry.keys.clone(), entry.barrier);
            self.detached += 1;
            self.ready.remove(&slot);
            self.leave_lanes(slot, &keys, barrier);
            self.check_first_barrier();
        }
    }

    /// An operator retried a stalled event: it runs again, its attempts counted from zero.
    pub(crate) fn retry(&mut self, slot: Slot) {
        if let Some(index) = self.index(slot)
            && self.window[index].state == State::Stalled
        {
            let entry = &mut self.window[index];
            entry.state = State::Waiting;
            entry.attempts = 0;
            entry.stalled_at = None;
            if std::mem::take(&mut entry.detached) {
                // Back at the end of its lanes: behind the events of its keys held now (some
                // may be running), ahead of those still to come. Never two of a key at once.
                self.detached -= 1;
                let (keys, barrier) = (entry.keys.clone(), entry.barrier);
                self.join_lanes(slot, &keys, barrier);
            }
            self.check(slot);
        }
    }

    /// When the next backoff ends.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.backoffs.first().map(|(at, _)| *at)
    }

    /// Events whose backoff has ended at `now` may run again.
    pub(crate) fn wake_due(&mut self, now: Instant) {
        while let Some(&(at, slot)) = self.backoffs.first() {
            if at > now {
                break;
            }
            self.backoffs.pop_first();
            if let Some(index) = self.index(slot)
                && self.window[index].state == State::Backoff(at)
            {
                self.window[index].state = State::Waiting;
                self.check(slot);
            }
        }
    }

    /// The keys held by stalled events, oldest event first, as the status shows them: one per
    /// key, the empty key for an event with none (or whose payload does not decode).
    pub(crate) fn stalled_keys(&self, ordering: Ordering) -> Vec<StalledKey> {
        let stalled: Vec<Slot> = self
            .entries()
            .filter(|(_, entry)| entry.state == State::Stalled)
            .map(|(slot, _)| slot)
            .collect();
        stalled
            .into_iter()
            .flat_map(|slot| self.stalled_keys_of(slot, ordering))
            .collect()
    }

    /// The stalled event at `slot`'s keys, as the status shows them.
    pub(crate) fn stalled_keys_of(&self, slot: Slot, ordering: Ordering) -> Vec<StalledKey> {
        let Some(entry) = self.entry(slot) else {
            return Vec::new();
        };
        let at = Position::new(ordering, entry.position);
        let error = entry.error.clone().unwrap_or_default();
        let mut keys: Vec<String> = entry.keys.iter().map(str::to_owned).collect();
        if keys.is_empty() {
            keys.push(String::new());
        }
        keys.into_iter()
            .map(|key| StalledKey {
                key,
                position: at,
                attempts: entry.attempts,
                error: error.clone(),
                retry_requested: false,
                since: entry.stalled_at,
                holds_watermark: !entry.aside && entry.position == self.watermark() + 1,
            })
            .collect()
    }

    /// The stalled events, oldest first.
    #[cfg(test)]
    pub(crate) fn stalled(&self) -> impl Iterator<Item = &Entry<T>> {
        self.window
            .iter()
            .filter(|entry| entry.state == State::Stalled)
    }
}
