//! Positions handed to this process's commit-lane listeners before the append that logs them.
//!
//! The fold is a pure function of the insert lane and the state row: whichever process appends
//! a range of the insert lane, its groups land in the order of their lowest sequences, each
//! whole, at the positions that follow every group with a lower first sequence. So a group's
//! positions are known before any append once the fold knows the size of every group planned
//! before it. It does for groups this process committed through
//! [`OutboxTransaction::commit`](crate::OutboxTransaction::commit): the commit inserted every row of its
//! transaction in its last statement before `COMMIT`, and the fold met first the lowest of
//! them, so no row of the transaction lies below it (one would have been met first) or above
//! it. The sequencer computes those positions as it plans the groups, and this process's
//! listeners ([`Outbox::listen_committed`](crate::Outbox::listen_committed)) may take them at
//! once, without waiting for the append to commit in the shared log: what the peer library
//! does in memory, with the log still the one every process and relay reads.
//!
//! A promise is kept until the log holds its position, and compared with what the log holds
//! there: the entry this sequencer appended, one a peer appended (read when its compare-and-set
//! lost), or, when the head moved past it unseen (a restart), the database's entry through
//! [`went_back`](super::went_back). Another event there (a row the transaction gained past the
//! commit's insert, such as one inserted by a deferred trigger, or a failover that lost the
//! transaction and gave its position to a new one) is reported as a rewind: the outbox's lanes
//! stop, its listeners end with [`Error::ServerRewound`](crate::Error::ServerRewound), and the
//! lanes start again from what the server holds. Never a silent difference.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tokio::sync::{Notify, watch};

use super::LogEntry;

pub(crate) struct Promised {
    /// Promised positions the log has not been seen to hold yet, each with its entry.
    entries: Mutex<BTreeMap<u64, LogEntry>>,
    /// The highest position promised: what listeners that take promises wait on.
    through: watch::Sender<u64>,
    /// Told when a listener starts taking promises (the sequencer then reads along an append
    /// already running).
    arrived: Notify,
}

impl Promised {
    pub(crate) fn new(head: u64) -> Self {
        Self {
            entries: Mutex::new(BTreeMap::new()),
            through: watch::Sender::new(head),
            arrived: Notify::new(),
        }
    }

    /// Whether a listener takes promises now: without one the sequencer reads along an
    /// append only what was waiting when it started.
    pub(crate) fn listened(&self) -> bool {
        self.through.receiver_count() > 0
    }

    /// How many listeners take promises now.
    pub(crate) fn takers(&self) -> usize {
        self.through.receiver_count()
    }

    /// Resolves once a listener has started taking promises (possibly before this was called:
    /// a permit is kept).
    pub(crate) async fn arrived(&self) {
        self.arrived.notified().await;
    }

    /// A watch of the highest position promised, for a listener that takes promises.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        let watch = self.through.subscribe();
        self.arrived.notify_one();
        watch
    }

    /// Promises `entries` (consecutive positions, computed by the fold). Positions at or below
    /// `head` are in the log already and are not promised. A position promised before to
    /// another entry is an error, with what to report.
    pub(crate) fn promise(&self, entries: &[LogEntry], head: u64) -> Result<(), String> {
        let Ok(mut promised) = self.entries.lock() else {
            return Ok(());
        };
        let mut highest = None;
        for entry in entries.iter().filter(|entry| entry.commit_seq > head) {
            if let Some(before) = promised.insert(entry.commit_seq, *entry)
                && before != *entry
            {
                return Err(format!(
                    "the commit lane computed position {} again for the event of sequence {}, \
                     where it had handed this process's listeners sequence {}",
                    entry.commit_seq, entry.sequence, before.sequence
                ));
            }
            highest = Some(entry.commit_seq);
        }
        drop(promised);
        if let Some(highest) = highest {
            self.through.send_if_modified(|through| {
                let higher = highest > *through;
                if higher {
                    *through = highest;
                }
                higher
            });
        }
        Ok(())
    }

    /// Copies the promised entries from `from` on, up to `max` of them, while consecutive.
    pub(crate) fn read(&self, from: u64, max: usize, out: &mut Vec<LogEntry>) {
        let Ok(promised) = self.entries.lock() else {
            return;
        };
        for (next, (&position, entry)) in (from..).zip(promised.range(from..).take(max)) {
            if position != next {
                break;
            }
            out.push(*entry);
        }
    }

    /// Compares the entries the log now holds (appended here or by a peer) with the promises
    /// at their positions, and drops those promises. Promises at or below `head` that
    /// `entries` did not cover (the head moved past them unseen) are returned, to be checked
    /// against the database. A position the log gave another entry is an error, with what to
    /// report.
    pub(crate) fn settle(&self, entries: &[LogEntry], head: u64) -> Result<Vec<LogEntry>, String> {
        let Ok(mut promised) = self.entries.lock() else {
            return Ok(Vec::new());
        };
        if promised.is_empty() {
            return Ok(Vec::new());
        }
        for entry in entries {
            if let Some(before) = promised.remove(&entry.commit_seq)
                && before != *entry
            {
                promised.clear();
                return Err(format!(
                    "the commit log holds the event of sequence {} at position {}, where this \
                     process's listeners were handed sequence {}{} before the append (a \
                     transaction that gained rows after ordo's insert, such as from a deferred \
                     trigger, needs OutboxConfig::early_commit_listeners(false); otherwise the \
                     database lost the transaction)",
                    entry.sequence,
                    entry.commit_seq,
                    before.sequence,
                    if before.sequence == entry.sequence {
                        " with another group boundary"
                    } else {
                        ""
                    },
                ));
            }
        }
        let above = promised.split_off(&head.saturating_add(1));
        let unseen = std::mem::replace(&mut *promised, above);
        Ok(unseen.into_values().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(commit_seq: u64, sequence: u64) -> LogEntry {
        LogEntry {
            commit_seq,
            sequence,
            group_last: true,
        }
    }

    #[test]
    fn a_promise_is_read_while_consecutive_and_settled_by_the_same_entry() {
        let promised = Promised::new(0);
        let mut watch = promised.subscribe();
        promised
            .promise(&[entry(1, 10), entry(2, 11)], 0)
            .expect("first promise");
        assert_eq!(*watch.borrow_and_update(), 2);
        promised.promise(&[entry(4, 13)], 0).expect("a later one");
        let mut out = Vec::new();
        promised.read(1, 10, &mut out);
        assert_eq!(
            out,
            vec![entry(1, 10), entry(2, 11)],
            "stops at the hole at 3"
        );
        // The same promise again is no change.
        promised.promise(&[entry(2, 11)], 0).expect("same again");
        let unseen = promised.settle(&[entry(1, 10)], 2).expect("the log agrees");
        assert_eq!(unseen, vec![entry(2, 11)], "2 is below the head, unseen");
        let mut out = Vec::new();
        promised.read(4, 10, &mut out);
        assert_eq!(out, vec![entry(4, 13)], "4 is still promised");
    }

    #[test]
    fn a_position_given_to_another_event_is_an_error() {
        let promised = Promised::new(0);
        promised.promise(&[entry(1, 10)], 0).expect("promise");
        assert!(promised.promise(&[entry(1, 12)], 0).is_err());
        let promised = Promised::new(0);
        promised.promise(&[entry(1, 10)], 0).expect("promise");
        assert!(promised.settle(&[entry(1, 12)], 1).is_err());
        let promised = Promised::new(0);
        promised.promise(&[entry(1, 10)], 0).expect("promise");
        let boundary = LogEntry {
            group_last: false,
            ..entry(1, 10)
        };
        assert!(
            promised.settle(&[boundary], 1).is_err(),
            "the group went on past what was promised"
        );
    }

    #[test]
    fn positions_already_logged_are_not_promised() {
        let promised = Promised::new(5);
        promised
            .promise(&[entry(5, 10), entry(6, 11)], 5)
            .expect("promise");
        let mut out = Vec::new();
        promised.read(5, 10, &mut out);
        assert!(out.is_empty());
        promised.read(6, 10, &mut out);
        assert_eq!(out, vec![entry(6, 11)]);
    }
}
