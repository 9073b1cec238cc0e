//! [`CommitSink`]: where a transaction's committed events go in this process.

use std::sync::Arc;

use sqlx::PgPool;
use tokio::sync::{mpsc, watch};

use crate::insert_lane::cache::Slot;
use crate::insert_lane::{CommittedBatch, LaneShared};
use crate::pooler::Statements;
use crate::position::EventSequence;
use crate::telemetry::metrics as m;

/// What a commit needs from its outbox, and nothing more: the lane to hand events to or point
/// at, the wake-up notifier's watch, the pool to ask about an in-doubt commit on, and how the
/// publishing pool takes its statements.
pub(crate) struct CommitSink<P> {
    pub(crate) pool: PgPool,
    /// Unnamed when the publishing pool goes through a transaction-mode pooler.
    pub(crate) statements: Statements,
    lane: Arc<LaneShared<P>>,
    /// Committed events handed straight to the insert lane's frontier task.
    handoff: mpsc::UnboundedSender<CommittedBatch<P>>,
    /// The highest sequence committed by this process, for the wake-up notifier.
    committed: watch::Sender<EventSequence>,
}

impl<P> CommitSink<P> {
    pub(crate) fn new(
        pool: PgPool,
        lane: Arc<LaneShared<P>>,
        handoff: mpsc::UnboundedSender<CommittedBatch<P>>,
        statements: Statements,
    ) -> Self {
        Self {
            pool,
            statements,
            lane,
            handoff,
            committed: watch::Sender::new(EventSequence::BEGIN),
        }
    }

    /// What the wake-up notifier watches.
    pub(crate) fn watch_committed(&self) -> watch::Receiver<EventSequence> {
        self.committed.subscribe()
    }

    /// Hands `count` events this process just committed, up to `last`, to its own lane
    /// (`slots`, or `None` to have the lane read them from the table), and wakes other
    /// processes.
    pub(crate) fn committed(&self, last: EventSequence, count: usize, slots: Option<Vec<Slot<P>>>) {
        if count == 0 {
            return;
        }
        metrics::counter!(m::EVENTS_PUBLISHED).increment(count as u64);
        match slots {
            // A send error means the frontier task has stopped; the table still has the events.
            Some(slots) => {
                let _ = self.handoff.send(slots);
            }
            None => self.lane.hint_head(last.get()),
        }
        self.note_committed(last);
    }

    /// Stores `last` as this process's highest commit for the wake-up notifier, and wakes the
    /// notifier only when a wake-up may reach someone. A process alone (no other listener
    /// heard: see `Audience`) stores it without waking the task, one thread wake-up fewer per
    /// commit; when someone is heard, `Audience::arrived` wakes the notifier, which reads the
    /// value stored. Stored before the audience is asked, under the watch's lock: if the
    /// arrival comes after the question, the notifier it wakes sees the value.
    fn note_committed(&self, last: EventSequence) {
        let mut held = false;
        self.committed.send_if_modified(|sent| {
            if last <= *sent {
                return false;
            }
            *sent = last;
            held = !self.lane.audience.anyone();
            !held
        });
        if held {
            metrics::counter!(m::WAKEUPS, "result" => "held").increment(1);
        }
    }

    /// Records, before its `COMMIT` is sent, that transaction `xid` of this process inserted
    /// `sequences` (ascending) and nothing else will: whichever way the lane then meets its
    /// rows (this hand-off, or the table when a resync reads them first), the sequencer knows
    /// the group's members and promises its positions. Noted after the commit, a resync that
    /// read the rows first left the group without members, and the sequencer appended at once
    /// for the listeners that then waited on it. Only transactions small enough to be handed
    /// over (at most `HANDOFF_EVENTS` events), as before.
    pub(crate) fn expect_commit(&self, xid: i64, sequences: &[EventSequence]) {
        if sequences.is_empty() || sequences.len() > crate::write::insert::HANDOFF_EVENTS {
            return;
        }
        let sequences: Vec<u64> = sequences.iter().map(|sequence| sequence.get()).collect();
        self.lane.note_own_commit(xid, sequences.into());
    }

    /// The `COMMIT` of `xid` failed and the transaction rolled back: undoes
    /// [`expect_commit`](Self::expect_commit).
    pub(crate) fn commit_failed(&self, xid: i64) {
        self.lane.forget_own_commit(xid);
    }

    /// Points the lane at sequences up to `last`, written by a transaction whose outcome this
    /// process does not see (in doubt, or the caller's own), so that it reads them soon if they
    /// commit.
    pub(crate) fn hint_written(&self, last: EventSequence) {
        self.lane.hint_head(last.get());
    }
}
