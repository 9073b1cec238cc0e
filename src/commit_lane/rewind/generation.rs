//! What an outbox runs on one stretch of the server's history ([`Generation`]), and the slot the
//! running one sits in ([`Generations`]): a rewind ends one, and the next is installed there
//! unless the outbox was shut down meanwhile.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::watch;

use crate::commit_lane::CommitShared;
use crate::insert_lane::LaneShared;
use crate::latest::LatestHub;
use crate::listen::Listen;
use crate::task::Tasks;
use crate::write::sink::CommitSink;

/// How long each task of a generation is waited for when it stops (the outbox's shutdown, or a
/// rewind that ends it) before it is aborted.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// What an outbox runs on one stretch of the server's history: its lanes, built from what the
/// server holds when it starts, and the tasks that run them. A rewind ends one; the next one
/// starts from what the server holds then, as a new `Outbox` would. The outbox's wiring starts
/// it (every part's `spawn`).
pub(crate) struct Generation<P> {
    pub(crate) lane: Arc<LaneShared<P>>,
    pub(crate) commit: Arc<CommitShared>,
    pub(crate) sink: Arc<CommitSink<P>>,
    /// Latest values: its tasks start with the first latest stream, under `tasks`.
    pub(crate) latest: LatestHub,
    /// The one LISTEN connection, for the wake-ups and the latest values.
    pub(crate) listen: Listen,
    /// The lanes' and operations' tasks.
    pub(crate) tasks: Tasks,
}

impl<P> Generation<P> {
    /// Stops its tasks, each waited for up to [`STOP_GRACE`]: every reader of its lanes ends.
    pub(crate) async fn stop(&self) {
        self.tasks.stop(STOP_GRACE).await;
    }
}

/// The running generation of one outbox, and whether the outbox is closed (shut down, or
/// stopped on a rewind under `OnRewind::Stop`): no generation starts after that.
pub(crate) struct Generations<P> {
    running: RwLock<Arc<Generation<P>>>,
    closed: watch::Sender<bool>,
    /// The outbox's own tasks, which outlive the generations: the rewind watcher.
    pub(crate) tasks: Tasks,
}

impl<P> Generations<P> {
    pub(crate) fn new(first: Generation<P>) -> Self {
        Self {
            running: RwLock::new(Arc::new(first)),
            closed: watch::Sender::new(false),
            tasks: Tasks::new(),
        }
    }

    /// The lanes running now.
    pub(crate) fn running(&self) -> Arc<Generation<P>> {
        match self.running.read() {
            Ok(generation) => Arc::clone(&generation),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Makes `next` the running generation, `hand_over` telling its readers first (under the
    /// same lock), unless the outbox was closed meanwhile (then stops it and returns false).
    pub(crate) fn install(
        &self,
        next: Generation<P>,
        hand_over: impl FnOnce(&Generation<P>),
    ) -> bool {
        let mut slot = match self.running.write() {
            Ok(slot) => slot,
            Err(poisoned) => poisoned.into_inner(),
        };
        // Read under the lock the outbox's stop reads the running generation under, after
        // closing: a generation installed here is the one it stops.
        if self.is_closed() {
            next.tasks.request_stop();
            return false;
        }
        hand_over(&next);
        *slot = Arc::new(next);
        true
    }

    /// Closes the outbox: no generation is installed after this. Idempotent.
    pub(crate) fn close(&self) {
        self.closed.send_replace(true);
    }

    pub(crate) fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }

    /// A watch of [`is_closed`](Self::is_closed).
    pub(crate) fn closed(&self) -> watch::Receiver<bool> {
        self.closed.subscribe()
    }
}
