//! A commit log that went back below positions this process saw, and how the process tells a
//! crash that lost the last appends (the same events are appended again to the same positions)
//! from a failover that lost transactions (their positions go to other events).
//!
//! Only the append's compare-and-set moves the log head, and only forwards, but appends commit
//! asynchronously: a crash of the server may lose the last ones, and the fold appends the same
//! events again. A failover to a standby that had not received the last transactions loses
//! their events too, and the promoted server gives their positions to new events, which this
//! process's commit-lane readers, past them, would skip. The process learns of it two ways:
//!
//! - it reads a head below one it saw ([`WentBack::fell`]);
//! - it reads a server history newer than the one it knew that began at or below a position
//!   it saw ([`WentBack::note_history`]): a peer may have folded past the old head on the
//!   promoted server before this process read the head again, or this process may not fold;
//! - it reads that the server started again since its last read ([`WentBack::note_server`]):
//!   a crash on the same history may have lost transactions committed with
//!   `synchronous_commit` off with their appends, and a peer folded past the old head again.
//!
//! Either way it remembers the event each of those positions held (from the log cache, which
//! the sequencer's appends and the readers' pages fill), then checks them against the
//! database ([`WentBack::check`]) and against what is appended again
//! ([`WentBack::check_reappended`]). A position appended again to another event, or whose
//! event is gone, is a rewind: reported, and the outbox's lanes stop
//! ([`Error::ServerRewound`](crate::Error::ServerRewound)) before new ones start from what the
//! server holds. A position a reader here returned
//! whose event the cache no longer holds cannot be checked: the server's history decides
//! ([`WentBack::check`]). On the history the process knew, it was a crash, whose lost appends
//! are folded again from the same events; on a newer one (a promotion), it is reported as a
//! rewind: never a silent skip.

mod check;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::commit_lane::{LogCache, LogEntry};
use crate::insert_lane::Rewind;
use crate::position::ServerHistory;

pub(crate) struct WentBack {
    /// Where a position given to another event is reported: the outbox's (the insert lane's)
    /// rewind.
    rewind: Arc<Rewind>,
    /// Positions this process saw above a head the log went back to, with the event sequence
    /// each held, until they are checked.
    gone: Mutex<BTreeMap<u64, u64>>,
    /// The head seen that the last went-back warning was about: one warning per fall, however
    /// often the lower head is read again.
    warned_below: AtomicU64,
    /// The PostgreSQL timeline of the newest server history this process has read; 0 before
    /// the first read.
    timeline: AtomicU64,
    /// The id of the newest server history this process has read; 0 before the first read.
    history: AtomicU64,
    /// The lowest position above a head the log was seen to go back to, or where a newer
    /// history began below what this process saw (`u64::MAX`: none): where positions may have
    /// been given again, should that be a rewind. (The checks after a server restart, which
    /// look at every cached position, saw no fall, and move nothing here.)
    lowest_fall: AtomicU64,
    /// When the server last started, as this process last read it (see
    /// [`note_server`](Self::note_server)); 0 before the first read.
    started: AtomicI64,
    /// The highest position a commit-lane reader in this process has returned.
    read_through: AtomicU64,
    /// Positions returned that the log went back below whose events the cache did not hold.
    unchecked: Mutex<Option<Unchecked>>,
}

/// Positions (`from..=through`, `count` of them not in the cache) a reader here returned above
/// a head the log went back to, on server history `timeline` as this process knew it then.
#[derive(Clone, Copy)]
struct Unchecked {
    from: u64,
    through: u64,
    count: u64,
    timeline: u64,
}

impl Unchecked {
    /// What is reported when the server is on history `now`, newer than the one known.
    fn rewind(&self, now: u64) -> String {
        format!(
            "the commit log went back below position {} on a newer server history ({now}: a \
             promoted standby, or a rewind), and this process returned positions up to {} without \
             holding which events {} of them were (its log cache is smaller than the loss): it \
             cannot check that they are not given to other events",
            self.from, self.through, self.count
        )
    }
}

impl WentBack {
    pub(crate) fn new(rewind: Arc<Rewind>) -> Self {
        Self {
            rewind,
            gone: Mutex::new(BTreeMap::new()),
            warned_below: AtomicU64::new(0),
            timeline: AtomicU64::new(0),
            history: AtomicU64::new(0),
            lowest_fall: AtomicU64::new(u64::MAX),
            started: AtomicI64::new(0),
            read_through: AtomicU64::new(0),
            unchecked: Mutex::new(None),
        }
    }

    /// A commit-lane reader here returned every position up to `through`.
    pub(crate) fn returned(&self, through: u64) {
        self.read_through.fetch_max(through, Ordering::Relaxed);
    }

    /// Takes in the newest server history a read found (begun on PostgreSQL timeline
    /// `timeline`), with `seen` the highest head this process had seen. A history newer than
    /// the last one read that began at or below `seen` gave positions this process saw again
    /// (a promotion, or a rewind another process detected): they are remembered as for a head
    /// that went back to just below it. Returns whether positions wait for
    /// [`check`](Self::check).
    pub(crate) fn note_history(
        &self,
        history: Option<ServerHistory>,
        timeline: Option<u32>,
        seen: u64,
        log: &RwLock<LogCache>,
    ) -> bool {
        let known_timeline = self.timeline.load(Ordering::Relaxed);
        if let Some(timeline) = timeline {
            self.timeline
                .fetch_max(u64::from(timeline), Ordering::Relaxed);
        }
        let Some(history) = history else {
            return self.pending();
        };
        let known = self.history.fetch_max(history.id, Ordering::Relaxed);
        if known != 0 && history.id > known && history.first_position <= seen {
            tracing::warn!(
                history = history.id,
                from = history.first_position,
                seen,
                "the commit log is appended on a newer server history (a promoted standby, or a \
                 rewind another process detected) that began at or below a position this \
                 process saw; checking that those positions hold the same events"
            );
            self.lowest_fall
                .fetch_min(history.first_position, Ordering::Relaxed);
            self.fell_from(
                history.first_position.saturating_sub(1),
                seen,
                log,
                known_timeline,
                Some(history.id),
            );
        }
        self.pending()
    }

    /// The id of the newest server history this process has read (0: none yet).
    pub(crate) fn known_history(&self) -> u64 {
        self.history.load(Ordering::Relaxed)
    }

    /// The lowest position above a head the log was seen to go back to, if it was: where a
    /// rewind found later may have begun giving positions again.
    pub(crate) fn lowest_fall(&self) -> Option<u64> {
        Some(self.lowest_fall.load(Ordering::Relaxed)).filter(|&from| from != u64::MAX)
    }

    /// Takes in when the server last started, with `seen` the highest head this process had
    /// seen. A server that started again since the last read may have lost, on the same
    /// history, the appends it had not flushed and, from writers with `synchronous_commit`
    /// off, transactions it had acknowledged; a peer may already have folded past the old head
    /// with other events before this process read the head again. So every position the log
    /// cache holds is remembered, as for a head that went back to below the cache, and checked
    /// ([`check`](Self::check)): appended again to the same events, the process goes on.
    pub(crate) fn note_server(&self, started: Option<i64>, seen: u64, log: &RwLock<LogCache>) {
        let Some(started) = started else {
            return;
        };
        let known = self.started.swap(started, Ordering::Relaxed);
        if known == 0 || known == started {
            return;
        }
        let Some(lowest) = log.read().ok().and_then(|log| log.lowest()) else {
            return;
        };
        if lowest > seen {
            return;
        }
        tracing::warn!(
            lowest,
            seen,
            "the server restarted since this process last read the commit log (a crash may              have lost the last appends, and transactions committed with synchronous_commit              off); checking that the positions this process holds keep the same events"
        );
        // Said once here, not again as a head that went back.
        self.warned_below.store(seen, Ordering::Relaxed);
        let timeline = self.timeline.load(Ordering::Relaxed);
        self.fell_from(lowest - 1, seen, log, timeline, None);
    }

    /// The log's head is `head`, below `seen`: remembers the events this process saw above it.
    pub(crate) fn fell(&self, head: u64, seen: u64, log: &RwLock<LogCache>) {
        self.lowest_fall.fetch_min(head + 1, Ordering::Relaxed);
        let timeline = self.timeline.load(Ordering::Relaxed);
        self.fell_from(head, seen, log, timeline, None);
    }

    /// [`fell`](Self::fell), with `timeline` the PostgreSQL timeline this process knew before,
    /// and `promoted` the newer history known to have given the positions again, if one is.
    fn fell_from(
        &self,
        head: u64,
        seen: u64,
        log: &RwLock<LogCache>,
        timeline: u64,
        promoted: Option<u64>,
    ) {
        let held = match log.read() {
            Ok(log) => log.between(head, seen),
            Err(_) => Vec::new(),
        };
        let returned = self.read_through.load(Ordering::Relaxed).min(seen);
        let unknown = unchecked(head, returned, &held);
        if let Ok(mut gone) = self.gone.lock() {
            for entry in &held {
                gone.entry(entry.commit_seq).or_insert(entry.sequence);
            }
        }
        if unknown > 0 {
            let unchecked = Unchecked {
                from: head + 1,
                through: returned,
                count: unknown,
                timeline,
            };
            if let Some(newer) = promoted {
                self.report_from(unchecked.rewind(newer), unchecked.from);
                return;
            }
            if let Ok(mut slot) = self.unchecked.lock() {
                *slot = Some(unchecked);
            }
        }
        if self.warned_below.swap(seen, Ordering::Relaxed) == seen {
            return;
        }
        if held.is_empty() && unknown == 0 {
            tracing::info!(
                head,
                seen,
                "the commit log's head went back below a position this process saw (a crash \
                 that lost the last appends, or a failover); no reader here returned those \
                 positions"
            );
        } else {
            tracing::warn!(
                head,
                seen,
                "the commit log's head went back below a position this process saw (a crash \
                 that lost the last appends, or a failover); checking that the positions are \
                 appended to the same events again"
            );
        }
    }

    /// Remembers `entries` (positions this process handed on before the log was seen to hold
    /// them) to be checked against the database like positions the log went back below.
    pub(crate) fn check_later(&self, entries: &[LogEntry]) {
        if entries.is_empty() {
            return;
        }
        if let Ok(mut gone) = self.gone.lock() {
            for entry in entries {
                gone.entry(entry.commit_seq).or_insert(entry.sequence);
            }
        }
    }

    /// Whether positions this process saw wait to be checked.
    pub(crate) fn pending(&self) -> bool {
        self.gone.lock().is_ok_and(|gone| !gone.is_empty())
            || self.unchecked.lock().is_ok_and(|u| u.is_some())
    }

    /// Reports a rewind the commit lane found, positions from `from` up given to other events:
    /// the outbox's lanes stop, and the new history it begins starts there.
    fn report_from(&self, what: String, from: u64) {
        self.rewind.given_again_from(from);
        self.report(what);
    }

    /// Reports a rewind the commit lane found: the outbox's lanes stop.
    pub(crate) fn report(&self, what: String) {
        if let Ok(mut gone) = self.gone.lock() {
            gone.clear();
        }
        if let Ok(mut unchecked) = self.unchecked.lock() {
            *unchecked = None;
        }
        self.rewind.report(what);
    }

    /// Whether a rewind was reported (by the commit lane or the insert lane).
    pub(crate) fn reported(&self) -> bool {
        self.rewind.is_reported()
    }
}

/// How many positions above `head` up to `returned` (those a reader here returned) `held` does
/// not cover. What the cache holds of a range is one run: it is contiguous.
fn unchecked(head: u64, returned: u64, held: &[LogEntry]) -> u64 {
    let covered = match (held.first(), held.last()) {
        (Some(first), Some(last)) => {
            let upto = last.commit_seq.min(returned);
            (upto + 1).saturating_sub(first.commit_seq.max(head + 1))
        }
        _ => 0,
    };
    returned.saturating_sub(head).saturating_sub(covered)
}

#[cfg(test)]
mod tests {
    use super::{LogEntry, unchecked};

    fn run(from: u64, through: u64) -> Vec<LogEntry> {
        (from..=through)
            .map(|commit_seq| LogEntry {
                commit_seq,
                sequence: commit_seq + 100,
                group_last: true,
            })
            .collect()
    }

    #[test]
    fn positions_returned_that_the_cache_does_not_hold_are_counted() {
        // Returned 6..=10 after the head went back to 5.
        assert_eq!(unchecked(5, 10, &run(6, 10)), 0);
        assert_eq!(unchecked(5, 10, &run(8, 10)), 2, "6 and 7 were evicted");
        assert_eq!(
            unchecked(5, 10, &run(6, 12)),
            0,
            "held beyond what was returned"
        );
        assert_eq!(unchecked(5, 10, &[]), 5);
        assert_eq!(unchecked(5, 8, &run(6, 12)), 0);
        // Nothing returned above the head: nothing to check.
        assert_eq!(unchecked(5, 4, &[]), 0);
        assert_eq!(unchecked(5, 5, &run(6, 7)), 0);
    }
}
