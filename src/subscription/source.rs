//! A subscription's view of its lane: items with their position, undecodable ones included,
//! placeholders left out.

use std::collections::VecDeque;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::commit_lane::CommitShared;
use crate::commit_lane::listener::CommitReader;
use crate::envelope::Envelope;
use crate::error::Result;
use crate::insert_lane::LaneShared;
use crate::insert_lane::cache::SlotItem;
use crate::insert_lane::reader::LaneReader;
use crate::insert_lane::rows::ReadMode;
use crate::subscription::config::Ordering;
use crate::task::StopSignal;

/// One event at one position.
pub(crate) struct Item<P> {
    /// The subscription position after handling it.
    pub(crate) position: u64,
    pub(crate) sequence: u64,
    /// Last event of its source transaction (always true on the insert lane).
    pub(crate) boundary: bool,
    pub(crate) event: std::result::Result<Arc<Envelope<P>>, Arc<serde_json::Error>>,
}

enum Reader<P> {
    Insert(LaneReader<P>),
    Commit(CommitReader<P>),
}

pub(crate) struct Source<P> {
    reader: Reader<P>,
    buffered: VecDeque<Item<P>>,
}

impl<P> Source<P>
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    pub(crate) fn new(
        ordering: Ordering,
        lane: &Arc<LaneShared<P>>,
        commit: &Arc<CommitShared>,
        stop: StopSignal,
        after: u64,
    ) -> Self {
        let reader = match ordering {
            Ordering::Insert => Reader::Insert(LaneReader::new(
                Arc::clone(lane),
                stop,
                ReadMode::Full,
                after,
            )),
            Ordering::Commit => Reader::Commit(CommitReader::new(
                Arc::clone(lane),
                Arc::clone(commit),
                stop,
                after,
            )),
        };
        Self {
            reader,
            buffered: VecDeque::new(),
        }
    }

    /// Whether an item is ready without waiting.
    pub(crate) fn has_buffered(&self) -> bool {
        !self.buffered.is_empty()
    }

    pub(crate) fn peek(&self) -> Option<&Item<P>> {
        self.buffered.front()
    }

    pub(crate) fn pop(&mut self) -> Option<Item<P>> {
        self.buffered.pop_front()
    }

    /// Waits until at least one item is buffered. `None` once the outbox stops.
    ///
    /// # Cancel safety
    /// Cancel safe: items are only consumed by [`pop`](Self::pop).
    pub(crate) async fn fill(&mut self) -> Option<Result<()>> {
        while self.buffered.is_empty() {
            match &mut self.reader {
                Reader::Insert(reader) => {
                    let slots = match reader.next_batch().await? {
                        Ok(slots) => slots,
                        Err(error) => return Some(Err(error)),
                    };
                    for slot in slots {
                        let event = match slot.item {
                            SlotItem::Event(event) => Ok(event),
                            SlotItem::Undecodable(error) => Err(error),
                            SlotItem::Meta | SlotItem::Placeholder => continue,
                        };
                        self.buffered.push_back(Item {
                            position: slot.sequence,
                            sequence: slot.sequence,
                            boundary: true,
                            event,
                        });
                    }
                }
                Reader::Commit(reader) => {
                    let items = match reader.next_batch().await? {
                        Ok(items) => items,
                        Err(error) => return Some(Err(error)),
                    };
                    self.buffered.extend(items.into_iter().map(|item| Item {
                        position: item.entry.commit_seq,
                        sequence: item.entry.sequence,
                        boundary: item.entry.group_last,
                        event: item.event,
                    }));
                }
            }
        }
        Some(Ok(()))
    }
}
