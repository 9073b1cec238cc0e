//! The claim loop every consumer runs, and the lease it holds while it works.
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
//! [`run`] claims the lease when it is free, expired or already this owner's, hands the row to
//! the [`Executor`] (a serial or keyed subscription, a relay) until the lease is lost, the row
//! changes or a stop, and releases the lease on the way out so a standby takes over at once
//! rather than when it expires. While it waits (standby, paused, halted) it asks again every
//! [`Executor::renew_every`]. Why each statement reads as it does is on the statements
//! (`sql.rs`): the claim skips a locked row, and a handler's transaction is bounded by the
//! lease on the server.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio::sync::watch;
use tokio::time::Instant;
use uuid::Uuid;

use super::Kind;
use super::progress::{self, Known};
use super::sql::{self, Stored};
use super::status::{RunStatus, SubscriptionState, SubscriptionStatus};
use super::tenure::Tenure;
use crate::position::{Ordering, Position};
use crate::task::StopSignal;
use crate::telemetry::metrics as m;

/// After a database error outside a handler, or an unreachable sink, wait this long before
/// trying again.
pub(crate) const ERROR_BACKOFF: Duration = Duration::from_millis(200);

/// Why processing from a position ended.
pub(crate) enum Flow {
    /// Claim again: the lease was lost, the row changed under us, or a commit's outcome is
    /// unknown. The stored row is the truth.
    Reclaim,
    Stop,
}

/// What a runner does after a failed read of its lane ([`Consumer::read_failed`]).
pub(crate) enum ReadFailed {
    /// The consumer is halted (or another runner or an operator changed its row): claim
    /// again, which finds it halted and waits for an operator.
    Halted,
    /// Try again after a backoff.
    Retry,
}

/// What runs a claimed row: a serial or keyed subscription, or a relay.
pub(crate) trait Executor: Send {
    /// The core this executor runs on.
    fn consumer(&mut self) -> &mut Consumer;

    /// How often the lease is renewed, and a waiting runner asks for it again: a third of it
    /// ([`Consumer::renew_every`]), or sooner (a relay's, so a batch deadline fits).
    fn renew_every(&self) -> Duration;

    /// Runs from the claimed, active `row` until the lease is lost, the row changes, or a stop.
    fn process(&mut self, row: Stored) -> impl Future<Output = Flow> + Send;
}

/// A consumer runner's identity, lease and status: what the claim loop needs, and what every
/// statement an executor runs is fenced by (the row's name and this owner).
pub(crate) struct Consumer {
    pub(crate) pool: PgPool,
    pub(crate) name: String,
    pub(crate) ordering: Ordering,
    pub(crate) lease: Duration,
    pub(crate) kind: Kind,
    pub(crate) owner: Uuid,
    pub(crate) stop: StopSignal,
    pub(crate) status: watch::Sender<SubscriptionStatus>,
    /// Until when this owner certainly holds the lease (`tenure.rs`).
    pub(crate) tenure: Tenure,
}

/// Claims, runs and releases until a stop (see the module's diagram).
pub(crate) async fn run<E: Executor>(mut executor: E) {
    loop {
        if executor.consumer().stop.is_stopped() {
            break;
        }
        let claimed = executor.consumer().claim().await;
        let idle = executor.renew_every();
        let flow = match claimed {
            Ok(Some(row)) if row.status == RunStatus::Active => {
                executor
                    .consumer()
                    .set_state(SubscriptionState::Running, Some(&row));
                executor.process(row).await
            }
            // Paused by an operator, or halted (a handler's exhaustion, the retention floor):
            // it waits for an operator's resume, its row's last error in the status.
            Ok(Some(row)) => {
                let core = executor.consumer();
                core.set_state(SubscriptionState::stored(row.status, true), Some(&row));
                core.pause(idle).await
            }
            Ok(None) => {
                let core = executor.consumer();
                core.set_state(SubscriptionState::Standby, None);
                core.pause(idle).await
            }
            Err(error) => {
                let core = executor.consumer();
                tracing::warn!(%error, subscription = %core.name, kind = core.kind.as_str(), "claiming failed");
                core.pause(ERROR_BACKOFF).await
            }
        };
        if matches!(flow, Flow::Stop) {
            let core = executor.consumer();
            if core.stop.is_stopped() {
                break;
            }
            // Its reads ended without a stop of its own: the lanes stopped under it (the
            // outbox starts new ones after a rewind). Claim again, on the lanes current then,
            // from the position stored on the server.
            tracing::info!(subscription = %core.name, kind = core.kind.as_str(), "the outbox's lanes stopped under this runner; claiming again");
            if matches!(core.pause(ERROR_BACKOFF).await, Flow::Stop) {
                break;
            }
        }
    }
    let core = executor.consumer();
    core.release().await;
    core.set_state(SubscriptionState::Stopped, None);
}

impl Consumer {
    /// A third of the lease, so two renewals can fail before it runs out.
    pub(crate) fn renew_every(&self) -> Duration {
        self.lease / 3
    }

    /// Waits `wait`, or less if the runner is told to stop.
    pub(crate) async fn pause(&mut self, wait: Duration) -> Flow {
        tokio::select! {
            biased;
            _ = self.stop.stopped() => Flow::Stop,
            _ = tokio::time::sleep(wait) => Flow::Reclaim,
        }
    }

    /// The state in the handle's status, with what the claimed `row` says.
    pub(crate) fn set_state(&self, state: SubscriptionState, row: Option<&Stored>) {
        self.status.send_modify(|status| {
            status.state = state;
            if let Some(row) = row {
                status.claimed(row);
            }
        });
    }

    /// Takes the lease if free, expired or ours; the row, or `None` if another runner holds it.
    pub(crate) async fn claim(&mut self) -> Result<Option<Stored>, sqlx::Error> {
        self.tenure.lost();
        self.lease_statement(sql::CLAIM).await
    }

    /// Extends a lease we hold; the row, or `None` if we lost it.
    pub(crate) async fn renew(&mut self) -> Result<Option<Stored>, sqlx::Error> {
        self.lease_statement(sql::RENEW).await
    }

    /// [`CLAIM`](sql::CLAIM) or [`RENEW`](sql::RENEW), with what came back noted.
    async fn lease_statement(
        &mut self,
        statement: &'static str,
    ) -> Result<Option<Stored>, sqlx::Error> {
        // Before the statement is sent: the lease it grants runs from no earlier.
        let asked = Instant::now();
        let (pool, name) = (&self.pool, &self.name);
        let row =
            sql::lease_statement(statement, pool, name, self.ordering, self.owner, self.lease)
                .await?;
        self.noted(asked, row.is_some());
        Ok(row)
    }

    /// Gives the lease up; on failure it expires by itself.
    pub(crate) async fn release(&mut self) {
        if let Err(error) = sql::release(&self.pool, &self.name, self.owner).await {
            tracing::warn!(%error, subscription = %self.name, "releasing the lease failed; it expires by itself");
        }
        self.tenure.lost();
        self.note_lease(false);
    }

    /// When a lease taken or extended now runs out, by this machine's clock (for the status
    /// only: the fence is the database's clock).
    pub(crate) fn lease_expiry(&self) -> Option<DateTime<Utc>> {
        chrono::Duration::from_std(self.lease)
            .ok()
            .map(|lease| Utc::now() + lease)
    }

    /// A claim or renewal asked at `asked` came back: whether we hold the lease, in the
    /// tenure and the status.
    fn noted(&mut self, asked: Instant, held: bool) {
        if held {
            self.tenure.granted(asked, self.lease);
        } else {
            self.tenure.lost();
        }
        self.note_lease(held);
    }

    /// Records in the status whether this runner holds the lease, and until when.
    fn note_lease(&self, held: bool) {
        let (owner, expires_at) = if held {
            (Some(self.owner), self.lease_expiry())
        } else {
            (None, None)
        };
        self.status.send_modify(|status| {
            status.lease_owner = owner;
            status.lease_expires_at = expires_at;
        });
    }

    /// What the stored progress says above the watermark `at`, and the stuck keys (a keyed
    /// executor's first read after a claim); a failure is logged and paused on, and the flow
    /// says what next.
    pub(crate) async fn progress_above(
        &mut self,
        at: Position,
    ) -> Result<(HashMap<u64, Known>, super::backlog::Backlogs), Flow> {
        let loaded = async {
            let known = progress::load(&self.pool, &self.name, at).await?;
            let backlogs = super::backlog::Backlogs::load(&self.pool, &self.name).await?;
            Ok::<_, sqlx::Error>((known, backlogs))
        };
        match loaded.await {
            Ok(loaded) => Ok(loaded),
            Err(error) => {
                tracing::warn!(%error, subscription = %self.name, kind = self.kind.as_str(), "reading the stored progress failed");
                Err(self.pause(ERROR_BACKOFF).await)
            }
        }
    }

    /// A failed read of the lane at stored position `at`. Events below the retention floor
    /// ([`crate::Error::BelowRetentionFloor`]) are gone: nothing will make them readable again,
    /// so retrying would loop for ever. The consumer halts instead, with the error as its last
    /// error (`ordo subscriptions`, `ordo status`, its handle's status), until an operator
    /// moves it to the floor (`ordo subscriptions reset`, `ordo relay replay --from`) and
    /// resumes it. Any other error is retried. Serial and keyed subscriptions and relays all
    /// end here.
    pub(crate) async fn read_failed(&self, error: &crate::Error, at: Position) -> ReadFailed {
        let name = &self.name;
        let crate::Error::BelowRetentionFloor { .. } = error else {
            tracing::warn!(%error, subscription = %name, "reading the lane failed");
            return ReadFailed::Retry;
        };
        let message = error.to_string();
        // Fenced by the lease and the position: a runner that lost either halts nothing.
        match sql::halt(&self.pool, name, self.owner, 0, &message, at).await {
            Ok(true) => {
                tracing::error!(subscription = %name, %message, "halted below the retention floor: an operator moves it to the floor and resumes it");
                let halts = match self.kind {
                    Kind::Subscription => {
                        metrics::counter!(m::SUBSCRIPTION_HALTS, "subscription" => name.clone())
                    }
                    Kind::Relay => metrics::counter!(m::RELAY_HALTS, "relay" => name.clone()),
                };
                halts.increment(1);
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
}
