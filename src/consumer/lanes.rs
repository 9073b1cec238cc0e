//! The keyed scheduler: which buffered events may run now.
//!
//! Every key is a lane: the queue of the unfinished events that carry it, in lane order. An
//! event may run when it is first in every one of its lanes, so events sharing a key run one
//! at a time in order, an event with several keys joins their lanes, and order holds
//! transitively (an event waiting in one lane holds its other lanes for the events behind it).
//! An event with no key is first in nothing and waits for nothing. A *barrier* (an event whose
//! keys cannot be known: its payload does not decode) waits for every event before it and
//! holds every event after it.
//!
//! A failed event stays first in its lanes while it backs off. A stalled one (attempts
//! exhausted, a relay's parked event) is set aside with its keys' events (`aside.rs`, for the
//! backlog), but a barrier, which holds its lanes until retried. The window holds every event
//! from the low watermark on, finished or not, and events taken back from a backlog; the
//! watermark moves past finished events at its front. No I/O here (`schedule.rs` drives it).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use tokio::time::Instant;

mod aside;
mod failures;

use super::keys::Keys;

/// An event's index in arrival order (not its lane position, which may have gaps).
pub(crate) type Slot = u64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum State {
    Waiting,
    Running,
    /// Failed; waits until the instant, first in its lanes.
    Backoff(Instant),
    /// Attempts exhausted under `Halt`: first in its lanes until retried.
    Stalled,
    /// Its key is stuck: out of its lanes while its copy is written to the backlog
    /// (`backlog.rs`), then done here.
    Aside,
    Done,
}

pub(crate) struct Entry<T> {
    pub(crate) position: u64,
    pub(crate) keys: Keys,
    pub(crate) barrier: bool,
    /// Dropped once done.
    pub(crate) item: Option<T>,
    /// What `item` weighs in bytes, counted in [`Lanes::held_bytes`] while it is held.
    weight: usize,
    /// Failed attempts so far.
    pub(crate) attempts: u32,
    pub(crate) state: State,
    /// The last error, while failing or stalled.
    pub(crate) error: Option<String>,
    /// Stalled and out of its lanes (and out of the barriers): it holds nothing but the
    /// watermark.
    detached: bool,
    /// When this runner stalled it (`None` when it arrived stalled, or is not).
    pub(crate) stalled_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Taken back from a stuck key's backlog: its position is below the watermark, which it
    /// never moves.
    pub(crate) aside: bool,
}

/// How an event enters the window (a restarted runner knows some from the stored progress).
pub(crate) enum Arrival {
    /// To be handled, after `attempts` failed tries.
    Pending { attempts: u32 },
    /// Finished already (handled, dead-lettered, or not for this subscription).
    Done,
    /// Stalled by an earlier runner.
    Stalled { attempts: u32, error: String },
}

pub(crate) struct Lanes<T> {
    window: VecDeque<Entry<T>>,
    /// The slot of `window[0]`.
    first: Slot,
    watermark: u64,
    queues: HashMap<Arc<str>, VecDeque<Slot>>,
    barriers: BTreeSet<Slot>,
    ready: BTreeSet<Slot>,
    backoffs: BTreeSet<(Instant, Slot)>,
    /// A stalled event leaves its lanes instead of holding them.
    let_stalled_go: bool,
    /// How many entries are detached.
    detached: usize,
    /// What the items held weigh (see [`Lanes::push`]).
    held_bytes: usize,
    /// Entries taken back from a backlog in the window, finished or not (positions out of
    /// order: [`find`](Self::find) searches them one by one).
    aside_present: usize,
    /// Those not finished yet.
    aside_unfinished: usize,
}

impl<T> Lanes<T> {
    /// An empty window after `watermark`.
    pub(crate) fn new(watermark: u64) -> Self {
        Self {
            window: VecDeque::new(),
            first: 0,
            watermark,
            queues: HashMap::new(),
            barriers: BTreeSet::new(),
            ready: BTreeSet::new(),
            backoffs: BTreeSet::new(),
            let_stalled_go: false,
            detached: 0,
            held_bytes: 0,
            aside_present: 0,
            aside_unfinished: 0,
        }
    }

    /// A stalled event leaves its lanes: the later events of its keys run on (no longer in
    /// order with it), and a retry puts it back at the end of its lanes. It still holds the
    /// watermark. Default: a stalled event holds its lanes until retried.
    pub(crate) fn let_stalled_go(mut self) -> Self {
        self.let_stalled_go = true;
        self
    }

    /// Every event at or below this position is finished.
    pub(crate) fn watermark(&self) -> u64 {
        self.watermark
    }

    /// Events held, from the watermark on.
    pub(crate) fn len(&self) -> usize {
        self.window.len()
    }

    /// What the unfinished events' items weigh, as their `weight`s at [`push`](Self::push)
    /// said (a finished event's item is dropped, and its weight with it).
    pub(crate) fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// Adds the next event of the lane (positions must grow), weighing nothing.
    #[cfg(test)]
    pub(crate) fn push(
        &mut self,
        position: u64,
        keys: Keys,
        barrier: bool,
        item: T,
        arrival: Arrival,
    ) {
        let _ = self.push_weighed(position, keys, barrier, item, arrival, 0);
    }

    /// Adds the next event of the lane (positions must grow); its item weighs `weight` bytes
    /// until it is done.
    pub(crate) fn push_weighed(
        &mut self,
        position: u64,
        keys: Keys,
        barrier: bool,
        item: T,
        arrival: Arrival,
        weight: usize,
    ) -> Slot {
        // Events taken back from a backlog are out of lane order (a restarted runner may take
        // one back above where it has read).
        debug_assert!(
            self.window
                .iter()
                .rev()
                .find(|entry| !entry.aside)
                .is_none_or(|last| last.position < position)
        );
        let slot = self.first + self.window.len() as u64;
        let (state, attempts, error) = match arrival {
            Arrival::Done => (State::Done, 0, None),
            Arrival::Pending { attempts } => (State::Waiting, attempts, None),
            Arrival::Stalled { attempts, error } => (State::Stalled, attempts, Some(error)),
        };
        let done = state == State::Done;
        let detached = self.let_stalled_go && state == State::Stalled;
        if !done && !detached {
            self.join_lanes(slot, &keys, barrier);
        }
        let weight = if done { 0 } else { weight };
        self.held_bytes += weight;
        self.window.push_back(Entry {
            position,
            keys,
            barrier,
            weight,
            item: (!done).then_some(item),
            attempts,
            state,
            error,
            detached,
            stalled_at: None,
            aside: false,
        });
        self.detached += usize::from(detached);
        if done {
            self.advance();
        } else {
            self.check(slot);
        }
        slot
    }

    /// The oldest event that may run now, marked running.
    pub(crate) fn take_ready(&mut self) -> Option<(Slot, &Entry<T>)> {
        let slot = self.ready.pop_first()?;
        let index = self.index(slot)?;
        let entry = &mut self.window[index];
        entry.state = State::Running;
        Some((slot, &self.window[index]))
    }

    /// Whether an event may run now.
    pub(crate) fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    pub(crate) fn entry(&self, slot: Slot) -> Option<&Entry<T>> {
        self.index(slot).map(|index| &self.window[index])
    }

    /// The slot of the event at `position`, if the window holds it.
    pub(crate) fn find(&self, position: u64) -> Option<Slot> {
        if self.aside_present > 0 {
            return self
                .entries()
                .find(|(_, entry)| entry.position == position)
                .map(|(slot, _)| slot);
        }
        let index = self
            .window
            .binary_search_by_key(&position, |entry| entry.position)
            .ok()?;
        Some(self.first + index as u64)
    }

    /// The event finished (handled, or dead-lettered): its lanes move on. True if the
    /// watermark moved.
    pub(crate) fn complete(&mut self, slot: Slot) -> bool {
        let Some(index) = self.index(slot) else {
            return false;
        };
        let entry = &mut self.window[index];
        if entry.state == State::Done {
            return false;
        }
        let out_of_lanes = entry.state == State::Aside;
        entry.state = State::Done;
        entry.item = None;
        entry.error = None;
        self.held_bytes -= std::mem::take(&mut entry.weight);
        let was_detached = std::mem::take(&mut entry.detached);
        let keys = entry.keys.clone();
        let barrier = entry.barrier;
        if entry.aside {
            self.aside_unfinished -= 1;
        }
        self.ready.remove(&slot);
        if was_detached {
            self.detached -= 1;
        } else if !out_of_lanes {
            self.leave_lanes(slot, &keys, barrier);
        }
        let before = self.watermark;
        self.advance();
        if self.detached > 0 {
            // A barrier waits for the events before it, detached ones excepted: this one may
            // have been the last it waited for.
            self.check_first_barrier();
        }
        self.watermark != before
    }

    /// Takes `slot` out of its lanes (and the barriers): the events behind it may run.
    /// Puts `slot` at the end of each of its keys' lanes (and among the barriers, if it is one).
    fn join_lanes(&mut self, slot: Slot, keys: &Keys, barrier: bool) {
        for key in keys.shared() {
            self.queues
                .entry(Arc::clone(key))
                .or_default()
                .push_back(slot);
        }
        if barrier {
            self.barriers.insert(slot);
        }
    }

    fn leave_lanes(&mut self, slot: Slot, keys: &Keys, barrier: bool) {
        for key in keys.shared() {
            let Some(queue) = self.queues.get_mut(key) else {
                continue;
            };
            queue.retain(|queued| *queued != slot);
            match queue.front().copied() {
                Some(next) => self.check(next),
                None => {
                    self.queues.remove(key);
                }
            }
        }
        if barrier {
            self.barriers.remove(&slot);
            self.check_all();
        }
    }

    fn index(&self, slot: Slot) -> Option<usize> {
        let index = usize::try_from(slot.checked_sub(self.first)?).ok()?;
        (index < self.window.len()).then_some(index)
    }

    /// Marks `slot` ready if it is waiting, first in every lane, and no barrier holds it.
    fn check(&mut self, slot: Slot) {
        let Some(index) = self.index(slot) else {
            return;
        };
        let entry = &self.window[index];
        if entry.state != State::Waiting {
            return;
        }
        if let Some(&barrier) = self.barriers.first() {
            // A barrier holds everything after it, and waits for everything before it.
            if barrier < slot || (barrier == slot && !self.only_finished_before(slot)) {
                return;
            }
        }
        let first_everywhere = entry.keys.shared().iter().all(|key| {
            self.queues
                .get(key)
                .and_then(|queue| queue.front())
                .is_some_and(|front| *front == slot)
        });
        if first_everywhere {
            self.ready.insert(slot);
        }
    }

    /// Whether every event before `slot` is finished or detached.
    fn only_finished_before(&self, slot: Slot) -> bool {
        if slot == self.first {
            return true;
        }
        // The finished events at the front are gone: with none detached, one is left before.
        let Some(index) = self.index(slot) else {
            return false;
        };
        self.detached > 0
            && self
                .window
                .iter()
                .take(index)
                .all(|entry| entry.state == State::Done || entry.detached)
    }

    fn check_first_barrier(&mut self) {
        if let Some(&barrier) = self.barriers.first() {
            self.check(barrier);
        }
    }

    fn check_all(&mut self) {
        for slot in self.first..self.first + self.window.len() as u64 {
            self.check(slot);
        }
    }

    /// Moves the watermark past the finished events at the window's front.
    fn advance(&mut self) {
        while self
            .window
            .front()
            .is_some_and(|entry| entry.state == State::Done)
        {
            if let Some(entry) = self.window.pop_front() {
                if entry.aside {
                    self.aside_present -= 1;
                } else {
                    self.watermark = entry.position;
                }
                self.first += 1;
            }
        }
        // A barrier may now be first.
        if let Some(&barrier) = self.barriers.first()
            && barrier == self.first
        {
            self.check(barrier);
        }
    }
}

#[cfg(test)]
#[path = "lanes_tests.rs"]
mod tests;
