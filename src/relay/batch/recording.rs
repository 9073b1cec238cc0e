//! How far a relay's results are stored: its marks are written by tasks of their own, behind
//! the schedule and possibly out of order, and the status reports a position only once every
//! result at or below it is stored.

use futures::StreamExt;

use crate::consumer::Flow;
use crate::position::Position;
use crate::relay::Sink;
use crate::relay::runner::{RelayRunner, Work};

impl<K: Sink> RelayRunner<K> {
    /// Waits for every write of marks started so far; a flow when one says to claim again.
    pub(crate) async fn finish_writes(&mut self, work: &mut Work) -> Option<Flow> {
        let mut flow = None;
        while let Some(joined) = self.writes.next().await {
            flow = flow.or(self.written(work, joined));
        }
        flow
    }

    /// A write of marks is done; a flow when it was not stored (the lease was lost, the write
    /// failed): the relay claims again, and the owner then sends those events again.
    pub(crate) fn written(
        &self,
        work: &mut Work,
        joined: Result<Written, tokio::task::JoinError>,
    ) -> Option<Flow> {
        let name = &self.config.name;
        let Ok(Written(number, advance, stored)) = joined else {
            return Some(Flow::Reclaim);
        };
        match stored {
            Ok(true) => {
                work.recording.stored(number);
                if let Some(to) = advance.filter(|to| to.get() > work.schedule.stored.get()) {
                    work.schedule.stored = to;
                }
                None
            }
            Ok(false) => {
                tracing::warn!(relay = %name, "the lease was lost before the results were recorded: they are dropped, and the new owner sends these events again");
                Some(Flow::Reclaim)
            }
            Err(error) => {
                tracing::warn!(%error, relay = %name, "recording the results failed; claiming again");
                Some(Flow::Reclaim)
            }
        }
    }
}

/// A write of marks done: its number, the watermark it stored instead of completion rows, and
/// whether it was stored (false: the fence refused).
pub(crate) struct Written(
    pub(super) u64,
    pub(super) Option<Position>,
    pub(super) Result<bool, sqlx::Error>,
);

/// How far the relay's results are stored: the schedule moves on as soon as a batch lands,
/// its marks are written behind it, possibly out of order; the status reports a position only
/// once every result at or below it is stored.
#[derive(Default)]
pub(crate) struct Recording {
    next: u64,
    /// Writes not yet stored, in the order they started, with the schedule's watermark right
    /// after each was applied.
    pending: std::collections::VecDeque<(u64, u64)>,
    /// Writes stored while one before them was not.
    stored_early: std::collections::HashSet<u64>,
    /// Every result at or below this position is stored.
    pub(crate) recorded: u64,
}

impl Recording {
    pub(crate) fn new(watermark: u64) -> Self {
        Self {
            recorded: watermark,
            ..Self::default()
        }
    }

    /// A write starts, after its results moved the schedule's watermark to `watermark`.
    pub(super) fn start(&mut self, watermark: u64) -> u64 {
        let number = self.next;
        self.next += 1;
        self.pending.push_back((number, watermark));
        number
    }

    /// Write `number` is stored.
    pub(super) fn stored(&mut self, number: u64) {
        self.stored_early.insert(number);
        while let Some(&(first, watermark)) = self.pending.front() {
            if !self.stored_early.remove(&first) {
                break;
            }
            self.pending.pop_front();
            self.recorded = self.recorded.max(watermark);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Recording;

    #[test]
    fn the_recorded_position_waits_for_every_earlier_write() {
        let mut recording = Recording::new(10);
        let first = recording.start(20);
        let second = recording.start(30);
        let third = recording.start(35);
        recording.stored(second);
        assert_eq!(recording.recorded, 10, "the first write is not stored yet");
        recording.stored(first);
        assert_eq!(recording.recorded, 30, "the first two are");
        recording.stored(third);
        assert_eq!(recording.recorded, 35);
        let fourth = recording.start(40);
        recording.stored(fourth);
        assert_eq!(recording.recorded, 40);
    }
}
