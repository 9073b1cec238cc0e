//! Stopping subscription runners: bounded, in-flight handlers finished or rolled back, and no
//! lease of this process left to expire.
//!
//! A runner stops after the unit in hand: its handler's transaction commits (with the
//! checkpoint) or rolls back, then `run` releases the lease. The wait is bounded by the
//! subscription's lease: a handler that outlives it has most likely lost the subscription
//! already (another process may claim an expired lease, and the server ends a handler's
//! transaction left idle that long), so waiting longer saves nothing, while aborting sooner
//! would roll back work that could still commit. A runner still running after the bound is
//! aborted, which drops (rolls back) its handler's transaction. Either way the lease is then
//! released from the outside, by owner, so that a standby elsewhere takes over at its next
//! claim instead of after the lease.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::watch;
use uuid::Uuid;

use super::sql;
use super::status::{SubscriptionState, SubscriptionStatus};
use crate::task::Supervised;

/// A subscription's runner, held by its [`SubscriptionHandle`](super::SubscriptionHandle) and
/// by its outbox's [`Runners`].
pub(crate) struct Running {
    pub(crate) task: Supervised,
    pub(crate) pool: PgPool,
    pub(crate) name: String,
    /// The runner's lease owner id: what the release is fenced by.
    pub(crate) owner: Uuid,
    /// The subscription's lease: how long a stop waits for the handler in hand.
    pub(crate) grace: Duration,
    /// Held by the stop in progress and set once it is done, so that every caller of
    /// [`shutdown`](Self::shutdown) returns only after the lease is released.
    pub(crate) stopped: tokio::sync::Mutex<bool>,
}

impl Running {
    /// Asks the runner to stop after the unit in hand, without waiting.
    pub(crate) fn request_stop(&self) {
        self.task.request_stop();
    }

    /// Whether nothing is left to wait for: stopped by a shutdown, or ended on its own (its
    /// handle dropped) and released its lease as it did. False while a shutdown is under way.
    fn is_done(&self) -> bool {
        match self.stopped.try_lock() {
            Ok(stopped) => *stopped || self.task.is_finished(),
            Err(_) => false,
        }
    }

    /// Stops the runner (waiting for the handler in hand up to the lease, then aborting it) and
    /// makes sure its lease is released. Idempotent; concurrent callers all wait for the one
    /// stop.
    pub(crate) async fn shutdown(&self) {
        let mut stopped = self.stopped.lock().await;
        if *stopped {
            return;
        }
        self.task.stop(self.grace).await;
        // `run` released the lease as it ended, unless it was aborted, panicked or could not
        // reach the database: release again. Fenced by owner, so never another process's lease.
        // Bounded by the lease too: past it, the lease frees itself.
        match tokio::time::timeout(self.grace, release(&self.pool, &self.name, self.owner)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, subscription = %self.name, "releasing the lease failed; it expires by itself");
            }
            Err(_) => {
                tracing::warn!(subscription = %self.name, "releasing the lease timed out; it expires by itself");
            }
        }
        *stopped = true;
    }
}

/// Releases the lease `owner` holds on subscription `name`, if it still does.
async fn release(pool: &PgPool, name: &str, owner: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query(sql::RELEASE)
        .bind(name)
        .bind(owner)
        .execute(pool)
        .await?;
    Ok(())
}

/// Set to `Stopped` when the runner's future is dropped, whether it returned, panicked or was
/// aborted: a handle's status never shows a runner that is gone as running. It holds a sender
/// only as long as the runner lives, so the status channel still closes when the runner ends.
pub(crate) struct MarkStopped(pub(crate) watch::Sender<SubscriptionStatus>);

impl Drop for MarkStopped {
    fn drop(&mut self) {
        self.0.send_if_modified(|status| {
            let running = status.state != SubscriptionState::Stopped;
            status.state = SubscriptionState::Stopped;
            running
        });
    }
}

/// Every subscription runner an outbox started, stopped first when it shuts down.
pub(crate) struct Runners {
    state: Mutex<State>,
}

struct State {
    /// False once the outbox began shutting down: a runner started after that stops at once.
    open: bool,
    running: Vec<Arc<Running>>,
}

impl Runners {
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::new(State {
                open: true,
                running: Vec::new(),
            }),
        }
    }

    /// Takes `running` into the outbox's care; after the outbox's shutdown began, also stops it.
    pub(crate) fn add(&self, running: &Arc<Running>) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        // Runners whose handle shut them down, or that stopped on their own, need no more care.
        state.running.retain(|running| !running.is_done());
        state.running.push(Arc::clone(running));
        if !state.open {
            running.request_stop();
        }
    }

    /// Stops every runner at once and waits until each has ended and released its lease (see
    /// [`Running::shutdown`]): at most about two leases of the longest. Idempotent.
    pub(crate) async fn shutdown(&self) {
        let running = match self.state.lock() {
            Ok(mut state) => {
                state.open = false;
                state.running.clone()
            }
            Err(_) => return,
        };
        for one in &running {
            one.request_stop();
        }
        futures::future::join_all(running.iter().map(|one| one.shutdown())).await;
    }
}

impl Drop for Runners {
    fn drop(&mut self) {
        // The outbox was dropped without `shutdown`: ask every runner to stop, without waiting
        // (as its lanes are asked).
        if let Ok(state) = self.state.lock() {
            for running in &state.running {
                running.request_stop();
            }
        }
    }
}
