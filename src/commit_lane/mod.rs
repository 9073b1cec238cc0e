//! The commit-ordered lane: a dense commit log in which every source transaction's events are
//! contiguous, folded from the insert lane by a leaderless [`sequencer`].
//!
//! The [`sequencer`] appends to the log (`ordo.commit_chunks`, read as the view
//! `ordo.commit_log`) and publishes the log head; [`listener`]
//! streams read the recent log entries this process appended (and the events themselves from
//! the insert lane's cache), or the log joined to the events by pages when further behind.
//! A log that went back under what this process saw is checked, and a rewind found there or
//! upstream is lived through, in [`rewind`].

pub(crate) mod listener;
pub(crate) mod promised;
pub(crate) mod rewind;
pub(crate) mod sequencer;
pub(crate) mod sql;
pub(crate) mod store;
mod turns;
pub(crate) mod wait;
pub(crate) mod watcher;
// The checks of a log that went back live in the rewind room; the lane's files name them here.
pub(crate) use rewind::went_back;

use std::collections::VecDeque;
use std::sync::{Arc, RwLock};

use serde::de::DeserializeOwned;
use sqlx::PgPool;
use tokio::sync::{Notify, watch};

use crate::config::OutboxConfig;
use crate::insert_lane::{LaneShared, Rewind};
use crate::position::{CommitSequence, EventSequence};
use crate::task::Tasks;
use promised::Promised;
use sequencer::Sequencer;
use went_back::WentBack;

/// One row of the log: which event sits at a commit sequence, and whether it ends its group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LogEntry {
    pub(crate) commit_seq: u64,
    pub(crate) sequence: u64,
    pub(crate) group_last: bool,
}

/// The recent tail of the log as this process appended it or its readers read it:
/// `entries[i]` is `base + i`.
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

    /// Takes in entries a reader read from the table: those that continue the cached run, or
    /// a run above it (which restarts the cache there). Entries below the run's end are
    /// already held (or older than it): the cache keeps the highest positions read.
    fn remember(&mut self, read: &[LogEntry]) {
        let end = self.base + self.entries.len() as u64;
        let above: Vec<LogEntry> = read
            .iter()
            .filter(|entry| entry.commit_seq >= end)
            .copied()
            .collect();
        self.extend(&above);
    }

    /// The lowest position the cache holds.
    fn lowest(&self) -> Option<u64> {
        self.entries.front().map(|entry| entry.commit_seq)
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
    /// Positions this process saw that the log went back below ([`went_back`]).
    pub(crate) went_back: WentBack,
    /// Positions the sequencer here computed for this process's own commits before their
    /// append ([`promised`]).
    pub(crate) promised: Promised,
    /// Someone here started following the head ([`Self::follow_head`]): the sequencer looks
    /// again whether anyone waits for its appends.
    pub(crate) followed: Notify,
}

impl CommitShared {
    pub(crate) fn new(head: u64, capacity: usize, rewind: Arc<Rewind>) -> Self {
        Self {
            head: watch::Sender::new(head),
            log: RwLock::new(LogCache::new(capacity)),
            went_back: WentBack::new(rewind),
            promised: Promised::new(head),
            followed: Notify::new(),
        }
    }

    /// Hands `entries`, computed by the fold before their append, to the listeners that take
    /// them ([`promised`]); a position promised before to another event is reported as a
    /// rewind.
    pub(crate) fn promise(&self, entries: &[LogEntry]) {
        if let Err(what) = self.promised.promise(entries, self.head()) {
            self.went_back.report(what);
        }
    }

    /// Compares what the log now holds, `entries` and everything up to `head`, with what was
    /// promised ([`promised`]): promises the entries do not cover are checked against the
    /// database like positions the log went back below; another event at a promised position
    /// is reported as a rewind.
    pub(crate) fn settle_promised(&self, entries: &[LogEntry], head: u64) {
        match self.promised.settle(entries, head) {
            Ok(unseen) => self.went_back.check_later(&unseen),
            Err(what) => self.went_back.report(what),
        }
    }

    /// Publishes a head read from the database (or appended there), never moving it backwards,
    /// and wakes parked listeners. A head below one this process saw is remembered with the
    /// events it saw above it ([`went_back`]).
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
            self.went_back.fell(head, known, &self.log);
        }
    }

    /// Takes in the newest server history and the server's start a read of the log's state
    /// found (see [`went_back`]); returns whether positions this process saw wait to be
    /// checked against the database.
    pub(crate) fn note_server(&self, server: store::ServerRead) -> bool {
        self.went_back
            .note_server(server.started, self.head(), &self.log);
        self.went_back
            .note_history(server.history, server.timeline, self.head(), &self.log)
    }

    /// Remembers what readers here read from the table, so that the log cache holds the
    /// positions this process returned even where it does not fold.
    pub(crate) fn remember(&self, entries: &[LogEntry]) {
        if let Ok(mut log) = self.log.write() {
            log.remember(entries);
        }
    }

    pub(crate) fn head(&self) -> u64 {
        *self.head.borrow()
    }

    /// A watch of the head, for whoever waits for logged positions: while one is held, the
    /// sequencer here appends as soon as its cadence allows rather than gathering longer
    /// ([`Self::logged_followers`]).
    pub(crate) fn follow_head(&self) -> watch::Receiver<u64> {
        let head = self.head.subscribe();
        self.followed.notify_one();
        head
    }

    /// Whether anyone here waits for logged positions: a head follower that does not take
    /// promises (a listener taking promises also follows the head, for the groups it has no
    /// promise of, which the sequencer counts apart).
    pub(crate) fn logged_followers(&self) -> bool {
        self.head.receiver_count() > self.promised.takers()
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
    let read = store::head_and_cursor(pool).await?;
    let commit = Arc::new(CommitShared::new(
        read.head,
        config.cache_capacity,
        Arc::clone(&lane.rewind),
    ));
    commit.note_server(read.server);
    if config.sequencer {
        let mut sequencer = Sequencer::new(
            pool.clone(),
            Arc::clone(lane),
            Arc::clone(&commit),
            tasks.signal(),
            config,
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
