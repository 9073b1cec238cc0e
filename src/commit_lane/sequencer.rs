//! The sequencer: folds the insert lane into the commit log.
//!
//! For each real event the insert lane yields above the cursor, in sequence order: if its
//! transaction's group is already logged, skip it; otherwise the whole group is committed and
//! visible (we see one of its rows), so it is appended at once, in the group's place: after
//! every group with a lower first sequence. Every ready group of a batch goes into one
//! statement under one compare-and-set, which advances `logged_through_sequence` to the last
//! position the batch covered.
//!
//! The fold is a pure function of the insert lane and the state row, so every process that
//! runs it computes the same appends; the CAS only suppresses the duplicates. A refused CAS
//! reads what the peer appended since this process's head ([`CATCH_UP`]) and continues from
//! there: the groups the peer logged are dropped from the plan, the rest is appended on the
//! peer's cursor, and the reader moves only if the peer got further than it. An error or a
//! start re-reads the state row ([`RESTART`]) and folds on from there. A process killed at any
//! instant leaves nothing half-written: an append is one statement.
//!
//! Who appends a plan, this sequencer or a peer it yields to, is decided in
//! [`turns`](super::turns).
//!
//! [`CATCH_UP`]: super::sql::CATCH_UP
//! [`RESTART`]: super::sql::RESTART

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::sync::watch;
use tokio::time::Instant;

use super::store::{self, Appended, AppendedEntry, PeerAppends, Planned, Restart};
use super::turns::{Step, Turns};
use super::{CommitShared, LogEntry};
use crate::error::Result;
use crate::insert_lane::LaneShared;
use crate::insert_lane::cache::{Slot, SlotItem};
use crate::insert_lane::reader::LaneReader;
use crate::insert_lane::rows::ReadMode;
use crate::task::StopSignal;
use crate::telemetry::metrics as m;

/// The session settings of the sequencer's own connections (they touch nothing else).
///
/// - `synchronous_commit = off`: an append is a pure function of durable data (committed
///   events, the state row), so losing the last appends in a server crash only means folding
///   them again, identically; and anything durable that depends on an append (a
///   subscription's checkpoint) commits after it, so its WAL flush carries the append's commit
///   record too. What it saves is a WAL flush per append, which with one writer was a second
///   flushed transaction per published one.
/// - `jit = off`: no statement of the fold runs long enough to gain from it, and a stock server
///   compiles any plan whose estimate crosses `jit_above_cost`, for hundreds of milliseconds
///   (the statements are also shaped to stay under it, see `sql.rs`).
/// - `enable_seqscan = off`: every statement of the fold reads by index, and a sequential scan
///   of a growing table is never the right plan; but the planner picks one for a generic plan
///   made while a partition of `ordo.events` was small (its first autovacuum ANALYZE, at a few
///   hundred rows, on a fresh database or a partition that has just started to fill), and keeps
///   it until the next ANALYZE, up to a minute later. Each append then read the whole
///   partition: 13 to 198 ms per append (65,751 rows read), the fold up to 12,000 events
///   behind eight writers (`tests/plans.rs` checks the plans).
pub(crate) const SESSION: &[(&str, &str)] = &[
    ("synchronous_commit", "off"),
    ("jit", "off"),
    ("enable_seqscan", "off"),
];

const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// After an append that took `d`, the next one starts no sooner than `min(d, REST_MAX)` after
/// it ended: the sequencer's backend appends at most half the time. Under a stream of commits
/// that the database is slow to take, appends then grow instead of following each other
/// without pause (with eight writers on two cores, one backend appending back to back took a
/// share of the CPU the writers needed), while a commit after a quiet spell is appended at
/// once. The cap bounds what the rest adds to the commit lane's latency.
const REST_MAX: Duration = Duration::from_millis(4);
/// Only an append of at least this many groups rests after it: a single transaction at a time
/// (one writer at 500 tx/s) is appended as it comes, a stream of several is coalesced.
const REST_FROM_GROUPS: usize = 2;
/// Under a stream of commits, appends start at most this often. An append costs about half a
/// millisecond of server time whatever its size (a plan of CTEs, the state row, a chunk row),
/// and appends that followed each other as fast as the rest allowed kept the sequencer's
/// backend busy beside eight writers on two cores: two thirds of ordo's extra server time per
/// event, publish at a median 0.75x of raw `INSERT`s against 0.79x with this spacing, and 6%
/// more WAL per event (`docs/performance-history.md`, session 9). The spacing is also what a
/// commit can wait before its append starts (about 1.5 ms on the median under a stream), so it
/// stays well inside the commit lane's latency budget. A sequencer that hears peers folding (announcements
/// within [`PEERS_HEARD`]) does not space its appends: there the commit lane of every other
/// process already waits a wake-up, a read and an announcement on top of the append, and the
/// spacing put 2 ms on its p99 with three processes (`docs/performance-history.md`,
/// session 9).
const STREAM_SPACING: Duration = Duration::from_millis(5);
/// A stream is [`STREAM_APPENDS`] appends in a row of at least this many groups each: commits
/// come faster than appends can take them one by one. One writer at 500 tx/s appends one group
/// at a time, and a backlog after a pause (a start, a slow statement) drains in an append or
/// two; neither is spaced.
const STREAM_FROM_GROUPS: usize = 4;
const STREAM_APPENDS: u32 = 3;
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What [`Sequencer::append_plan`] read while its append ran: `None` when it read nothing (or
/// dropped the read), otherwise what [`LaneReader::next_batch`] returned (`Some(None)` once the
/// outbox stops).
type ReadAhead<P> = Option<Option<Result<Vec<Slot<P>>>>>;

/// The skip set's mark for a group planned but not appended yet: no member is above it.
const PLANNED: u64 = u64::MAX;

pub(crate) struct Sequencer<P> {
    pool: PgPool,
    lane: Arc<LaneShared<P>>,
    commit: Arc<CommitShared>,
    stop: StopSignal,
    batch: usize,
    interval: Duration,
    turns: Turns,
    /// What to tell peers on the wake-up channel, when they listen (see [`Self::announcer`]).
    announce: Option<watch::Sender<Announcement>>,
    /// When this sequencer last told peers that it leaves its appends to them.
    yielded_at: Option<Instant>,
}

/// What a sequencer tells other processes' sequencers: the log head it appended (or, yielding,
/// knows) and the insert sequence the log covers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Announcement {
    head: u64,
    covered: u64,
}

/// After an append, peers are told of it while one of them spoke within this long: a yielding
/// peer says so this often ([`YIELDING_SAID_EVERY`]), and a process alone sends nothing.
const PEERS_HEARD: Duration = Duration::from_secs(3);
/// How often a yielding sequencer tells the peers that it reads their appends.
const YIELDING_SAID_EVERY: Duration = Duration::from_secs(1);

impl<P> Sequencer<P>
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    pub(crate) fn new(
        pool: PgPool,
        lane: Arc<LaneShared<P>>,
        commit: Arc<CommitShared>,
        stop: StopSignal,
        batch: usize,
        interval: Duration,
    ) -> Self {
        let options = pool
            .connect_options()
            .as_ref()
            .clone()
            .options(SESSION.iter().copied());
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .connect_lazy_with(options);
        Self {
            pool,
            lane,
            commit,
            stop,
            batch,
            interval,
            turns: Turns::default(),
            announce: None,
            yielded_at: None,
        }
    }

    /// The task that sends this sequencer's announcements on `channel`, one at a time, always
    /// the latest (a burst of appends is told as its last). A yielding peer then reads an
    /// append as soon as it is made instead of at its next poll. The wake-up rides on the
    /// channel the insert lanes listen on; a process of an older version takes it as a commit
    /// hint at the covered sequence, which it holds already.
    pub(crate) fn announcer(
        &mut self,
        channel: String,
        mut stop: StopSignal,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (sender, mut latest) = watch::channel(Announcement::default());
        self.announce = Some(sender);
        let pool = self.pool.clone();
        let instance = self.lane.instance;
        async move {
            loop {
                tokio::select! {
                    biased;
                    _ = stop.stopped() => return,
                    changed = latest.changed() => if changed.is_err() { return },
                }
                let Announcement { head, covered } = *latest.borrow_and_update();
                if let Err(error) = store::announce(&pool, &channel, covered, instance, head).await
                {
                    // Peers poll as well: a lost announcement costs them latency only.
                    tracing::debug!(%error, "telling peers of an append failed");
                }
            }
        }
    }

    fn tell_peers(&self, state: &Restart) {
        if let Some(announce) = &self.announce {
            announce.send_replace(Announcement {
                head: state.head,
                covered: state.cursor,
            });
        }
    }

    pub(crate) async fn run(mut self) {
        let mut backoff = FIRST_BACKOFF;
        loop {
            match self.fold().await {
                Ok(()) => return,
                Err(error) => {
                    tracing::warn!(%error, ?backoff, "sequencer failed; restarting from the state row");
                }
            }
            tokio::select! {
                biased;
                _ = self.stop.stopped() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Folds until the outbox stops (`Ok`) or a statement fails (`Err`).
    async fn fold(&mut self) -> Result<()> {
        let mut state = store::restart(&self.pool).await?;
        self.commit.publish_head(state.head);
        let mut reader = LaneReader::new(
            Arc::clone(&self.lane),
            self.stop.clone(),
            ReadMode::Meta,
            state.cursor,
        )
        .with_limit(self.batch);
        // Groups planned but not yet appended, in log order.
        let mut plan: Vec<Planned> = Vec::new();
        // When the next append may start (see [`Cadence::next_due`]): `interval` after the last
        // one started, spaced under a stream while no peer folds, and no sooner than the last
        // one took after it ended. A transaction arriving after a quiet spell is appended at once.
        let mut due = Instant::now();
        let mut cadence = Cadence::default();
        loop {
            // Act after every batch read rather than chasing the frontier: under a steady
            // stream the frontier moves while we read, and chasing it delayed appends by
            // milliseconds (p50 5 ms under 8 writers). A batch read is itself bounded (512
            // cached slots, or a page), and events that commit during an append go into the
            // next one.
            let batch = if plan.is_empty() {
                self.turns.settled();
                reader.next_batch().await
            } else {
                let (at, step) = self.turns.next_step(&plan, due);
                if Instant::now() >= at {
                    match step {
                        Step::Append => {
                            let started = Instant::now();
                            let groups = plan.len();
                            self.turns.settled();
                            let read_ahead =
                                self.append_plan(&mut state, &mut reader, &mut plan).await?;
                            cadence.peers = self.lane.peer_log.heard_within(PEERS_HEARD);
                            due = cadence.next_due(started, Instant::now(), groups, self.interval);
                            match read_ahead {
                                Some(Some(batch)) => self.plan_batch(batch?, &mut state, &mut plan),
                                Some(None) => return Ok(()),
                                None => {}
                            }
                        }
                        Step::AskPeer => {
                            self.turns.asked();
                            self.ask_peer(&mut state, &mut reader, &mut plan).await?;
                        }
                    }
                    continue;
                }
                let peer_log = &self.lane.peer_log;
                tokio::select! {
                    biased;
                    batch = reader.next_batch() => batch,
                    _ = tokio::time::sleep_until(at) => continue,
                    _ = peer_log.wake.notified(), if step == Step::AskPeer => {
                        if peer_log.head() > state.head {
                            self.turns.ask_now();
                        }
                        continue;
                    }
                }
            };
            let Some(batch) = batch else {
                return Ok(());
            };
            self.plan_batch(batch?, &mut state, &mut plan);
        }
    }

    /// Adds the groups first met in `batch` to `plan`, skipping members of groups already
    /// logged or planned.
    fn plan_batch(&self, batch: Vec<Slot<P>>, state: &mut Restart, plan: &mut Vec<Planned>) {
        for slot in batch {
            let Some(xid) = slot.commit_xid else { continue };
            if matches!(slot.item, SlotItem::Placeholder) {
                continue;
            }
            if let Some(top) = state.logged.get(&xid) {
                // A logged group's members all sit at or below its top; a row above it
                // carries the transaction id of a group that is complete in the log.
                if slot.sequence > *top {
                    foreign_row(slot.sequence, xid);
                }
                continue;
            }
            // Planned, not appended yet: every member met until the append is its own.
            state.logged.insert(xid, PLANNED);
            plan.push(Planned {
                xid,
                low: slot.sequence,
                own: self.lane.take_own_commit(xid),
            });
        }
    }

    /// One look at what peers appended while yielding; follows them if they moved.
    async fn ask_peer(
        &mut self,
        state: &mut Restart,
        reader: &mut LaneReader<P>,
        plan: &mut Vec<Planned>,
    ) -> Result<()> {
        if self
            .yielded_at
            .is_none_or(|at| at.elapsed() >= YIELDING_SAID_EVERY)
        {
            self.yielded_at = Some(Instant::now());
            self.tell_peers(state);
        }
        match store::catch_up(&self.pool, state.head).await? {
            Some(peer) if peer.cursor > state.cursor || peer.head > state.head => {
                metrics::counter!(m::FOLD_APPENDS, "result" => "left_to_peer").increment(1);
                let (groups, own) = self.follow(state, reader, plan, peer);
                self.turns.peer_moved(plan);
                self.turns.peer_covered(groups, own);
            }
            Some(_) => {}
            None => self.restart(state, reader, plan).await?,
        }
        Ok(())
    }

    async fn restart(
        &self,
        state: &mut Restart,
        reader: &mut LaneReader<P>,
        plan: &mut Vec<Planned>,
    ) -> Result<()> {
        *state = store::restart(&self.pool).await?;
        plan.clear();
        self.commit.publish_head(state.head);
        reader.seek(state.cursor);
        Ok(())
    }

    /// Appends `plan` (groups up to the reader's position) under the CAS and empties it. On a
    /// refusal, continues from what the peer appended: `plan` keeps only the groups the peer
    /// did not log, to be appended on the peer's cursor.
    ///
    /// When the reader has more to read without waiting (a fold catching up on a backlog), the
    /// next batch is read while the append runs, on the lane's own connection, and returned
    /// (`Some`, as [`LaneReader::next_batch`] gave it) to be planned next. The append's entries
    /// are published as soon as it is done, the read awaited only after that: the read no longer
    /// waits for the append, and the commit lane never waits for the read. A refused append drops
    /// the read (cancel safe: the reader's position moves only when slots are returned) or, if it
    /// finished, its batch, and the peer's appends decide what is read next.
    async fn append_plan(
        &mut self,
        state: &mut Restart,
        reader: &mut LaneReader<P>,
        plan: &mut Vec<Planned>,
    ) -> Result<ReadAhead<P>> {
        let covered = reader.position();
        let ahead = reader.ready();
        {
            let read = async {
                match ahead {
                    true => Some(reader.next_batch().await),
                    false => None,
                }
            };
            tokio::pin!(read);
            let (appended, early) = {
                let append = store::append(&self.pool, state.cursor, covered, plan);
                tokio::pin!(append);
                let mut early = None;
                let appended = loop {
                    tokio::select! {
                        biased;
                        appended = &mut append => break appended,
                        batch = &mut read, if early.is_none() => early = Some(batch),
                    }
                };
                (appended, early)
            };
            if let Appended::Done(appended) = appended? {
                metrics::counter!(m::FOLD_APPENDS, "result" => "appended").increment(1);
                metrics::counter!(m::FOLD_EVENTS).increment(appended.len() as u64);
                metrics::counter!(m::FOLD_GROUPS).increment(plan.len() as u64);
                metrics::gauge!(m::FOLD_LAG)
                    .set(self.lane.frontier().saturating_sub(covered) as f64);
                record_appended(state, plan, &appended, covered);
                let entries: Vec<LogEntry> = appended.into_iter().map(|a| a.entry).collect();
                let head = entries.last().map_or(state.head, |e| e.commit_seq);
                plan.clear();
                self.publish(state, head, &entries);
                if self.lane.peer_log.heard_within(PEERS_HEARD) {
                    self.tell_peers(state);
                }
                return Ok(match early {
                    Some(batch) => batch,
                    None => read.await,
                });
            }
        }
        // Refused. A read ahead still running was dropped with its block; one that finished
        // moved the reader, which goes back to where the append covered.
        if reader.position() != covered {
            reader.seek(covered);
        }
        metrics::counter!(m::FOLD_APPENDS, "result" => "refused").increment(1);
        // A peer folds too: leave it other processes' groups from now on.
        self.turns.lost();
        match store::catch_up(&self.pool, state.head).await? {
            Some(peer) => {
                self.follow(state, reader, plan, peer);
            }
            None => self.restart(state, reader, plan).await?,
        }
        Ok(None)
    }

    /// Takes in a peer's appends: its entries join the log cache (listeners here read them
    /// without a table read), its groups join the skip set, and the plan keeps only groups
    /// above the peer's cursor (every group whose first event is at or below it, the peer
    /// logged: the fold is the same function everywhere). Returns how many groups the peer
    /// appended, and how many of them were this process's.
    fn follow(
        &self,
        state: &mut Restart,
        reader: &mut LaneReader<P>,
        plan: &mut Vec<Planned>,
        peer: PeerAppends,
    ) -> (u32, u32) {
        let mut tops: HashMap<i64, u64> = HashMap::new();
        // Ours: planned as ours already, or still waited for (taken here).
        let planned_own: HashSet<i64> = plan.iter().filter(|g| g.own).map(|g| g.xid).collect();
        let mut own = 0u32;
        for (entry, xid) in &peer.entries {
            let top = tops.entry(*xid).or_insert_with(|| {
                // Ours, appended by the peer: not to be waited for any more.
                if self.lane.take_own_commit(*xid) || planned_own.contains(xid) {
                    own = own.saturating_add(1);
                }
                entry.sequence
            });
            *top = (*top).max(entry.sequence);
        }
        let groups = u32::try_from(tops.len()).unwrap_or(u32::MAX);
        // The peer's tops replace our marks for the planned groups it logged.
        state.logged.extend(tops);
        let cursor = peer.cursor;
        plan.retain(|group| group.low > cursor);
        if cursor >= reader.position() {
            plan.clear();
            reader.seek(cursor);
        }
        // Groups still planned carry the PLANNED mark, above any cursor.
        state.logged.retain(|_, top| *top > cursor);
        state.cursor = cursor;
        let entries: Vec<LogEntry> = peer.entries.into_iter().map(|(e, _)| e).collect();
        self.publish(state, peer.head, &entries);
        (groups, own)
    }

    fn publish(&self, state: &mut Restart, head: u64, entries: &[LogEntry]) {
        state.head = state.head.max(head);
        if let Ok(mut log) = self.commit.log.write() {
            log.extend(entries);
        }
        self.commit.publish_head(state.head);
    }
}

/// When appends may start, from how the last ones went.
#[derive(Default)]
struct Cadence {
    /// Appends in a row of at least [`STREAM_FROM_GROUPS`] groups.
    streak: u32,
    /// Peers fold too: no spacing (see [`STREAM_SPACING`]).
    peers: bool,
}

impl Cadence {
    /// When the append after one that started at `started`, ended at `ended` and took `groups`
    /// groups may start: `interval` after the last one started; under a stream of commits, with
    /// no peer folding, no sooner than [`STREAM_SPACING`] after it started; and after an append
    /// of several groups no sooner than it took (up to [`REST_MAX`]) after it ended.
    fn next_due(
        &mut self,
        started: Instant,
        ended: Instant,
        groups: usize,
        interval: Duration,
    ) -> Instant {
        self.streak = if groups >= STREAM_FROM_GROUPS {
            self.streak.saturating_add(1)
        } else {
            0
        };
        let spacing = if self.streak >= STREAM_APPENDS && !self.peers {
            interval.max(STREAM_SPACING)
        } else {
            interval
        };
        let rest = if groups >= REST_FROM_GROUPS {
            ended.saturating_duration_since(started).min(REST_MAX)
        } else {
            Duration::ZERO
        };
        (started + spacing).max(ended + rest)
    }
}

/// Bookkeeping after a successful append: the new cursor, and which appended groups reach
/// above it (their later members will be met and must be skipped). A planned group with no
/// entry was refused by the statement as foreign (see [`APPEND`]).
fn record_appended(state: &mut Restart, plan: &[Planned], entries: &[AppendedEntry], covered: u64) {
    state.cursor = covered;
    let mut tops = vec![None::<u64>; plan.len()];
    for appended in entries {
        if let Some(top) = appended.ord.checked_sub(1).and_then(|i| tops.get_mut(i)) {
            *top = Some(top.map_or(appended.entry.sequence, |t| t.max(appended.entry.sequence)));
        }
    }
    for (group, top) in plan.iter().zip(tops) {
        match top {
            Some(top) => {
                state.logged.insert(group.xid, top);
            }
            None => {
                foreign_row(group.low, group.xid);
                state.logged.insert(group.xid, group.low);
            }
        }
    }
    state.logged.retain(|_, top| *top > covered);
}

/// A row that breaks the schema contract: its `commit_xid` names a transaction whose group is
/// already in the log. It is not appended (the commit lane does not carry it); the operator is
/// told which row it is.
fn foreign_row(sequence: u64, xid: i64) {
    metrics::counter!(m::CONTRACT_VIOLATIONS, "kind" => "foreign_commit_xid").increment(1);
    tracing::error!(
        sequence,
        commit_xid = xid,
        "ordo.events row at sequence {sequence} carries commit_xid {xid}, a transaction already \
         complete in the commit log: the commit lane leaves it out. Rows must take commit_xid \
         from its column default (see the writer role in docs/operations.md)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_lone_transaction_is_appended_as_soon_as_it_comes() {
        let mut cadence = Cadence::default();
        let started = Instant::now();
        let ended = started + MS;
        // Due as soon as the last append ended: at once.
        assert_eq!(cadence.next_due(started, ended, 1, Duration::ZERO), ended);
        assert_eq!(cadence.next_due(started, ended, 0, Duration::ZERO), ended);
    }

    #[test]
    fn a_few_groups_rest_as_long_as_their_append_took() {
        let mut cadence = Cadence::default();
        let started = Instant::now();
        let ended = started + MS;
        assert_eq!(
            cadence.next_due(started, ended, 2, Duration::ZERO),
            ended + MS
        );
        let slow = started + 10 * MS;
        assert_eq!(
            cadence.next_due(started, slow, 3, Duration::ZERO),
            slow + REST_MAX
        );
    }

    #[test]
    fn a_backlog_is_not_a_stream_but_appends_of_many_groups_in_a_row_are() {
        let mut cadence = Cadence::default();
        let started = Instant::now();
        let ended = started + MS;
        let rested = ended + MS;
        for _ in 1..STREAM_APPENDS {
            assert_eq!(cadence.next_due(started, ended, 50, Duration::ZERO), rested);
        }
        let spaced = started + STREAM_SPACING;
        assert_eq!(cadence.next_due(started, ended, 50, Duration::ZERO), spaced);
        assert_eq!(
            cadence.next_due(started, ended, STREAM_FROM_GROUPS, Duration::ZERO),
            spaced
        );
        // A slow append rests after it as before: the spacing bounds how often appends start.
        let slow = started + 8 * MS;
        assert_eq!(
            cadence.next_due(started, slow, 100, Duration::ZERO),
            slow + REST_MAX
        );
        // A small append ends the stream.
        assert_eq!(cadence.next_due(started, ended, 3, Duration::ZERO), rested);
        assert_eq!(cadence.next_due(started, ended, 50, Duration::ZERO), rested);
    }

    #[test]
    fn with_peers_folding_a_stream_is_not_spaced() {
        let mut cadence = Cadence {
            peers: true,
            ..Cadence::default()
        };
        let started = Instant::now();
        let ended = started + MS;
        for _ in 0..=STREAM_APPENDS {
            assert_eq!(
                cadence.next_due(started, ended, 50, Duration::ZERO),
                ended + MS
            );
        }
        cadence.peers = false;
        assert_eq!(
            cadence.next_due(started, ended, 50, Duration::ZERO),
            started + STREAM_SPACING
        );
    }

    #[test]
    fn the_configured_interval_holds_for_every_append() {
        let mut cadence = Cadence::default();
        let started = Instant::now();
        let ended = started + MS;
        let interval = 20 * MS;
        assert_eq!(
            cadence.next_due(started, ended, 1, interval),
            started + interval
        );
        for _ in 0..STREAM_APPENDS {
            assert_eq!(
                cadence.next_due(started, ended, 50, interval),
                started + interval
            );
        }
    }
}
