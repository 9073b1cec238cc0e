//! The subscription runner: claim the lease, read the lane from the stored position, handle
//! each unit (an event, a batch or a group) in a transaction that also checkpoints, retry,
//! and apply the exhaustion policy.
//!
//! ```text
//!            claim ok, active                 lease lost / reset / commit unknown
//!  Starting ───────────────────▶ Running ──────────────────────────────┐
//!     ▲  claim refused ▲    │ exhausted + Halt,         pause          │
//!     │                │    │ or below the retention floor             │
//!     │   ▼            │    ▼                             ▼            │
//!     │ Standby        │  Halted ── resume ──▶ Running   Paused ─ resume ─▶ Running
//!     └────────────────┴───────────────────────────────────────────────┘
//!  any state ── shutdown ──▶ Stopped (lease released)
//! ```
//!
//! This file is the state machine: the claim loop ([`Runner::run`]), processing from a
//! position, and taking units. The lease's statements are driven from `lease.rs`; one unit's
//! attempts (the handler and checkpoint transaction, retries, halt, dead letter) are
//! `attempt.rs`.

use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use sqlx::PgPool;
use tokio::sync::watch;
use tokio::time::Instant;
use uuid::Uuid;

use super::attempt::Outcome;
use super::config::{Batch, JobConfig, Ordering};
use super::source::{Item, Source};
use super::sql::{self, Stored};
use super::status::{RunStatus, SubscriptionState, SubscriptionStatus};
use super::subscriber::Subscriber;
use crate::commit_lane::CommitShared;
use crate::insert_lane::LaneShared;
use crate::position::Position;
use crate::task::StopSignal;
use crate::telemetry::metrics as m;

/// After a database error outside a handler, wait this long before trying again.
pub(super) const ERROR_BACKOFF: Duration = Duration::from_millis(200);

/// Why processing from a position ended.
pub(super) enum Flow {
    /// Claim again: the lease was lost, the row changed under us, or a commit's outcome is
    /// unknown. The stored row is the truth.
    Reclaim,
    Stop,
}

/// What a runner does after a failed read of its lane ([`read_failed`]).
pub(crate) enum ReadFailed {
    /// The subscription is halted (or another runner or an operator changed its row): claim
    /// again, which finds it halted and waits for an operator.
    Halted,
    /// Try again after a backoff.
    Retry,
}

/// A failed read of the lane of subscription (or relay) `name`, whose stored position is `at`.
/// Events below the retention floor ([`crate::Error::BelowRetentionFloor`]) are gone: nothing
/// will make them readable again, so retrying would loop for ever. The subscription halts
/// instead, with the error as its last error (`ordo subscriptions`, `ordo status`, its handle's
/// status), until an operator moves it to the floor (`ordo subscriptions reset`,
/// `ordo relay replay --from`) and resumes it. Any other error is retried. Serial and keyed
/// subscriptions and relays all end here.
pub(crate) async fn read_failed(
    pool: &PgPool,
    name: &str,
    owner: Uuid,
    error: &crate::Error,
    at: Position,
) -> ReadFailed {
    let crate::Error::BelowRetentionFloor { .. } = error else {
        tracing::warn!(%error, subscription = %name, "reading the lane failed");
        return ReadFailed::Retry;
    };
    let message = error.to_string();
    // Fenced by the lease and the position: a runner that lost either halts nothing.
    match sql::halt(pool, name, owner, 0, &message, at).await {
        Ok(true) => {
            tracing::error!(subscription = %name, %message, "halted below the retention floor: an operator moves it to the floor and resumes it");
            metrics::counter!(m::SUBSCRIPTION_HALTS, "subscription" => name.to_owned())
                .increment(1);
            ReadFailed::Halted
        }
        Ok(false) => {
            tracing::warn!(subscription = %name, %message, "read below the retention floor, but the row changed under this runner (lease or position): not halted; claiming again");
            ReadFailed::Halted
        }
        Err(halting) => {
            tracing::warn!(error = %halting, subscription = %name, %message, "halting below the retention floor failed; will try again");
            ReadFailed::Retry
        }
    }
}

/// How waiting for the lane's next items ended.
enum Waited {
    /// Items are buffered.
    Filled,
    /// Nothing yet; the lease was renewed on the way.
    Renewed,
    Done(Flow),
}

pub(crate) struct Runner<P, S> {
    pub(crate) pool: PgPool,
    pub(crate) lane: Arc<LaneShared<P>>,
    pub(crate) commit: Arc<CommitShared>,
    pub(crate) config: JobConfig,
    pub(crate) subscriber: Arc<S>,
    pub(crate) owner: Uuid,
    pub(crate) stop: StopSignal,
    pub(crate) status: watch::Sender<SubscriptionStatus>,
}

impl<P, S> Runner<P, S>
where
    P: DeserializeOwned + Send + Sync + 'static,
    S: Subscriber<P>,
{
    fn set_state(&self, state: SubscriptionState, row: Option<&Stored>) {
        self.status.send_modify(|status| {
            status.state = state;
            if let Some(row) = row {
                status.claimed(row);
            }
        });
    }

    pub(crate) async fn run(mut self) {
        loop {
            if self.stop.is_stopped() {
                break;
            }
            let flow = match self.claim().await {
                Ok(Some(row)) if row.status == RunStatus::Active => {
                    self.set_state(SubscriptionState::Running, Some(&row));
                    match self.config.keyed {
                        Some(keyed) => self.process_keyed(&row, keyed).await,
                        None => self.process_from(row.position, row.attempts).await,
                    }
                }
                Ok(Some(row)) => {
                    let state = if row.status == RunStatus::Halted {
                        SubscriptionState::Halted
                    } else {
                        SubscriptionState::Paused
                    };
                    self.set_state(state, Some(&row));
                    self.pause(self.renew_every()).await
                }
                Ok(None) => {
                    self.set_state(SubscriptionState::Standby, None);
                    self.pause(self.renew_every()).await
                }
                Err(error) => {
                    tracing::warn!(%error, subscription = %self.config.name, "claiming failed");
                    self.pause(ERROR_BACKOFF).await
                }
            };
            if matches!(flow, Flow::Stop) {
                break;
            }
        }
        self.release().await;
        self.set_state(SubscriptionState::Stopped, None);
    }

    pub(super) async fn pause(&mut self, wait: Duration) -> Flow {
        tokio::select! {
            biased;
            _ = self.stop.stopped() => Flow::Stop,
            _ = tokio::time::sleep(wait) => Flow::Reclaim,
        }
    }

    /// Handles units from `position` on until the lease is lost, the row changes, or a stop.
    /// `failed` attempts at the next unit are already stored (by an earlier runner): they count.
    async fn process_from(&mut self, mut position: Position, mut failed: u32) -> Flow {
        let mut source = Source::new(
            &self.lane,
            &self.commit,
            self.stop.clone(),
            position,
            self.config.types.clone(),
        );
        let mut renew_at = Instant::now() + self.renew_every();
        // Operators' dead-letter retries are looked for on claiming and every third of a lease.
        let mut retries_at = Instant::now();
        // Handles taken once, not a registry lookup (and a name clone) per unit.
        let name = self.config.name.clone();
        let handled = metrics::counter!(m::SUBSCRIPTION_EVENTS, "subscription" => name.clone());
        let lag = metrics::gauge!(m::SUBSCRIPTION_LAG, "subscription" => name);
        loop {
            // Events already buffered are not handled after a stop: shutdown waits for the
            // unit in hand only.
            if self.stop.is_stopped() {
                return Flow::Stop;
            }
            if Instant::now() >= retries_at {
                retries_at = Instant::now() + self.renew_every();
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
                    renew_at = Instant::now() + self.renew_every();
                    self.committed(next);
                }
                Outcome::Flow(flow) => return flow,
            }
        }
    }

    /// Makes the dead-letter retries operators asked for; false if the lease was lost.
    async fn redeliver(&self) -> bool {
        let done =
            super::dead_letters::redeliver(&self.pool, &self.config, self.owner, &*self.subscriber)
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
            _ = self.stop.stopped() => Waited::Done(Flow::Stop),
            filled = source.fill() => match filled {
                None => Waited::Done(Flow::Stop),
                Some(Ok(())) => Waited::Filled,
                Some(Err(error)) => {
                    match read_failed(&self.pool, &self.config.name, self.owner, &error, position).await {
                        ReadFailed::Halted => Waited::Done(Flow::Reclaim),
                        ReadFailed::Retry => Waited::Done(self.pause(ERROR_BACKOFF).await),
                    }
                }
            },
            _ = tokio::time::sleep_until(*renew_at) => {
                match self.renew().await {
                    Ok(Some(row)) if row.status == RunStatus::Active && row.position == position => {
                        *renew_at = Instant::now() + self.renew_every();
                        Waited::Renewed
                    }
                    // Lost, paused, halted or reset by an operator.
                    Ok(_) => Waited::Done(Flow::Reclaim),
                    Err(error) => {
                        tracing::warn!(%error, subscription = %self.config.name, "renewing the lease failed");
                        Waited::Done(self.pause(ERROR_BACKOFF).await)
                    }
                }
            }
        }
    }

    /// The status after a checkpoint to `next` (which also extended the lease).
    fn committed(&self, next: Position) {
        let lease_expires_at = self.lease_expiry();
        self.status.send_modify(|status| {
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
