//! Reading the insert lane from any position: the cache when it holds the position, the table
//! by pages when the reader is further behind, the frontier watch when caught up.
//!
//! A reader never sees a hole or a repeat: it only reads positions at or below the frontier,
//! every one of which has a row (an event or a placeholder), and it checks that each page it
//! reads is contiguous.

use std::sync::Arc;

use serde::de::DeserializeOwned;
use tokio::sync::watch;

use super::LaneShared;
use super::cache::{Lookup, Slot};
use super::rows::{self, ReadMode};
use crate::error::{Error, Result};
use crate::position::{EventSequence, Ordering};
use crate::task::StopSignal;

/// Slots copied out of the cache per lock.
const CACHE_BATCH: usize = 512;

pub(crate) struct LaneReader<P> {
    shared: Arc<LaneShared<P>>,
    frontier: watch::Receiver<u64>,
    stop: StopSignal,
    mode: ReadMode,
    /// The next sequence to hand out.
    next: u64,
    /// The most slots one batch returns.
    limit: usize,
    /// Whether the start position was checked against the retention floor. The cache may still
    /// hold dropped events; a reader below the floor fails the same way in every process.
    floor_checked: bool,
    /// Whether it has ended with the outbox's rewind error (once; then `None`).
    told_rewind: bool,
}

impl<P> LaneReader<P>
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    /// A reader whose first slot is the one right after `after`.
    pub(crate) fn new(
        shared: Arc<LaneShared<P>>,
        stop: StopSignal,
        mode: ReadMode,
        after: u64,
    ) -> Self {
        let frontier = shared.frontier_watch();
        Self {
            shared,
            frontier,
            stop,
            mode,
            next: after + 1,
            limit: usize::MAX,
            floor_checked: false,
            told_rewind: false,
        }
    }

    /// Caps each batch at `limit` slots (at least one).
    pub(crate) fn with_limit(mut self, limit: usize) -> Self {
        self.limit = limit.max(1);
        self
    }

    /// Caps each batch at `limit` slots (at least one) from now on.
    pub(crate) fn set_limit(&mut self, limit: usize) {
        self.limit = limit.max(1);
    }

    /// The last position handed out.
    pub(crate) fn position(&self) -> u64 {
        self.next - 1
    }

    /// Whether [`Self::next_batch`] has slots to return without waiting for new commits (the
    /// frontier is past the reader's position).
    pub(crate) fn ready(&self) -> bool {
        self.next <= *self.frontier.borrow()
    }

    /// The outbox's stop signal this reader watches.
    pub(crate) fn stop_signal(&self) -> StopSignal {
        self.stop.clone()
    }

    /// Moves the reader so that its next slot is the one after `after`.
    pub(crate) fn seek(&mut self, after: u64) {
        self.next = after + 1;
        self.floor_checked = false;
    }

    async fn check_floor(&mut self) -> Result<()> {
        rows::check_retention_floor(&self.shared.pool, Ordering::Insert, self.next).await?;
        self.floor_checked = true;
        Ok(())
    }

    /// The next contiguous run of resolved slots, waiting for one when caught up. `None` once
    /// the outbox stops.
    ///
    /// # Cancel safety
    /// Cancel safe: the reader's position only moves when slots are returned.
    pub(crate) async fn next_batch(&mut self) -> Option<Result<Vec<Slot<P>>>> {
        loop {
            if self.stop.is_stopped() {
                return self.ended();
            }
            if !self.floor_checked
                && let Err(error) = self.check_floor().await
            {
                return Some(Err(error));
            }
            let frontier = *self.frontier.borrow_and_update();
            if self.next <= frontier {
                return Some(self.read_upto(frontier).await);
            }
            tokio::select! {
                biased;
                _ = self.stop.stopped() => return self.ended(),
                changed = self.frontier.changed() => if changed.is_err() { return None },
            }
        }
    }

    /// The end of a stopped outbox's reader: the rewind error once if that stopped it, then
    /// nothing.
    fn ended(&mut self) -> Option<Result<Vec<Slot<P>>>> {
        if self.told_rewind {
            return None;
        }
        self.told_rewind = true;
        self.shared.rewind.error().map(Err)
    }

    async fn read_upto(&mut self, frontier: u64) -> Result<Vec<Slot<P>>> {
        let mut out = Vec::new();
        let lookup = match self.shared.cache.read() {
            Ok(cache) => cache.read(
                self.next,
                CACHE_BATCH.min(self.limit),
                self.mode == ReadMode::Full,
                &mut out,
            ),
            Err(_) => Lookup::Behind {
                before: frontier + 1,
            },
        };
        match lookup {
            Lookup::Hit => {}
            Lookup::Ahead => return Ok(out),
            Lookup::Behind { before } => {
                // Every sequence at or below the frontier has a row, so a page never needs a
                // wider range than its own size. Bounding it so keeps the plan an index range
                // scan even without statistics (a fresh table otherwise gets a sort of the
                // whole backlog per page, measured 20x slower).
                let upto = before
                    .saturating_sub(1)
                    .min(frontier)
                    .min(self.next - 1 + self.page() as u64);
                out = rows::read_page(
                    &self.shared.pool,
                    self.mode,
                    self.next - 1,
                    upto,
                    self.page(),
                )
                .await?;
                if let Err(error) = check_contiguous(self.next, &out) {
                    // A hole below the floor was dropped by retention, not deleted by hand.
                    rows::check_retention_floor(&self.shared.pool, Ordering::Insert, self.next)
                        .await?;
                    return Err(error);
                }
            }
        }
        if let Some(last) = out.last() {
            self.next = last.sequence + 1;
        }
        Ok(out)
    }
}

impl<P> LaneReader<P> {
    fn page(&self) -> usize {
        self.shared.page_size.min(self.limit)
    }
}

fn check_contiguous<P>(first: u64, slots: &[Slot<P>]) -> Result<()> {
    if slots.is_empty() {
        return Err(Error::MissingHistory {
            missing: EventSequence::new(first),
        });
    }
    for (expected, slot) in (first..).zip(slots) {
        if slot.sequence != expected {
            return Err(Error::MissingHistory {
                missing: EventSequence::new(expected),
            });
        }
    }
    Ok(())
}
