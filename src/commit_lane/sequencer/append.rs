//! The append of a plan: one statement under the compare-and-set, during which the sequencer
//! may read and plan on; and the last append of a stopping outbox.

use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio::time::Instant;

use super::Sequencer;
use crate::commit_lane::store::{self, Appended, Planned, Restart};
use crate::error::Result;
use crate::insert_lane::cache::Slot;
use crate::insert_lane::reader::LaneReader;
use crate::telemetry::metrics as m;

/// How long a stopping sequencer tries to append what it planned ([`Sequencer::flush`]).
const FLUSH_PATIENCE: Duration = Duration::from_secs(1);

/// What happened besides an append ([`Sequencer::append_plan`]).
#[derive(Default)]
pub(super) struct AppendPlan {
    /// The outbox stopped while the append ran.
    pub(super) stopped: bool,
    /// When the plan, emptied by the append, met its first group again during it.
    pub(super) met: Option<Instant>,
}

impl<P> Sequencer<P>
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    /// Appends `plan` (groups up to the reader's position) under the CAS. On a refusal,
    /// continues from what the peer appended: `plan` keeps only the groups the peer did not
    /// log, to be appended on the peer's cursor ([`Self::refused`]).
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
    pub(super) async fn append_plan(
        &mut self,
        state: &mut Restart,
        reader: &mut LaneReader<P>,
        plan: &mut Vec<Planned>,
    ) -> Result<AppendPlan> {
        let covered = reader.position();
        let in_flight = std::mem::take(plan);
        self.chain.appending(in_flight.len());
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
                    // Bounded by a full plan: an append stuck behind a lock does not let the
                    // plan (and its promises) grow with every commit meanwhile.
                    batch = reader.next_batch(),
                        if !outcome.stopped && (listened || waiting)
                            && !self.pacer.is_full(plan.len()) => {
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
        match appended? {
            Appended::Done(appended) => {
                self.took(state, &in_flight, appended, covered, plan);
                if waiting {
                    // Waiting when the append started: read now that the entries are out (the
                    // commit lane never waits for a read).
                    let batch = reader.next_batch().await;
                    self.plan_read(batch, state, plan, &mut outcome)?;
                }
            }
            Appended::Refused => {
                self.refused(state, reader, plan, in_flight).await?;
                outcome.met = None;
            }
        }
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

    /// The outbox stops: appends what is planned, once, so that the log a stopped process
    /// leaves covers every group it met (the next fold would append the same, later). Not
    /// after a rewind (the plan was read from a server that went back), and given up after
    /// [`FLUSH_PATIENCE`] (the state row locked, the server gone): nothing depends on it.
    pub(super) async fn flush(&self, state: &Restart, reader: &LaneReader<P>, plan: &[Planned]) {
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
}
