//! The insert-ordered lane: committed rows of `ordo.events` in `sequence` order, every hole
//! resolved (a committed row, or a placeholder once the hole is proven abandoned), never skipped.
//!
//! One [`frontier`] task per outbox advances the contiguity frontier and fills the shared
//! [`cache`]; listeners ([`reader`]) read the cache, or the table by pages when they are further
//! behind, and wait on the frontier when caught up. Nothing depends on anyone listening: the
//! frontier advances regardless, so the sequencer can always fold.

pub(crate) mod cache;
pub(crate) mod frontier;
pub(crate) mod heads;
pub(crate) mod listener;
pub(crate) mod reader;
pub(crate) mod resolve;
mod rewind;
pub(crate) mod rows;
pub(crate) mod wakeup;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use dashmap::DashMap;
use serde::de::DeserializeOwned;
use sqlx::PgPool;
use tokio::sync::{Notify, mpsc, watch};

use crate::config::OutboxConfig;
use crate::error::Result;
use crate::listen::Listen;
use crate::task::Tasks;
use cache::{Cache, Slot};
use frontier::FrontierTask;
pub(crate) use rewind::Rewind;

/// State shared by the frontier task, the writers of this process and every listener.
pub(crate) struct LaneShared<P> {
    pub(crate) pool: PgPool,
    pub(crate) cache: RwLock<Cache<P>>,
    /// The highest sequence such that every sequence at or below it is resolved.
    pub(crate) frontier: watch::Sender<u64>,
    /// The highest sequence known to have been drawn (hints from `publish_in` and from other
    /// processes' wake-ups).
    pub(crate) head_hint: AtomicU64,
    /// Asks the frontier task to look at the table now.
    pub(crate) poke: Notify,
    /// Set with a poke that carries no head (a reconnect): look even if the head seems known.
    pub(crate) resync: std::sync::atomic::AtomicBool,
    pub(crate) page_size: usize,
    /// Transactions this process committed whose groups the sequencer has not met yet, with
    /// the sequences this process inserted for each (ascending): it appends those at once and
    /// leaves other processes' groups to them, and hands their positions to this process's
    /// commit-lane listeners before the append (see `commit_lane::sequencer`).
    own_commits: DashMap<i64, OwnCommit>,
    /// How many transactions [`note_own_commit`](Self::note_own_commit) recorded.
    own_noted: AtomicU64,
    /// This outbox's mark on its wake-ups, so that it can tell its own (echoed back by LISTEN;
    /// it has those events already) from another process's.
    pub(crate) instance: u64,
    /// Set by a wake-up from another process: rows may have committed below what this process
    /// holds, in the holes it waits on.
    foreign_wake: std::sync::atomic::AtomicBool,
    /// Other processes' sequencers, as their wake-ups tell of them.
    pub(crate) peer_log: wakeup::PeerLog,
    /// Whether anyone else listens for this outbox's wake-ups.
    pub(crate) audience: Arc<wakeup::Audience>,
    /// Set for a [table view](Self::table_view): the frontier of the lane it reads, which it
    /// follows instead of its own (which no task moves).
    follows: Option<watch::Receiver<u64>>,
    /// Set when the server is found to have gone back below what this lane passed; shared
    /// with the lane's table views.
    pub(crate) rewind: Arc<Rewind>,
}

/// The sequences a transaction of this process inserted through its `commit`, ascending.
pub(crate) type OwnCommit = Arc<[u64]>;

/// Past this many unclaimed entries (no sequencer runs here to take them) the set is emptied:
/// it only steers who appends first, and must not grow without bound.
const OWN_COMMITS_MAX: usize = 65_536;

/// The set's size is looked at once per this many entries, so it holds at most
/// [`OWN_COMMITS_MAX`] plus this many.
const OWN_COMMITS_CHECK: u64 = 1_024;

impl<P> LaneShared<P> {
    pub(crate) fn new(
        pool: PgPool,
        frontier: u64,
        capacity: usize,
        budget: usize,
        page_size: usize,
    ) -> Self {
        Self {
            pool,
            cache: RwLock::new(Cache::new(frontier, capacity, budget)),
            frontier: watch::Sender::new(frontier),
            head_hint: AtomicU64::new(frontier),
            poke: Notify::new(),
            resync: std::sync::atomic::AtomicBool::new(false),
            page_size,
            own_commits: DashMap::new(),
            own_noted: AtomicU64::new(0),
            instance: uuid::Uuid::new_v4().as_u64_pair().0,
            foreign_wake: std::sync::atomic::AtomicBool::new(false),
            peer_log: wakeup::PeerLog::default(),
            audience: Arc::default(),
            follows: None,
            rewind: Arc::default(),
        }
    }

    /// The lane `of` read as another payload type, straight from the table: no cache (its
    /// readers read every page from `ordo.events`), no task of its own, `of`'s frontier. A
    /// relay reads one as [`RawPayload`](crate::relay::RawPayload), so that it forwards each
    /// payload's stored text whatever `of`'s payload type makes of it.
    pub(crate) fn table_view<Q>(of: &LaneShared<Q>) -> Self {
        let frontier = of.frontier();
        Self {
            cache: RwLock::new(Cache::none(frontier)),
            follows: Some(of.frontier_watch()),
            rewind: Arc::clone(&of.rewind),
            ..Self::new(of.pool.clone(), frontier, 0, 0, of.page_size)
        }
    }

    /// A watch of the frontier.
    pub(crate) fn frontier_watch(&self) -> watch::Receiver<u64> {
        match &self.follows {
            Some(followed) => followed.clone(),
            None => self.frontier.subscribe(),
        }
    }

    /// Records a transaction this process committed, with the sequences it inserted.
    pub(crate) fn note_own_commit(&self, xid: i64, sequences: OwnCommit) {
        // The size is read every so many notes, not on each: `len` locks every shard.
        let noted = self.own_noted.fetch_add(1, Ordering::Relaxed);
        if noted.is_multiple_of(OWN_COMMITS_CHECK) && self.own_commits.len() >= OWN_COMMITS_MAX {
            self.own_commits.clear();
        }
        self.own_commits.insert(xid, sequences);
    }

    /// Drops what [`note_own_commit`](Self::note_own_commit) recorded of `xid`: its `COMMIT`
    /// failed and the transaction rolled back, so no row of it will be met.
    pub(crate) fn forget_own_commit(&self, xid: i64) {
        self.own_commits.remove(&xid);
    }

    /// Whether this process committed `xid` (and had not been asked before), with the
    /// sequences it inserted.
    pub(crate) fn take_own_commit(&self, xid: i64) -> Option<OwnCommit> {
        self.own_commits
            .remove(&xid)
            .map(|(_, sequences)| sequences)
    }

    pub(crate) fn frontier(&self) -> u64 {
        match &self.follows {
            Some(followed) => *followed.borrow(),
            None => *self.frontier.borrow(),
        }
    }

    /// Asks the frontier task for a full look at the table (after a reconnect, when wake-ups
    /// may have been lost).
    pub(crate) fn request_resync(&self) {
        self.resync.store(true, Ordering::Release);
        self.poke.notify_one();
    }

    /// A wake-up from another process that committed up to `sequence`.
    pub(crate) fn hint_foreign(&self, sequence: u64) {
        self.foreign_wake.store(true, Ordering::Release);
        self.hint_head(sequence);
    }

    /// Whether another process woke this one since the last call.
    pub(crate) fn take_foreign_wake(&self) -> bool {
        self.foreign_wake.swap(false, Ordering::AcqRel)
    }

    /// Records that `sequence` has been drawn and wakes the frontier task.
    pub(crate) fn hint_head(&self, sequence: u64) {
        self.head_hint.fetch_max(sequence, Ordering::AcqRel);
        self.poke.notify_one();
    }
}

/// Committed events handed from this process's writers straight to the frontier task.
pub(crate) type CommittedBatch<P> = Vec<Slot<P>>;

/// Starts the insert lane: reads its frontier from the table, then spawns the frontier task and,
/// when `config` wakes other processes, has `listen` hand it their wake-ups. Returns the lane and the sender
/// this process's commits hand their events to.
pub(crate) async fn spawn<P>(
    tasks: &Tasks,
    listen: &Listen,
    pool: &PgPool,
    config: &OutboxConfig,
) -> Result<(Arc<LaneShared<P>>, mpsc::UnboundedSender<CommittedBatch<P>>)>
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    let frontier = heads::initial_frontier(pool).await?;
    let lane = Arc::new(LaneShared::new(
        pool.clone(),
        frontier,
        config.cache_capacity,
        config.cache_bytes,
        config.page_size,
    ));
    let (handoff, committed) = mpsc::unbounded_channel();
    let task = FrontierTask::new(Arc::clone(&lane), committed, tasks.signal(), config.clone());
    tasks.spawn("insert_lane.frontier", task.run());
    if config.cross_process_wakeups {
        wakeup::listen(listen, tasks, &config.notify_channel, Arc::clone(&lane));
    }
    Ok((lane, handoff))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{LaneShared, OWN_COMMITS_CHECK, OWN_COMMITS_MAX};

    fn lane() -> LaneShared<()> {
        // Never connected: the own-commits set needs no database.
        let pool = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://nobody@127.0.0.1:1/none")
            .expect("a lazy pool only parses its URL");
        LaneShared::new(pool, 0, 16, 1_024, 16)
    }

    #[tokio::test]
    async fn own_commits_nobody_takes_stay_within_their_bound() {
        let lane = lane();
        let bound = OWN_COMMITS_MAX + OWN_COMMITS_CHECK as usize;
        for xid in 0..(bound as i64 * 3) {
            lane.note_own_commit(xid, Arc::from(vec![xid as u64]));
            assert!(
                lane.own_commits.len() <= bound,
                "{} entries after {xid} notes",
                lane.own_commits.len()
            );
        }
    }

    #[tokio::test]
    async fn an_own_commit_is_taken_once_and_a_forgotten_one_not_at_all() {
        let lane = lane();
        lane.note_own_commit(7, Arc::from(vec![3, 4]));
        lane.note_own_commit(8, Arc::from(vec![5]));
        lane.forget_own_commit(8);
        assert_eq!(lane.take_own_commit(7).as_deref(), Some(&[3, 4][..]));
        assert_eq!(lane.take_own_commit(7), None);
        assert_eq!(lane.take_own_commit(8), None);
    }

    #[tokio::test]
    async fn writers_and_a_taker_at_once_lose_nothing() {
        let lane = Arc::new(lane());
        let xid = |w: i64, i: i64| w * 1_000_000 + i;
        let writers: Vec<_> = (0..4i64)
            .map(|w| {
                let lane = Arc::clone(&lane);
                std::thread::spawn(move || {
                    for i in 0..5_000i64 {
                        lane.note_own_commit(xid(w, i), Arc::from(vec![xid(w, i) as u64]));
                    }
                })
            })
            .collect();
        // The sequencer's side, while the writers note: each commit taken once it is there.
        let taker = {
            let lane = Arc::clone(&lane);
            std::thread::spawn(move || {
                let mut taken = 0u32;
                for i in 0..5_000i64 {
                    for w in 0..4i64 {
                        let mut tries = 0u32;
                        let sequences = loop {
                            if let Some(sequences) = lane.take_own_commit(xid(w, i)) {
                                break sequences;
                            }
                            tries += 1;
                            assert!(tries < 10_000_000, "commit {} never noted", xid(w, i));
                            std::thread::yield_now();
                        };
                        assert_eq!(&sequences[..], &[xid(w, i) as u64][..]);
                        taken += 1;
                    }
                }
                taken
            })
        };
        for writer in writers {
            writer.join().expect("a writer thread ends");
        }
        assert_eq!(taker.join().expect("the taker ends"), 20_000);
        assert_eq!(lane.own_commits.len(), 0);
    }
}
