//! The serial subscription runner, an executor on the consumer core (`consumer/claim.rs` claims
//! and releases its lease): read the lane from the stored position, handle each unit (an
//! event, a batch or a group) in a transaction that also checkpoints, retry, and apply the
//! exhaustion policy. One unit's attempts (the handler and checkpoint transaction, retries,
//! halt, dead letter) are `attempt.rs`; keyed subscriptions run `keyed/` instead.

use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio::time::Instant;

use super::attempt::Outcome;
use super::config::{Batch, JobConfig, Ordering};
use super::subscriber::Subscriber;
use crate::commit_lane::CommitShared;
use crate::consumer::source::{Item, Source};
use crate::consumer::sql::Stored;
use crate::consumer::{
    Consumer, CurrentLanes, ERROR_BACKOFF, Executor, Flow, ReadFailed, RunStatus, SubscriptionState,
};
use crate::insert_lane::LaneShared;
use crate::position::Position;
use crate::task::StopSignal;
use crate::telemetry::metrics as m;

/// How waiting for the lane's next items ended.
enum Waited {
    /// Items are buffered.
    Filled,
    /// Nothing yet; the lease was renewed on the way.
    Renewed,
    Done(Flow),
}

pub(crate) struct Runner<P, S> {
    pub(crate) core: Consumer,
    /// The outbox's lanes now, taken at each claim into `lane` and `commit`.
    pub(crate) current: Arc<CurrentLanes<P>>,
    pub(crate) lane: Arc<LaneShared<P>>,
    pub(crate) commit: Arc<CommitShared>,
    /// Set when `lane` and `commit` stop: this claim's reads end.
    pub(crate) lanes_stop: StopSignal,
    pub(crate) config: JobConfig,
    pub(crate) subscriber: Arc<S>,
}

impl<P, S> Executor for Runner<P, S>
where
    P: DeserializeOwned + Send + Sync + 'static,
    S: Subscriber<P>,
{
    fn consumer(&mut self) -> &mut Consumer {
        &mut self.core
    }

    fn renew_every(&self) -> Duration {
        self.core.renew_every()
    }

    async fn process(&mut self, row: Stored) -> Flow {
        let lanes = self.current.get();
        self.lane = lanes.lane;
        self.commit = lanes.commit;
        self.lanes_stop = lanes.stop;
        match self.config.keyed {
            Some(keyed) => self.process_keyed(&row, keyed).await,
            None => self.process_from(row.position, row.attempts).await,
        }
    }
}

impl<P, S> Runner<P, S>
where
    P: DeserializeOwned + Send + Sync + 'static,
    S: Subscriber<P>,
{
    /// Handles units from `position` on until the lease is lost, the row changes, or a stop.
    /// `failed` attempts at the next unit are already stored (by an earlier runner): they count.
    async fn process_from(&mut self, mut position: Position, mut failed: u32) -> Flow {
        let mut source = Source::new(
            &self.lane,
            &self.commit,
            self.core.stop.clone().or(&self.lanes_stop),
            position,
            self.config.types.clone(),
        );
        let mut renew_at = Instant::now() + self.core.renew_every();
        // Operators' dead-letter retries are looked for on claiming and every third of a lease.
        let mut retries_at = Instant::now();
        // Handles taken once, not a registry lookup (and a name clone) per unit.
        let name = self.config.name.clone();
        let handled = metrics::counter!(m::SUBSCRIPTION_EVENTS, "subscription" => name.clone());
        let lag = metrics::gauge!(m::SUBSCRIPTION_LAG, "subscription" => name);
        loop {
            // Events already buffered are not handled after a stop: shutdown waits for the
            // unit in hand only.
            if self.core.stop.is_stopped() {
                return Flow::Stop;
            }
            if Instant::now() >= retries_at {
                retries_at = Instant::now() + self.core.renew_every();
                if !self.redeliver().await {
                    return Flow::Reclaim;
                }
            }
            if !source.has_buffered() {
                match self
                    .wait_for_items(&mut source, position, &mut renew_at)
                    .await
                {
                    Waited::Filled => {}
                    Waited::Renewed => continue,
                    Waited::Done(flow) => return flow,
                }
            }
            let Some(unit) = self.take_unit(&mut source).await else {
                return Flow::Stop;
            };
            match self
                .handle_unit(&unit, position, std::mem::take(&mut failed))
                .await
            {
                Outcome::Committed(next) => {
                    handled.increment(unit.iter().filter(|item| !item.skipped).count() as u64);
                    let head = match self.config.ordering {
                        Ordering::Insert => self.lane.frontier(),
                        Ordering::Commit => self.commit.head(),
                    };
                    lag.set(head.saturating_sub(next.get()) as f64);
                    position = next;
                    renew_at = Instant::now() + self.core.renew_every();
                    self.committed(next);
                }
                Outcome::Flow(flow) => return flow,
            }
        }
    }

    /// Makes the dead-letter retries operators asked for; false if the lease was lost.
    async fn redeliver(&self) -> bool {
        let done = super::dead_letters::redeliver(
            &self.core.pool,
            &self.config,
            self.core.owner,
            &*self.subscriber,
        )
        .await;
        match done {
            Ok(held) => held,
            Err(error) => {
                tracing::warn!(%error, subscription = %self.config.name, "retrying dead letters failed");
                true
            }
        }
    }

    /// Waits for the lane's next items, renewing the lease when it is due while none come.
    async fn wait_for_items(
        &mut self,
        source: &mut Source<P>,
        position: Position,
        renew_at: &mut Instant,
    ) -> Waited {
        tokio::select! {
            biased;
            _ = self.core.stop.stopped() => Waited::Done(Flow::Stop),
            filled = source.fill() => match filled {
                None => Waited::Done(Flow::Stop),
                Some(Ok(())) => Waited::Filled,
                Some(Err(error)) => {
                    match self.core.read_failed(&error, position).await {
                        ReadFailed::Halted => Waited::Done(Flow::Reclaim),
                        ReadFailed::Retry => Waited::Done(self.core.pause(ERROR_BACKOFF).await),
                    }
                }
            },
            _ = tokio::time::sleep_until(*renew_at) => {
                match self.core.renew().await {
                    Ok(Some(row)) if row.status == RunStatus::Active && row.position == position => {
                        *renew_at = Instant::now() + self.core.renew_every();
                        Waited::Renewed
                    }
                    // Lost, paused, halted or reset by an operator.
                    Ok(_) => Waited::Done(Flow::Reclaim),
                    Err(error) => {
                        tracing::warn!(%error, subscription = %self.config.name, "renewing the lease failed");
                        Waited::Done(self.core.pause(ERROR_BACKOFF).await)
                    }
                }
            }
        }
    }

    /// The status after a checkpoint to `next` (which also extended the lease).
    fn committed(&self, next: Position) {
        let lease_expires_at = self.core.lease_expiry();
        self.core.status.send_modify(|status| {
            status.position = next;
            status.attempts = 0;
            status.last_error = None;
            status.state = SubscriptionState::Running;
            status.lease_expires_at = lease_expires_at;
        });
    }

    /// The next unit per the batch mode: one event, up to N ready events, or a whole group.
    async fn take_unit(&self, source: &mut Source<P>) -> Option<Vec<Item<P>>> {
        let mut unit = Vec::new();
        match self.config.batch {
            // Skipped events ride along with the next handled one (one checkpoint covers
            // them), or form a unit of their own when nothing handled is ready.
            Batch::PerEvent | Batch::UpTo(_) => {
                let limit = match self.config.batch {
                    Batch::UpTo(limit) => limit,
                    _ => 1,
                };
                let mut handled = 0;
                while handled < limit {
                    match source.pop() {
                        Some(item) => {
                            handled += usize::from(!item.skipped);
                            unit.push(item);
                        }
                        None => break,
                    }
                }
            }
            Batch::Groups => loop {
                if !source.has_buffered() {
                    // The rest of a group is already in the log: groups are appended whole.
                    match source.fill().await? {
                        Ok(()) => {}
                        Err(error) => {
                            tracing::warn!(%error, "reading the rest of a group failed");
                            return None;
                        }
                    }
                }
                let Some(item) = source.pop() else { continue };
                let boundary = item.boundary;
                unit.push(item);
                if boundary {
                    break;
                }
            },
        }
        debug_assert!(!unit.is_empty() || source.peek().is_none());
        Some(unit)
    }
}
