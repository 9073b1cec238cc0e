//! The process-wide window of recent resolved positions, shared by every listener.
//!
//! Bounded twice: by count (`cache_capacity`) and by the bytes of the payloads it holds
//! (`cache_bytes`, measured as the JSON text of payload and headers). Counting events alone
//! let three 100 MB payloads keep 300 MB alive for as long as 8,192 later events took to push
//! them out. An event larger than the whole byte budget is kept as a stub without its payload
//! ([`SlotItem::Meta`]): the position stays contiguous (the sequencer still sees its group),
//! and a listener that needs the payload reads that row from the table.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::envelope::Envelope;

/// What one resolved sequence holds.
pub(crate) enum SlotItem<P> {
    /// A committed event with a payload that decoded.
    Event(Arc<Envelope<P>>),
    /// A committed event whose payload does not decode as `P`.
    Undecodable(Arc<Undecodable>),
    /// A committed event held without its payload: read so by the sequencer's light reads,
    /// or too large for the cache's byte budget. A reader that needs payloads reads it from
    /// the table.
    Meta,
    /// A resolved hole: no transaction can ever commit this sequence.
    Placeholder,
}

/// A committed event as a reader hands it on: decoded, or why it did not decode.
pub(crate) type Decoded<P> = Result<Arc<Envelope<P>>, Arc<Undecodable>>;

impl<P> SlotItem<P> {
    /// The committed event this slot holds, decoded or not; `None` for a placeholder or a
    /// stub held without its payload, which each reader treats in its own way.
    pub(crate) fn into_event(self) -> Option<Decoded<P>> {
        match self {
            Self::Event(event) => Some(Ok(event)),
            Self::Undecodable(row) => Some(Err(row)),
            Self::Meta | Self::Placeholder => None,
        }
    }
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
    /// What the payload weighs against the cache's byte budget: the length of its JSON text
    /// and its headers'. Zero when no payload is held.
    pub(crate) bytes: usize,
    pub(crate) item: SlotItem<P>,
}

impl<P> Slot<P> {
    /// The same position without its payload (a [`SlotItem::Meta`] stub), for a slot too large
    /// to keep. Placeholders and stubs are returned as they are.
    pub(crate) fn without_payload(self) -> Self {
        match self.item {
            SlotItem::Event(_) | SlotItem::Undecodable(_) => Self {
                sequence: self.sequence,
                commit_xid: self.commit_xid,
                bytes: 0,
                item: SlotItem::Meta,
            },
            SlotItem::Meta | SlotItem::Placeholder => self,
        }
    }
}

impl<P> Clone for Slot<P> {
    fn clone(&self) -> Self {
        Self {
            sequence: self.sequence,
            commit_xid: self.commit_xid,
            bytes: self.bytes,
            item: self.item.clone(),
        }
    }
}

/// A contiguous run of slots ending at the frontier: `entries[i]` is sequence `base + i`.
pub(crate) struct Cache<P> {
    base: u64,
    entries: VecDeque<Slot<P>>,
    capacity: usize,
    /// The byte budget, and what the cached payloads weigh now.
    budget: usize,
    bytes: usize,
    /// Holds nothing, and sends every read to the table (a [table
    /// view](super::LaneShared::table_view)'s).
    disabled: bool,
}

/// Where a requested sequence stands relative to the cache.
pub(crate) enum Lookup {
    /// Served: slots were copied out.
    Hit,
    /// Not servable from the cache (older than anything cached, or held without its payload):
    /// the caller reads the table from the requested sequence up to `before` (exclusive).
    Behind { before: u64 },
    /// Not resolved yet.
    Ahead,
}

impl<P> Cache<P> {
    pub(crate) fn new(frontier: u64, capacity: usize, budget: usize) -> Self {
        Self {
            base: frontier + 1,
            entries: VecDeque::with_capacity(capacity.min(65_536)),
            capacity,
            budget,
            bytes: 0,
            disabled: false,
        }
    }

    /// A cache that holds nothing: every read is [`Lookup::Behind`], to the table.
    pub(crate) fn none(frontier: u64) -> Self {
        Self {
            disabled: true,
            ..Self::new(frontier, 0, 0)
        }
    }

    /// Appends the slot right after the current end, evicting the oldest past either bound.
    /// A payload larger than the whole budget is not kept: its slot stays as a stub.
    pub(crate) fn push(&mut self, slot: Slot<P>) {
        if self.disabled {
            return;
        }
        debug_assert_eq!(slot.sequence, self.base + self.entries.len() as u64);
        let slot = if slot.bytes > self.budget {
            slot.without_payload()
        } else {
            slot
        };
        self.bytes += slot.bytes;
        self.entries.push_back(slot);
        while self.entries.len() > self.capacity || self.bytes > self.budget {
            let Some(oldest) = self.entries.pop_front() else {
                break;
            };
            self.bytes -= oldest.bytes;
            self.base += 1;
        }
    }

    /// The slot at `sequence`, if cached (possibly a stub without its payload).
    pub(crate) fn get(&self, sequence: u64) -> Option<Slot<P>> {
        let offset = usize::try_from(sequence.checked_sub(self.base)?).ok()?;
        self.entries.get(offset).cloned()
    }

    /// Copies up to `max` slots starting at `from` into `out`. With `payloads`, only slots
    /// that can be handed to a listener as they are: the copy stops before a stub, and a run
    /// of stubs at `from` is reported as `Behind`, to be read from the table.
    pub(crate) fn read(
        &self,
        from: u64,
        max: usize,
        payloads: bool,
        out: &mut Vec<Slot<P>>,
    ) -> Lookup {
        if self.disabled {
            return Lookup::Behind { before: u64::MAX };
        }
        if from < self.base {
            return Lookup::Behind { before: self.base };
        }
        let offset = (from - self.base) as usize;
        if offset >= self.entries.len() {
            return Lookup::Ahead;
        }
        let run = self.entries.range(offset..);
        if !payloads {
            out.extend(run.take(max).cloned());
            return Lookup::Hit;
        }
        let stubs = run.clone().take_while(|slot| is_stub(slot)).count();
        if stubs > 0 {
            return Lookup::Behind {
                before: from + stubs as u64,
            };
        }
        out.extend(run.take(max).take_while(|slot| !is_stub(slot)).cloned());
        Lookup::Hit
    }

    /// What the cached payloads weigh, in bytes.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.bytes
    }
}

fn is_stub<P>(slot: &Slot<P>) -> bool {
    matches!(slot.item, SlotItem::Meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(sequence: u64, bytes: usize) -> Slot<()> {
        Slot {
            sequence,
            commit_xid: Some(1),
            bytes,
            item: SlotItem::Event(Arc::new(Envelope {
                id: uuid::Uuid::nil(),
                sequence: crate::EventSequence::new(sequence),
                commit_xid: 1,
                payload: (),
                event_type: None,
                headers: Default::default(),
                recorded_at: chrono::Utc::now(),
            })),
        }
    }

    fn sequences(cache: &Cache<()>, from: u64, payloads: bool) -> (Vec<u64>, Option<u64>) {
        let mut out = Vec::new();
        let behind = match cache.read(from, 100, payloads, &mut out) {
            Lookup::Behind { before } => Some(before),
            Lookup::Hit | Lookup::Ahead => None,
        };
        (out.iter().map(|slot| slot.sequence).collect(), behind)
    }

    #[test]
    fn payloads_over_the_byte_budget_evict_the_oldest() {
        let mut cache = Cache::new(0, 100, 1_000);
        for sequence in 1..=5 {
            cache.push(event(sequence, 300));
        }
        assert_eq!(cache.bytes(), 900);
        assert_eq!(sequences(&cache, 1, true), (vec![], Some(3)));
        assert_eq!(sequences(&cache, 3, true), (vec![3, 4, 5], None));
    }

    #[test]
    fn an_event_larger_than_the_budget_is_a_stub_read_from_the_table() {
        let mut cache = Cache::new(0, 100, 1_000);
        cache.push(event(1, 10));
        cache.push(event(2, 5_000));
        cache.push(event(3, 5_000));
        cache.push(event(4, 10));
        assert_eq!(cache.bytes(), 20);
        assert_eq!(sequences(&cache, 1, true), (vec![1], None));
        assert_eq!(sequences(&cache, 2, true), (vec![], Some(4)));
        assert_eq!(sequences(&cache, 4, true), (vec![4], None));
        // Positions only: the stubs are served as they are.
        assert_eq!(sequences(&cache, 1, false), (vec![1, 2, 3, 4], None));
    }
}
