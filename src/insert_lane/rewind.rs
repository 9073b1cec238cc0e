//! The signal that the server went back in time under an outbox's lanes, beside the first part
//! that raises it: this lane's [`frontier`](super::frontier) task, which finds the events
//! sequence below what it passed. The commit lane's checks raise it too (its log went back and
//! positions went to other events: `commit_lane::rewind::went_back`), and the rewind watcher
//! (`commit_lane::rewind`) acts on it. It lives here, the lowest part that raises it, because
//! upstream parts never import downstream ones.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;

/// The server went back in time under an outbox's lanes ([`Error::ServerRewound`]): reported
/// once, by the part that sees it; the lanes then stop, every reader of them ends with the
/// error, and the outbox starts new lanes (or stops, per `OutboxConfig::on_rewind`).
///
/// [`Error::ServerRewound`]: crate::Error::ServerRewound
#[derive(Debug)]
pub(crate) struct Rewind {
    what: OnceLock<String>,
    reported: Notify,
    /// The lowest commit position known to have been given to another event (`u64::MAX`: not
    /// known): where the history begun after the rewind starts.
    given_again_from: AtomicU64,
}

impl Default for Rewind {
    fn default() -> Self {
        Self {
            what: OnceLock::new(),
            reported: Notify::new(),
            given_again_from: AtomicU64::new(u64::MAX),
        }
    }
}

impl Rewind {
    /// Notes that commit position `from` (and those after it) went to another event.
    pub(crate) fn given_again_from(&self, from: u64) {
        self.given_again_from.fetch_min(from, Ordering::Relaxed);
    }

    /// The lowest commit position known to have gone to another event, if one is.
    pub(crate) fn first_given_again(&self) -> Option<u64> {
        Some(self.given_again_from.load(Ordering::Relaxed)).filter(|&from| from != u64::MAX)
    }

    /// Reports a rewind (the first report wins); the rewind watcher stops these lanes.
    pub(crate) fn report(&self, what: String) {
        if self.what.set(what).is_ok() {
            self.reported.notify_one();
        }
    }

    /// Whether a rewind was reported.
    pub(crate) fn is_reported(&self) -> bool {
        self.what.get().is_some()
    }

    /// The error readers and writers end with, once reported.
    pub(crate) fn error(&self) -> Option<crate::Error> {
        self.what
            .get()
            .map(|what| crate::Error::ServerRewound { what: what.clone() })
    }

    /// Resolves once a rewind is reported.
    pub(crate) async fn reported(&self) {
        if self.what.get().is_none() {
            self.reported.notified().await;
        }
    }
}
