//! Events of stuck keys (`backlog.rs`): set aside out of their lanes while their copy is
//! written, and taken back from the backlog behind the events of their keys held now.

use super::{Entry, Keys, Lanes, Slot, State};

impl<T> Lanes<T> {
    /// Whether a stalled event leaves its lanes (see [`let_stalled_go`](Self::let_stalled_go)).
    pub(crate) fn lets_stalled_go(&self) -> bool {
        self.let_stalled_go
    }

    /// Adds an event taken back from a stuck key's backlog (`backlog.rs`): at the end of its
    /// keys' lanes (behind the events of its keys held now), after `attempts` failed tries.
    /// Its position is below the watermark, which it never moves.
    pub(crate) fn push_aside(
        &mut self,
        position: u64,
        keys: Keys,
        item: T,
        attempts: u32,
        weight: usize,
    ) -> Slot {
        let slot = self.first + self.window.len() as u64;
        self.join_lanes(slot, &keys, false);
        self.held_bytes += weight;
        self.window.push_back(Entry {
            position,
            keys,
            barrier: false,
            weight,
            item: Some(item),
            attempts,
            state: State::Waiting,
            error: None,
            detached: false,
            stalled_at: None,
            aside: true,
        });
        self.aside_present += 1;
        self.aside_unfinished += 1;
        self.check(slot);
        slot
    }

    /// Takes a waiting or stalled event out of its lanes because its key is stuck: it waits
    /// ([`State::Aside`]) until its copy is in the backlog, then [`complete`](Self::complete)
    /// finishes it here. False (nothing changed) for an event running, backing off or done.
    pub(crate) fn set_aside(&mut self, slot: Slot) -> bool {
        let Some(index) = self.index(slot) else {
            return false;
        };
        let entry = &mut self.window[index];
        if !matches!(entry.state, State::Waiting | State::Stalled) {
            return false;
        }
        entry.state = State::Aside;
        let was_detached = std::mem::take(&mut entry.detached);
        let (keys, barrier) = (entry.keys.clone(), entry.barrier);
        self.ready.remove(&slot);
        if was_detached {
            self.detached -= 1;
        } else {
            self.leave_lanes(slot, &keys, barrier);
        }
        true
    }

    /// Every event held, with its slot, oldest first.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (Slot, &Entry<T>)> {
        (self.first..).zip(self.window.iter())
    }

    /// How many events taken back from a backlog are held and not finished.
    pub(crate) fn aside_unfinished(&self) -> usize {
        self.aside_unfinished
    }
}
