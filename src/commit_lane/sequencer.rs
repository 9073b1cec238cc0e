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
//! When a plan's append starts, and how many groups the sequencer gathers for it, is the
//! [`pacing`] module's `Pacer`; who appends it, this sequencer or a peer it yields to, is
//! [`turns`](super::turns). The append itself and what is read during it are in `append`.
//!
//! Groups this process committed have known members, so their positions are known as soon as
//! every group planned before them is: the sequencer hands them to this process's listeners
//! as it plans them, before the append ([`promised`](super::promised), `promises`).
//!
//! [`CATCH_UP`]: super::sql::CATCH_UP
//! [`RESTART`]: super::sql::RESTART

use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use sqlx::PgPool;
use tokio::sync::watch;
use tokio::time::Instant;

mod append;
mod appended;
mod pacing;
mod peers;
mod promises;
mod session;

use super::store::{self, Planned, Restart};
use super::turns::{Step, Turns};
use super::{CommitShared, LogEntry};
use crate::config::OutboxConfig;
use crate::error::Result;
use crate::insert_lane::LaneShared;
use crate::insert_lane::cache::{Slot, SlotItem};
use crate::insert_lane::reader::LaneReader;
use crate::insert_lane::rows::ReadMode;
use crate::task::StopSignal;
use appended::foreign_row;
use pacing::Pacer;
pub(crate) use peers::Announcement;
use peers::PEERS_HEARD;
use promises::Chain;
pub(crate) use session::SESSION;

const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The skip set's mark for a group planned but not appended yet: no member is above it.
const PLANNED: u64 = u64::MAX;

pub(crate) struct Sequencer<P> {
    pool: PgPool,
    lane: Arc<LaneShared<P>>,
    commit: Arc<CommitShared>,
    stop: StopSignal,
    /// When the next append starts, and how many groups it gathers.
    pacer: Pacer,
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
}

/// What woke the fold while a plan's append was not due yet ([`Sequencer::wait`]).
enum Woken<P> {
    /// A batch read (`None`: the outbox stopped).
    Read(Option<Result<Vec<Slot<P>>>>),
    /// The plan's time came, a peer spoke, or someone may wait for the log now: look again.
    LookAgain,
}

impl<P> Sequencer<P>
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    /// A sequencer with `config`'s fold settings (`fold_batch`, `fold_interval`,
    /// `unwatched_append_spacing`: its [`Pacer`]'s; and `early_commit_listeners`).
    pub(crate) fn new(
        pool: PgPool,
        lane: Arc<LaneShared<P>>,
        commit: Arc<CommitShared>,
        stop: StopSignal,
        config: &OutboxConfig,
    ) -> Self {
        Self {
            pool: session::own_pool(&pool),
            lane,
            commit,
            stop,
            pacer: Pacer::new(config),
            turns: Turns::default(),
            announce: None,
            yielded_at: None,
            promises: config.early_commit_listeners,
            chain: Chain::default(),
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

    /// Folds until the outbox stops (`Ok`) or a statement fails (`Err`): reads the insert lane,
    /// plans the groups it meets, paces the plan (when its append may start, and whose turn it
    /// is), and appends it.
    async fn fold(&mut self) -> Result<()> {
        let mut state = store::restart(&self.pool).await?;
        self.take_in(&state).await?;
        let mut reader = LaneReader::new(
            Arc::clone(&self.lane),
            self.stop.clone(),
            ReadMode::Meta,
            state.cursor,
        )
        .with_limit(self.pacer.read_limit());
        // Groups planned but not yet appended, in log order.
        let mut plan: Vec<Planned> = Vec::new();
        self.promise_again(&state, &plan);
        self.pacer.start_over();
        loop {
            // Read. Act after every batch read rather than chasing the frontier: under a
            // steady stream the frontier moves while we read, and chasing it delayed appends by
            // milliseconds (p50 5 ms under 8 writers). A batch read is itself bounded (512
            // cached slots, a page, or the pacer's read limit), and events that commit during
            // an append go into the next one.
            let batch = if plan.is_empty() {
                self.turns.settled();
                reader.next_batch().await
            } else {
                // Pace: when the plan's append may start, then whose turn it is.
                let listened = self.commit.promised.listened();
                let pace = self
                    .pacer
                    .pace(plan.len(), listened, || self.watched(&plan));
                let (at, step) = self.turns.next_step(&plan, pace.at);
                if Instant::now() >= at {
                    // Append (or look at what the peer it yields to appended).
                    if self
                        .take_step(step, &mut state, &mut reader, &mut plan)
                        .await?
                    {
                        return Ok(());
                    }
                    continue;
                }
                match self
                    .wait(at, step, pace.gathering, &state, &mut reader)
                    .await
                {
                    Woken::Read(batch) => batch,
                    Woken::LookAgain => continue,
                }
            };
            let Some(batch) = batch else {
                self.flush(&state, &reader, &plan).await;
                return Ok(());
            };
            // Plan.
            let was_empty = plan.is_empty();
            self.plan_batch(batch?, &mut state, &mut plan);
            if was_empty && !plan.is_empty() {
                self.pacer.met(Instant::now());
            }
        }
    }

    /// Takes the plan's `step` now that it is due: appends the plan, or looks at what the peer
    /// it yields to appended. Returns whether the outbox stopped (having flushed the plan).
    async fn take_step(
        &mut self,
        step: Step,
        state: &mut Restart,
        reader: &mut LaneReader<P>,
        plan: &mut Vec<Planned>,
    ) -> Result<bool> {
        match step {
            Step::Append => {
                let started = Instant::now();
                let groups = plan.len();
                self.turns.settled();
                let outcome = self.append_plan(state, reader, plan).await?;
                let peers = self.lane.peer_log.heard_within(PEERS_HEARD);
                self.pacer.appended(started, Instant::now(), groups, peers);
                if outcome.stopped {
                    self.flush(state, reader, plan).await;
                    return Ok(true);
                }
                if let Some(met) = outcome.met
                    && !plan.is_empty()
                {
                    self.pacer.met(met);
                }
            }
            Step::AskPeer => {
                self.turns.asked();
                self.ask_peer(state, reader, plan).await?;
            }
        }
        Ok(false)
    }

    /// Waits, until `at` at most, for the next batch read; and for a peer's announcement when
    /// the next `step` is a look at the peers, and, while `gathering`, for anyone who starts
    /// waiting for the log (the pacer would not gather then).
    async fn wait(
        &mut self,
        at: Instant,
        step: Step,
        gathering: bool,
        state: &Restart,
        reader: &mut LaneReader<P>,
    ) -> Woken<P> {
        let peer_log = &self.lane.peer_log;
        tokio::select! {
            biased;
            batch = reader.next_batch() => Woken::Read(batch),
            _ = tokio::time::sleep_until(at) => Woken::LookAgain,
            _ = peer_log.wake.notified(), if step == Step::AskPeer => {
                if peer_log.head() > state.head {
                    self.turns.ask_now();
                }
                Woken::LookAgain
            }
            // Someone may wait for the log now: look again when the append is due.
            _ = self.commit.followed.notified(), if gathering => Woken::LookAgain,
            _ = self.lane.audience.changed.notified(), if gathering => Woken::LookAgain,
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
            || (self.commit.promised.listened() && self.chain.groups() < plan.len())
            || self.lane.audience.anyone()
    }

    /// Adds the groups first met in `batch` to `plan`, skipping members of groups already
    /// logged or planned.
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
