//! A subscription's view of its lane: items with their position, undecodable ones included,
//! placeholders left out, events of types the job does not select marked skipped.

use std::collections::VecDeque;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::commit_lane::CommitShared;
use crate::commit_lane::listener::CommitReader;
use crate::envelope::Envelope;
use crate::error::Result;
use crate::event_type::TypeFilter;
use crate::insert_lane::LaneShared;
use crate::insert_lane::cache::Undecodable;
use crate::insert_lane::reader::LaneReader;
use crate::insert_lane::rows::ReadMode;
use crate::position::Position;
use crate::position::{CommitSequence, EventSequence};
use crate::task::{StopSignal, spawn_owned};

/// One event at one position.
pub(crate) struct Item<P> {
    /// The subscription position after handling it.
    pub(crate) position: Position,
    pub(crate) sequence: EventSequence,
    /// Last event of its source transaction (always true on the insert lane).
    pub(crate) boundary: bool,
    pub(crate) event: std::result::Result<Arc<Envelope<P>>, Arc<Undecodable>>,
    /// Its type is not selected: the handler never sees it, the position moves past it.
    pub(crate) skipped: bool,
    /// Its id belongs to an earlier event, at this insert sequence (a relay's source only, see
    /// [`Source::refusing_reused_ids`]): it is skipped, never sent.
    pub(crate) refused: Option<u64>,
    /// Taken back from a stuck key's backlog (`backlog.rs`), not read from the lane: its
    /// delivery takes its copy out of the backlog instead of recording a completion.
    pub(crate) aside: bool,
}

impl<P> Item<P> {
    fn new(
        position: Position,
        sequence: EventSequence,
        boundary: bool,
        event: std::result::Result<Arc<Envelope<P>>, Arc<Undecodable>>,
        filter: &TypeFilter,
    ) -> Self {
        let event_type = match &event {
            Ok(event) => event.event_type.as_deref(),
            Err(row) => row.event_type.as_deref(),
        };
        Self {
            position,
            sequence,
            boundary,
            skipped: !filter.takes(event_type),
            refused: None,
            aside: false,
            event,
        }
    }
}

enum Reader<P> {
    Insert(LaneReader<P>),
    Commit(CommitReader<P>),
}

pub(crate) struct Source<P> {
    reader: Reader<P>,
    buffered: VecDeque<Item<P>>,
    filter: TypeFilter,
    /// Pages read from the table are sized to weigh about this much (see
    /// [`Source::page_bytes`]).
    page_bytes: Option<(usize, Weigh<P>)>,
    /// Where events whose id an earlier event holds are looked up (see
    /// [`Source::refusing_reused_ids`]).
    reused_ids: Option<sqlx::PgPool>,
}

/// What an item weighs in memory, in bytes.
pub(crate) type Weigh<P> = fn(&Item<P>) -> usize;

/// The rows of the first page a [byte-bounded](Source::page_bytes) source reads: it does not
/// know what its rows weigh yet.
const FIRST_PAGE_ROWS: usize = 64;

impl<P> Source<P>
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    /// Reads the lane of `after`, from the position after it.
    pub(crate) fn new(
        lane: &Arc<LaneShared<P>>,
        commit: &Arc<CommitShared>,
        stop: StopSignal,
        after: Position,
        filter: TypeFilter,
    ) -> Self {
        let reader = match after {
            Position::Insert(after) => Reader::Insert(LaneReader::new(
                Arc::clone(lane),
                stop,
                ReadMode::Full,
                after.get(),
            )),
            Position::Commit(after) => Reader::Commit(CommitReader::new(
                Arc::clone(lane),
                Arc::clone(commit),
                stop,
                after.get(),
            )),
        };
        Self {
            reader,
            buffered: VecDeque::new(),
            filter,
            page_bytes: None,
            reused_ids: None,
        }
    }

    /// Marks every event whose id an earlier event (a lower insert sequence) also holds as
    /// refused and skipped, looked up in `pool` as it is read (`relay::reused_ids`): a relay
    /// never sends it, and never counts it in a route chain. Looked up before any event of the
    /// read is handed on, so none is passed on unchecked; a failed look-up is a failed read.
    pub(crate) fn refusing_reused_ids(mut self, pool: sqlx::PgPool) -> Self {
        self.reused_ids = Some(pool);
        self
    }

    /// Sizes each page read from the table to weigh about `bytes` (by `weigh`), from what the
    /// rows read so far weighed: a page of the outbox's page size (2,000 rows by default) of
    /// 1 MB events would otherwise be 2 GB in memory at once. Never fewer than one row.
    pub(crate) fn page_bytes(mut self, bytes: usize, weigh: Weigh<P>) -> Self {
        self.set_page_rows(FIRST_PAGE_ROWS);
        self.page_bytes = Some((bytes.max(1), weigh));
        self
    }

    fn set_page_rows(&mut self, rows: usize) {
        match &mut self.reader {
            Reader::Insert(reader) => reader.set_limit(rows),
            Reader::Commit(reader) => reader.set_limit(rows),
        }
    }

    /// After a page: the next one sized from the mean weight of this one's rows.
    fn resize_pages(&mut self, read: usize) {
        let Some((budget, weigh)) = self.page_bytes else {
            return;
        };
        if read == 0 {
            return;
        }
        let start = self.buffered.len() - read;
        let weight: usize = self.buffered.range(start..).map(weigh).sum();
        let mean = (weight / read).max(1);
        self.set_page_rows((budget / mean).max(1));
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
                    let mut read = Vec::with_capacity(slots.len());
                    for slot in slots {
                        let Some(event) = slot.item.into_event() else {
                            continue;
                        };
                        // On the insert lane the position is the sequence, and every event
                        // is a boundary.
                        let sequence = EventSequence::new(slot.sequence);
                        read.push(Item::new(
                            Position::Insert(sequence),
                            sequence,
                            true,
                            event,
                            &self.filter,
                        ));
                    }
                    if let Err(error) = self.take(read).await {
                        return Some(Err(error));
                    }
                }
                Reader::Commit(reader) => {
                    let items = match reader.next_batch().await? {
                        Ok(items) => items,
                        Err(error) => return Some(Err(error)),
                    };
                    let filter = &self.filter;
                    let read = items
                        .into_iter()
                        .map(|item| {
                            let entry = item.entry;
                            Item::new(
                                Position::Commit(CommitSequence::new(entry.commit_seq)),
                                EventSequence::new(entry.sequence),
                                entry.group_last,
                                item.event,
                                filter,
                            )
                        })
                        .collect();
                    if let Err(error) = self.take(read).await {
                        return Some(Err(error));
                    }
                }
            }
        }
        Some(Ok(()))
    }

    /// Buffers what a read returned, its reused ids refused first (when asked).
    async fn take(&mut self, mut read: Vec<Item<P>>) -> Result<()> {
        if let Some(pool) = &self.reused_ids {
            super::reused_ids::refuse(pool, &mut read).await?;
        }
        let count = read.len();
        self.buffered.extend(read);
        self.resize_pages(count);
        Ok(())
    }
}

/// A [`Source`] read ahead by a task of its own, into a bounded channel.
///
/// A runner that waited on [`Source::fill`] inside a `select!` with other work abandoned the
/// page read in progress each time the other work woke it first (a batch landing every few
/// milliseconds), and started it again: under load the read finished only when nothing else
/// was left to do, and the runner stalled on it. Here the read runs to completion beside the
/// runner, which takes items as they come.
pub(crate) struct ReadAhead<P> {
    items: tokio::sync::mpsc::Receiver<(Result<Item<P>>, u32)>,
    /// With a byte bound: the bytes the items read ahead may still take, given back as the
    /// runner takes them.
    bytes: Option<Arc<tokio::sync::Semaphore>>,
    task: tokio::task::JoinHandle<()>,
}

impl<P> ReadAhead<P>
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    /// Reads `source` ahead, holding at most `capacity` items (at least 1) the runner has not
    /// taken. The reading ends when the source stops, fails (the error is the last item) or
    /// this is dropped.
    pub(crate) fn spawn(source: Source<P>, capacity: usize) -> Self {
        Self::spawn_within(source, capacity, None)
    }

    /// [`spawn`](Self::spawn), also holding at most about `bytes` of items (by `weigh`; an
    /// item heavier than that is read alone).
    pub(crate) fn spawn_weighed(
        source: Source<P>,
        capacity: usize,
        bytes: usize,
        weigh: Weigh<P>,
    ) -> Self {
        Self::spawn_within(source, capacity, Some((bytes, weigh)))
    }

    fn spawn_within(
        mut source: Source<P>,
        capacity: usize,
        bytes: Option<(usize, Weigh<P>)>,
    ) -> Self {
        let (sender, items) = tokio::sync::mpsc::channel(capacity.max(1));
        // Permits are bytes; an item takes at most the whole budget, so one always fits.
        let budget = bytes.map(|(bytes, weigh)| {
            let permits = u32::try_from(bytes).unwrap_or(u32::MAX).max(1);
            (
                permits,
                weigh,
                Arc::new(tokio::sync::Semaphore::new(permits as usize)),
            )
        });
        let taken = budget
            .as_ref()
            .map(|(_, _, semaphore)| Arc::clone(semaphore));
        let task = spawn_owned("consumer.read_ahead", async move {
            loop {
                match source.fill().await {
                    None => return,
                    Some(Err(error)) => {
                        let _ = sender.send((Err(error), 0)).await;
                        return;
                    }
                    Some(Ok(())) => {
                        while let Some(item) = source.pop() {
                            let mut weight = 0;
                            if let Some((permits, weigh, semaphore)) = &budget {
                                weight = u32::try_from(weigh(&item))
                                    .unwrap_or(u32::MAX)
                                    .clamp(1, *permits);
                                match semaphore.acquire_many(weight).await {
                                    Ok(permit) => permit.forget(),
                                    Err(_) => return,
                                }
                            }
                            if sender.send((Ok(item), weight)).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            }
        });
        Self {
            items,
            bytes: taken,
            task,
        }
    }

    /// An item taken by the runner: its bytes are free for the reader again.
    fn taken(&self, (item, weight): (Result<Item<P>>, u32)) -> Result<Item<P>> {
        if let Some(semaphore) = &self.bytes {
            semaphore.add_permits(weight as usize);
        }
        item
    }

    /// The next item if one is read already.
    pub(crate) fn try_next(&mut self) -> Option<Result<Item<P>>> {
        let read = self.items.try_recv().ok()?;
        Some(self.taken(read))
    }

    /// The next item; `None` once the source stopped. Cancel safe.
    pub(crate) async fn next(&mut self) -> Option<Result<Item<P>>> {
        let read = self.items.recv().await?;
        Some(self.taken(read))
    }
}

impl<P> Drop for ReadAhead<P> {
    fn drop(&mut self) {
        self.task.abort();
    }
}
