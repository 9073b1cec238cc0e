//! The process-wide window of recent resolved positions, shared by every listener.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::envelope::Envelope;

/// What one resolved sequence holds.
pub(crate) enum SlotItem<P> {
    /// A committed event with a payload that decoded.
    Event(Arc<Envelope<P>>),
    /// A committed event whose payload does not decode as `P`.
    Undecodable(Arc<Undecodable>),
    /// A committed event read without its payload (the sequencer's light reads).
    Meta,
    /// A resolved hole: no transaction can ever commit this sequence.
    Placeholder,
}

impl<P> Clone for SlotItem<P> {
    fn clone(&self) -> Self {
        match self {
            Self::Event(event) => Self::Event(Arc::clone(event)),
            Self::Undecodable(error) => Self::Undecodable(Arc::clone(error)),
            Self::Meta => Self::Meta,
            Self::Placeholder => Self::Placeholder,
        }
    }
}

/// Why a committed event has no decoded payload, and the type its row names: a consumer that
/// does not select that type skips it rather than failing on it.
#[derive(Debug)]
pub(crate) struct Undecodable {
    pub(crate) error: Arc<serde_json::Error>,
    pub(crate) event_type: Option<String>,
}

/// One resolved position of the insert lane.
pub(crate) struct Slot<P> {
    pub(crate) sequence: u64,
    /// `None` for a placeholder.
    pub(crate) commit_xid: Option<i64>,
    pub(crate) item: SlotItem<P>,
}

impl<P> Clone for Slot<P> {
    fn clone(&self) -> Self {
        Self {
            sequence: self.sequence,
            commit_xid: self.commit_xid,
            item: self.item.clone(),
        }
    }
}

/// A contiguous run of slots ending at the frontier: `entries[i]` is sequence `base + i`.
pub(crate) struct Cache<P> {
    base: u64,
    entries: VecDeque<Slot<P>>,
    capacity: usize,
}

/// Where a requested sequence stands relative to the cache.
pub(crate) enum Lookup {
    /// Served: slots were copied out.
    Hit,
    /// Older than anything cached: the caller reads the table up to `before` (exclusive).
    Behind { before: u64 },
    /// Not resolved yet.
    Ahead,
}

impl<P> Cache<P> {
    pub(crate) fn new(frontier: u64, capacity: usize) -> Self {
        Self {
            base: frontier + 1,
            entries: VecDeque::with_capacity(capacity.min(65_536)),
            capacity,
        }
    }

    /// Appends the slot right after the current end, evicting the oldest past capacity.
    pub(crate) fn push(&mut self, slot: Slot<P>) {
        debug_assert_eq!(slot.sequence, self.base + self.entries.len() as u64);
        self.entries.push_back(slot);
        if self.entries.len() > self.capacity {
            self.entries.pop_front();
            self.base += 1;
        }
    }

    /// The slot at `sequence`, if cached.
    pub(crate) fn get(&self, sequence: u64) -> Option<Slot<P>> {
        let offset = usize::try_from(sequence.checked_sub(self.base)?).ok()?;
        self.entries.get(offset).cloned()
    }

    /// Copies up to `max` slots starting at `from` into `out`.
    pub(crate) fn read(&self, from: u64, max: usize, out: &mut Vec<Slot<P>>) -> Lookup {
        if from < self.base {
            return Lookup::Behind { before: self.base };
        }
        let offset = (from - self.base) as usize;
        if offset >= self.entries.len() {
            return Lookup::Ahead;
        }
        out.extend(self.entries.range(offset..).take(max).cloned());
        Lookup::Hit
    }
}
