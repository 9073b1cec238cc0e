//! The commit-ordered lane: a dense commit log in which every source transaction's events are
//! contiguous, folded from the insert lane by a leaderless [`sequencer`].
//!
//! The [`sequencer`] appends to the log (`ordo.commit_chunks`, read as the view
//! `ordo.commit_log`) and publishes the log head; [`listener`]
//! streams read the recent log entries this process appended (and the events themselves from
//! the insert lane's cache), or the log joined to the events by pages when further behind.

pub(crate) mod listener;
pub(crate) mod sequencer;
pub(crate) mod sql;
pub(crate) mod store;
mod turns;
pub(crate) mod wait;
pub(crate) mod watcher;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use serde::de::DeserializeOwned;
use sqlx::PgPool;
use tokio::sync::watch;

use crate::config::OutboxConfig;
use crate::insert_lane::{LaneShared, Rewind};
use crate::position::{CommitSequence, EventSequence};
use crate::task::Tasks;
use sequencer::Sequencer;

/// One row of the log: which event sits at a commit sequence, and whether it ends its group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LogEntry {
    pub(crate) commit_seq: u64,
    pub(crate) sequence: u64,
    pub(crate) group_last: bool,
}

/// The recent tail of the log as this process appended it: `entries[i]` is `base + i`.
pub(crate) struct LogCache {
    base: u64,
    entries: VecDeque<LogEntry>,
    capacity: usize,
}

impl LogCache {
    fn new(capacity: usize) -> Self {
        Self {
            base: 1,
            entries: VecDeque::new(),
            capacity,
        }
    }

    /// Appends entries that continue the cached run; anything else restarts the run at them.
    pub(crate) fn extend(&mut self, appended: &[LogEntry]) {
        let Some(first) = appended.first() else {
            return;
        };
        if first.commit_seq != self.base + self.entries.len() as u64 {
            self.entries.clear();
            self.base = first.commit_seq;
        }
        self.entries.extend(appended.iter().copied());
        while self.entries.len() > self.capacity {
            self.entries.pop_front();
            self.base += 1;
        }
    }

    /// The cached entries above `head` up to `through`.
    fn between(&self, head: u64, through: u64) -> Vec<LogEntry> {
        self.entries
            .iter()
            .filter(|e| e.commit_seq > head && e.commit_seq <= through)
            .copied()
            .collect()
    }

    /// Copies up to `max` entries from `from` on, if the cache holds `from`.
    pub(crate) fn read(&self, from: u64, max: usize, out: &mut Vec<LogEntry>) {
        if from < self.base {
            return;
        }
        let offset = (from - self.base) as usize;
        out.extend(
            self.entries
                .range(offset.min(self.entries.len())..)
                .take(max),
        );
    }
}

/// State shared by the sequencer (or the head watcher) and the commit-lane listeners.
pub(crate) struct CommitShared {
    /// `last_commit_seq` as this process last saw it.
    pub(crate) head: watch::Sender<u64>,
    pub(crate) log: RwLock<LogCache>,
    /// Where a position given to another event is reported: the outbox's (the insert lane's)
    /// rewind.
    rewind: Arc<Rewind>,
    /// Positions this process saw above a head the log later went back to, with the event
    /// sequence each held, until they are appended again (see [`publish_head`](Self::publish_head)).
    gone_back: Mutex<BTreeMap<u64, u64>>,
    /// The head seen that the last went-back warning was about: one warning per fall, however
    /// often the lower head is read again.
    warned_below: AtomicU64,
}

impl CommitShared {
    pub(crate) fn new(head: u64, capacity: usize, rewind: Arc<Rewind>) -> Self {
        Self {
            head: watch::Sender::new(head),
            log: RwLock::new(LogCache::new(capacity)),
            rewind,
            gone_back: Mutex::new(BTreeMap::new()),
            warned_below: AtomicU64::new(0),
        }
    }

    /// Publishes a head read from the database (or appended there), never moving it backwards,
    /// and wakes parked listeners.
    ///
    /// Only the append's compare-and-set moves `last_commit_seq`, and only forwards, but
    /// appends commit asynchronously: a crash of the server may lose the last ones, and the
    /// head read afterwards is below one this process saw. The fold appends the same events
    /// again, to the same positions. A failover to a standby that had not received the last
    /// transactions loses their events too, and their positions go to other events, which
    /// this process's commit-lane listeners, past them, would skip. So a head that went back
    /// is remembered with the events this process saw at the positions above it
    /// ([`check_reappended`](Self::check_reappended)); a position appended again to another
    /// event is reported as a rewind, and the outbox stops
    /// ([`Error::ServerRewound`](crate::Error::ServerRewound)). The events sequence, which the
    /// insert lane watches, is logged 32 values ahead and does not go back on a small loss.
    pub(crate) fn publish_head(&self, head: u64) {
        metrics::gauge!(crate::telemetry::metrics::COMMIT_HEAD).set(head as f64);
        let mut behind = None;
        self.head.send_if_modified(|known| {
            if head < *known {
                behind = Some(*known);
            }
            let newer = head > *known;
            if newer {
                *known = head;
            }
            newer
        });
        if let Some(known) = behind {
            self.went_back(head, known);
        }
    }

    /// The log's head is `head`, below `known`: remembers what this process saw above it.
    fn went_back(&self, head: u64, known: u64) {
        let held = match self.log.read() {
            Ok(log) => log.between(head, known),
            Err(_) => Vec::new(),
        };
        let Ok(mut gone) = self.gone_back.lock() else {
            return;
        };
        for entry in &held {
            gone.entry(entry.commit_seq).or_insert(entry.sequence);
        }
        if self.warned_below.swap(known, Ordering::Relaxed) == known {
            return;
        }
        if held.is_empty() {
            tracing::warn!(
                head,
                seen = known,
                "the commit log's head went back below a position this process saw (a crash \
                 that lost the last appends, or a failover); this process holds none of those \
                 entries, so it cannot check that they are appended to the same events again"
            );
        } else {
            tracing::warn!(
                head,
                seen = known,
                "the commit log's head went back below a position this process saw (a crash \
                 that lost the last appends, or a failover); checking that the positions are \
                 appended to the same events again"
            );
        }
    }

    /// The event sequences this process saw above a head the log went back to, not yet
    /// appended again.
    pub(crate) fn gone_back_sequences(&self) -> Vec<u64> {
        self.gone_back
            .lock()
            .map(|gone| gone.values().copied().collect())
            .unwrap_or_default()
    }

    /// The first position (and its sequence) of those this process saw above a head the log
    /// went back to whose event is not among `stored`.
    pub(crate) fn first_gone(&self, stored: &[u64]) -> Option<(u64, u64)> {
        let gone = self.gone_back.lock().ok()?;
        gone.iter()
            .find(|(_, sequence)| !stored.contains(sequence))
            .map(|(&position, &sequence)| (position, sequence))
    }

    /// Reports a rewind the commit lane found: the outbox stops.
    pub(crate) fn report_rewind(&self, what: String) {
        if let Ok(mut gone) = self.gone_back.lock() {
            gone.clear();
        }
        self.rewind.report(what);
    }

    /// Compares entries about to be published with what this process saw at their positions
    /// before the log's head went back: a position that now holds another event was given
    /// twice (the database lost that event, or the transactions before it), and the rewind is
    /// reported.
    pub(crate) fn check_reappended(&self, entries: &[LogEntry]) {
        let Ok(mut gone) = self.gone_back.lock() else {
            return;
        };
        if gone.is_empty() {
            return;
        }
        for entry in entries {
            if let Some(seen) = gone.remove(&entry.commit_seq)
                && seen != entry.sequence
            {
                drop(gone);
                self.report_rewind(format!(
                    "the commit log went back and position {} was appended again to the event \
                     of sequence {}, where this process had seen sequence {seen}",
                    entry.commit_seq, entry.sequence
                ));
                return;
            }
        }
        if gone.is_empty() {
            tracing::info!(
                "the commit log is appended again with the events this process saw: no \
                 position was given to another event"
            );
        }
    }

    pub(crate) fn head(&self) -> u64 {
        *self.head.borrow()
    }
}

/// Starts the commit lane: reads the log head, then spawns this process's sequencer, or, with
/// `config.sequencer` off, the watcher that follows another process's folding.
pub(crate) async fn spawn<P>(
    tasks: &Tasks,
    pool: &PgPool,
    config: &OutboxConfig,
    lane: &Arc<LaneShared<P>>,
) -> crate::error::Result<Arc<CommitShared>>
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    let head = read_head(pool).await?;
    let commit = Arc::new(CommitShared::new(
        head.get(),
        config.cache_capacity,
        Arc::clone(&lane.rewind),
    ));
    if config.sequencer {
        let mut sequencer = Sequencer::new(
            pool.clone(),
            Arc::clone(lane),
            Arc::clone(&commit),
            tasks.signal(),
            config.fold_batch,
            config.fold_interval,
        );
        if config.cross_process_wakeups {
            let announcer = sequencer.announcer(config.notify_channel.clone(), tasks.signal());
            tasks.spawn("commit_lane.announcer", announcer);
        }
        tasks.spawn("commit_lane.sequencer", sequencer.run());
    } else {
        tasks.spawn(
            "commit_lane.watcher",
            watcher::run(
                pool.clone(),
                Arc::clone(&commit),
                lane.frontier.subscribe(),
                config.resync_interval,
                tasks.signal(),
            ),
        );
    }
    Ok(commit)
}

/// The log head as stored ([`sql::HEAD`]).
pub(crate) async fn read_head(pool: &PgPool) -> Result<CommitSequence, sqlx::Error> {
    sqlx::query_scalar(sql::HEAD).fetch_one(pool).await
}

/// Retention's part of the commit log, in its transaction, once the events below `events_from`
/// are dropped: deletes their entries (a prefix of the log) and returns the new commit floor,
/// the highest commit sequence gone.
pub(crate) async fn trim_below(
    conn: &mut sqlx::PgConnection,
    events_from: EventSequence,
) -> crate::error::Result<CommitSequence> {
    let floor = sqlx::query_scalar(sql::TRIM)
        .bind(events_from)
        .fetch_one(conn)
        .await?;
    Ok(floor)
}
