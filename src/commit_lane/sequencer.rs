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
//! Groups this process committed have known members, so their positions are known as soon as
//! every group planned before them is: the sequencer hands them to this process's listeners
//! as it plans them, before the append ([`promised`](super::promised)).
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

mod appended;
mod pacing;
mod peers;

use super::store::{self, Appended, PeerAppends, Planned, Restart};
use super::turns::{Step, Turns};
use super::{CommitShared, LogEntry};
use crate::config::OutboxConfig;
use crate::error::Result;
use crate::insert_lane::LaneShared;
use crate::insert_lane::cache::{Slot, SlotItem};
use crate::insert_lane::reader::LaneReader;
use crate::insert_lane::rows::ReadMode;
use crate::task::StopSignal;
use crate::telemetry::metrics as m;
use appended::{foreign_row, record_appended};
use pacing::Cadence;
pub(crate) use peers::Announcement;
use peers::PEERS_HEARD;

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

/// [`SESSION`] as the statements a new connection runs (a test checks they agree).
const SET_SESSION: &str = "SET synchronous_commit = off; SET jit = off; SET enable_seqscan = off";

/// How long a stopping sequencer tries to append what it planned ([`Sequencer::flush`]).
const FLUSH_PATIENCE: Duration = Duration::from_secs(1);
/// While nobody waits for the log but a listener takes early positions, an append starts once
/// the plan holds this many groups, whatever the spacing (or `fold_batch`, if smaller). An
/// append costs the server about 0.35 ms plus 3.6 us a group (measured here, one-event
/// transactions; 1.3 ms at this size), and with eight writers flat out, appends of up to 1,024
/// groups raised the early listeners' p99 from 3.6 to 5.2 ms to 4.5 to 8.3 ms. With no such
/// listener, nobody's clock runs through an append, and it gathers up to `fold_batch` groups
/// ([`Sequencer::gather_size`]).
const GATHER_GROUPS: usize = 256;

const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What happened besides an append ([`Sequencer::append_plan`]).
#[derive(Default)]
struct AppendPlan {
    /// The outbox stopped while the append ran.
    stopped: bool,
    /// When the plan, emptied by the append, met its first group again during it.
    met: Option<Instant>,
}

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
    /// Whether it hands its own groups' positions to this process's listeners before their
    /// append ([`promised`](super::promised)).
    promises: bool,
    /// How far the plan's positions are known ([`Self::promise`]).
    chain: Chain,
    /// How far apart appends start while nobody waits for the log
    /// ([`OutboxConfig::unwatched_append_spacing`](crate::OutboxConfig::unwatched_append_spacing)).
    unwatched: Duration,
}

/// How far the plan's positions are known: its first `groups` groups are promised, and `next`
/// is the last position they take (`None` once a group of unknown size is met: no later group
/// is known before an append).
#[derive(Clone, Copy, Default)]
struct Chain {
    groups: usize,
    next: Option<u64>,
}

impl<P> Sequencer<P>
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    /// A sequencer with `config`'s fold settings (`fold_batch`, `fold_interval`,
    /// `early_commit_listeners`, `unwatched_append_spacing`).
    pub(crate) fn new(
        pool: PgPool,
        lane: Arc<LaneShared<P>>,
        commit: Arc<CommitShared>,
        stop: StopSignal,
        config: &OutboxConfig,
    ) -> Self {
        // Set by statements once connected, not as startup `options`: PgBouncer refuses a
        // connection whose startup packet carries them (`unsupported startup parameter`).
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::raw_sql(SET_SESSION).execute(conn).await?;
                    Ok(())
                })
            })
            .connect_lazy_with(pool.connect_options().as_ref().clone());
        Self {
            pool,
            lane,
            commit,
            stop,
            batch: config.fold_batch,
            interval: config.fold_interval,
            turns: Turns::default(),
            announce: None,
            yielded_at: None,
            promises: config.early_commit_listeners,
            chain: Chain::default(),
            unwatched: config.unwatched_append_spacing,
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
        self.take_in(&state).await?;
        let mut reader = LaneReader::new(
            Arc::clone(&self.lane),
            self.stop.clone(),
            ReadMode::Meta,
            state.cursor,
        )
        .with_limit(self.batch);
        // Groups planned but not yet appended, in log order.
        let mut plan: Vec<Planned> = Vec::new();
        self.promise_again(&state, &plan);
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
                // While nobody waits for the log, appends gather longer, up to `gather_size` groups.
                let spaced = if self.unwatched.is_zero()
                    || plan.len() >= self.gather_size()
                    || self.watched(&plan)
                {
                    due
                } else {
                    cadence.unwatched(due, self.unwatched)
                };
                let (at, step) = self.turns.next_step(&plan, spaced);
                if Instant::now() >= at {
                    match step {
                        Step::Append => {
                            let started = Instant::now();
                            let groups = plan.len();
                            self.turns.settled();
                            let outcome =
                                self.append_plan(&mut state, &mut reader, &mut plan).await?;
                            cadence.peers = self.lane.peer_log.heard_within(PEERS_HEARD);
                            due = cadence.next_due(started, Instant::now(), groups, self.interval);
                            if outcome.stopped {
                                self.flush(&state, &reader, &plan).await;
                                return Ok(());
                            }
                            if let Some(met) = outcome.met
                                && !plan.is_empty()
                            {
                                cadence.met(met);
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
                let gathering = spaced > due;
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
                    // Someone may wait for the log now: look again when the append is due.
                    _ = self.commit.followed.notified(), if gathering => continue,
                    _ = self.lane.audience.changed.notified(), if gathering => continue,
                }
            };
            let Some(batch) = batch else {
                self.flush(&state, &reader, &plan).await;
                return Ok(());
            };
            let was_empty = plan.is_empty();
            self.plan_batch(batch?, &mut state, &mut plan);
            if was_empty && !plan.is_empty() {
                cadence.met(Instant::now());
            }
        }
    }

    /// How many groups a gathered append waits for at most (within the spacing).
    /// [`GATHER_GROUPS`] while a listener takes early positions: a long append takes the
    /// machine just when those listeners' next groups come. Otherwise `fold_batch`: nobody's
    /// clock runs through the append, and one a second costs the server less than eight (one
    /// writer back to back makes about 2,000 transactions a second). What that is worth to the
    /// writer is below what the machine's noise lets a run show: beside a busy neighbour it
    /// published at 0.87x to 0.99x of raw `INSERT` transactions against 0.89x to 0.94x with the
    /// cap always on (`benches/tools/examples/single_writer --interleave`, 2026-12-06, `9c9f888`).
    fn gather_size(&self) -> usize {
        if self.commit.promised.listened() {
            self.batch.min(GATHER_GROUPS)
        } else {
            self.batch
        }
    }

    /// Whether anyone may be waiting for the next append: a reader of logged positions in
    /// this process (a subscription or relay on the commit lane, a listener without early
    /// positions, [`Outbox::wait_for_commit`](crate::Outbox::wait_for_commit)), a listener
    /// taking early positions while a planned group has none (another writer's, or one
    /// published in the application's own transaction), or another process on the wake-up
    /// channel, where relays and listeners elsewhere wait for the log (or this process cannot
    /// tell: it has no wake-up connection, or it is down).
    fn watched(&self, plan: &[Planned]) -> bool {
        self.commit.logged_followers()
            || (self.commit.promised.listened() && self.chain.groups < plan.len())
            || self.lane.audience.anyone()
    }

    /// The outbox stops: appends what is planned, once, so that the log a stopped process
    /// leaves covers every group it met (the next fold would append the same, later). Not
    /// after a rewind (the plan was read from a server that went back), and given up after
    /// [`FLUSH_PATIENCE`] (the state row locked, the server gone): nothing depends on it.
    async fn flush(&self, state: &Restart, reader: &LaneReader<P>, plan: &[Planned]) {
        if plan.is_empty() || self.commit.went_back.reported() {
            return;
        }
        let append = store::append(&self.pool, state.cursor, reader.position(), plan);
        match tokio::time::timeout(FLUSH_PATIENCE, append).await {
            Ok(Ok(Appended::Done(appended))) => {
                metrics::counter!(m::FOLD_APPENDS, "result" => "appended").increment(1);
                metrics::counter!(m::FOLD_EVENTS).increment(appended.len() as u64);
                metrics::counter!(m::FOLD_GROUPS).increment(plan.len() as u64);
            }
            Ok(Ok(Appended::Refused)) => {
                tracing::debug!("a peer appended first; nothing to append at stop");
            }
            Ok(Err(error)) => {
                tracing::debug!(%error, "the append at stop failed; the next fold appends it");
            }
            Err(_) => {
                tracing::debug!("the append at stop took too long; the next fold appends it");
            }
        }
    }

    /// Adds the groups first met in `batch` to `plan`, skipping members of groups already
    /// logged or planned.
    fn plan_batch(&mut self, batch: Vec<Slot<P>>, state: &mut Restart, plan: &mut Vec<Planned>) {
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
            let own = self.lane.take_own_commit(xid);
            plan.push(Planned {
                xid,
                low: slot.sequence,
                own: own.is_some(),
                // Met first at the lowest row this process inserted: no row of the
                // transaction lies below it, and none was added after the commit's insert.
                members: own.filter(|members| members.first() == Some(&slot.sequence)),
            });
        }
        self.promise(plan);
    }

    /// Computes the positions of the plan's groups past those already promised, while each
    /// group's members are known, and hands them to this process's listeners
    /// ([`promised`](super::promised)): the append, this sequencer's or a peer's, gives them
    /// the same positions.
    ///
    /// Promises are made whether or not a listener takes them now (one may open before the
    /// append lands); each costs a map entry until the append settles it.
    fn promise(&mut self, plan: &[Planned]) {
        if !self.promises {
            return;
        }
        let Some(mut next) = self.chain.next else {
            return;
        };
        let mut entries = Vec::new();
        for group in plan.iter().skip(self.chain.groups) {
            let Some(members) = &group.members else {
                self.chain.next = None;
                break;
            };
            for (index, &sequence) in members.iter().enumerate() {
                next += 1;
                entries.push(LogEntry {
                    commit_seq: next,
                    sequence,
                    group_last: index + 1 == members.len(),
                });
            }
            self.chain.groups += 1;
        }
        if self.chain.next.is_some() {
            self.chain.next = Some(next);
        }
        if !entries.is_empty() {
            self.commit.promise(&entries);
        }
    }

    /// Starts the plan's positions again at the head (after an append, a peer's, or a restart
    /// changed the plan), and promises what is known of it.
    fn promise_again(&mut self, state: &Restart, plan: &[Planned]) {
        self.chain = Chain {
            groups: 0,
            next: Some(state.head),
        };
        self.promise(plan);
    }

    async fn restart(
        &mut self,
        state: &mut Restart,
        reader: &mut LaneReader<P>,
        plan: &mut Vec<Planned>,
    ) -> Result<()> {
        *state = store::restart(&self.pool).await?;
        plan.clear();
        self.take_in(state).await?;
        reader.seek(state.cursor);
        self.promise_again(state, plan);
        Ok(())
    }

    /// Publishes the head a restart read. Below one this process saw, or on a newer server
    /// history that began at or below it, the positions this process saw are checked against
    /// the database ([`went_back`](super::went_back)): one whose event is gone was lost with
    /// its transaction (a failover to a standby that had not received it), and the rewind is
    /// reported at once; after a crash that lost appends the events are there, and are
    /// appended again to the same positions ([`WentBack::check_reappended`] checks it).
    ///
    /// [`WentBack::check_reappended`]: super::went_back::WentBack::check_reappended
    async fn take_in(&self, state: &Restart) -> Result<()> {
        self.commit.note_server(state.server);
        self.commit.publish_head(state.head);
        self.commit.settle_promised(&[], state.head);
        if self.commit.went_back.pending() {
            self.commit.went_back.check(&self.pool).await?;
        }
        Ok(())
    }

    /// Appends `plan` (groups up to the reader's position) under the CAS. On a refusal,
    /// continues from what the peer appended: `plan` keeps only the groups the peer did not
    /// log, to be appended on the peer's cursor.
    ///
    /// While the append runs, with a listener here that takes promises, the reader goes on
    /// reading (on the lane's own connection when it reads the table), and what it reads is
    /// planned, and promised where its positions are known ([`Self::promise`]), at once: a
    /// commit that lands during an append reaches the listener without waiting for it, and
    /// goes into the next append. Without such a listener, only a batch already waiting when
    /// the append starts is read meanwhile (a fold catching up on a backlog), or, if that read
    /// has not come back by then, after the append's entries are published: the commit lane
    /// never waits for a read. A read still waiting when the append ends is dropped (cancel
    /// safe: the reader's position moves only when slots are returned). After a refusal the
    /// groups read meanwhile stay planned, behind the refused ones: the plan still holds every
    /// group up to the reader's position.
    async fn append_plan(
        &mut self,
        state: &mut Restart,
        reader: &mut LaneReader<P>,
        plan: &mut Vec<Planned>,
    ) -> Result<AppendPlan> {
        let covered = reader.position();
        let in_flight = std::mem::take(plan);
        // The promised part of the plan now counts from the groups read during the append; if
        // the append's groups were not all promised, none read meanwhile can be before it.
        if self.chain.groups < in_flight.len() {
            self.chain.next = None;
        }
        self.chain.groups = self.chain.groups.saturating_sub(in_flight.len());
        // With a listener taking promises, everything that commits during the append is read
        // and promised at once; without one, only a batch already waiting is read meanwhile
        // (one wake-up for the commits that land during the append, not one each).
        let mut listened = self.promises && self.commit.promised.listened();
        let mut waiting = !listened && reader.ready();
        let mut outcome = AppendPlan::default();
        let commit = Arc::clone(&self.commit);
        let appended = {
            let pool = self.pool.clone();
            let append = store::append(&pool, state.cursor, covered, &in_flight);
            tokio::pin!(append);
            loop {
                tokio::select! {
                    biased;
                    appended = &mut append => break appended,
                    // Bounded as an append's own reads are: an append stuck behind a lock does
                    // not let the plan (and its promises) grow with every commit meanwhile.
                    batch = reader.next_batch(),
                        if !outcome.stopped && (listened || waiting) && plan.len() < self.batch => {
                        waiting = false;
                        self.plan_read(batch, state, plan, &mut outcome)?;
                    }
                    // A listener opened during the append: read along from now on.
                    _ = commit.promised.arrived(), if self.promises && !listened => {
                        listened = commit.promised.listened();
                    }
                }
            }
        };
        if let Appended::Done(appended) = appended? {
            metrics::counter!(m::FOLD_APPENDS, "result" => "appended").increment(1);
            metrics::counter!(m::FOLD_EVENTS).increment(appended.len() as u64);
            metrics::counter!(m::FOLD_GROUPS).increment(in_flight.len() as u64);
            metrics::gauge!(m::FOLD_LAG).set(self.lane.frontier().saturating_sub(covered) as f64);
            record_appended(state, &in_flight, &appended, covered);
            let entries: Vec<LogEntry> = appended.into_iter().map(|a| a.entry).collect();
            let head = entries.last().map_or(state.head, |e| e.commit_seq);
            self.publish(state, head, &entries);
            self.promise_again(state, plan);
            if self.lane.peer_log.heard_within(PEERS_HEARD) {
                self.tell_peers(state);
            }
            if waiting {
                // Waiting when the append started: read now that the entries are out (the
                // commit lane never waits for a read).
                let batch = reader.next_batch().await;
                self.plan_read(batch, state, plan, &mut outcome)?;
            }
            return Ok(outcome);
        }
        // Refused: the groups read meanwhile follow the refused ones.
        let mut refused = in_flight;
        refused.append(plan);
        *plan = refused;
        metrics::counter!(m::FOLD_APPENDS, "result" => "refused").increment(1);
        // A peer folds too: leave it other processes' groups from now on.
        self.turns.lost();
        match store::catch_up(&self.pool, state.head).await? {
            Some(peer) => {
                // A peer folded on a promoted server past positions this process saw: they
                // are not appended again, so they are checked now.
                if self.commit.note_server(peer.server) {
                    self.commit.went_back.check(&self.pool).await?;
                }
                self.follow(state, reader, plan, peer);
            }
            None => self.restart(state, reader, plan).await?,
        }
        outcome.met = None;
        Ok(outcome)
    }

    /// Plans a batch read while an append ran (see [`Self::append_plan`]).
    fn plan_read(
        &mut self,
        batch: Option<Result<Vec<Slot<P>>>>,
        state: &mut Restart,
        plan: &mut Vec<Planned>,
        outcome: &mut AppendPlan,
    ) -> Result<()> {
        let Some(batch) = batch else {
            outcome.stopped = true;
            return Ok(());
        };
        let was_empty = plan.is_empty();
        self.plan_batch(batch?, state, plan);
        if was_empty && !plan.is_empty() {
            outcome.met = Some(Instant::now());
        }
        Ok(())
    }

    /// Takes in a peer's appends: its entries join the log cache (listeners here read them
    /// without a table read), its groups join the skip set, and the plan keeps only groups
    /// above the peer's cursor (every group whose first event is at or below it, the peer
    /// logged: the fold is the same function everywhere). Returns how many groups the peer
    /// appended, and how many of them were this process's.
    fn follow(
        &mut self,
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
                if self.lane.take_own_commit(*xid).is_some() || planned_own.contains(xid) {
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
        self.promise_again(state, plan);
        (groups, own)
    }

    fn publish(&self, state: &mut Restart, head: u64, entries: &[LogEntry]) {
        self.commit.went_back.check_reappended(entries);
        state.head = state.head.max(head);
        if let Ok(mut log) = self.commit.log.write() {
            log.extend(entries);
        }
        self.commit.publish_head(state.head);
        self.commit.settle_promised(entries, state.head);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statements_a_connection_runs_set_every_session_setting() {
        let statements: Vec<String> = SESSION
            .iter()
            .map(|(name, value)| format!("SET {name} = {value}"))
            .collect();
        assert_eq!(SET_SESSION, statements.join("; "));
    }
}
