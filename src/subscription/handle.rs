//! [`SubscriptionHandle`] and the status it reports.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::config::Ordering;
use super::shutdown::Running;
use crate::commit_lane::CommitShared;
use crate::position::{CommitSequence, EventSequence};

/// A subscription's position, in the unit of its lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Position {
    /// On the insert lane: every event at or below it has been handled.
    Insert(EventSequence),
    /// On the commit lane: every log entry at or below it has been handled.
    Commit(CommitSequence),
}

impl Position {
    pub(crate) fn new(ordering: Ordering, value: u64) -> Self {
        match ordering {
            Ordering::Insert => Self::Insert(EventSequence::new(value)),
            Ordering::Commit => Self::Commit(CommitSequence::new(value)),
        }
    }

    /// The raw position.
    pub fn get(self) -> u64 {
        match self {
            Self::Insert(position) => position.get(),
            Self::Commit(position) => position.get(),
        }
    }
}

/// What a subscription's runner is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SubscriptionState {
    /// Claiming the subscription.
    Starting,
    /// Holding the lease and handling events (or waiting for them).
    Running,
    /// Another process holds the lease; this runner takes over if it expires.
    Standby,
    /// An operator paused it (`ordo subscriptions pause`).
    Paused,
    /// Halted on an event that exhausted its attempts; resumable.
    Halted,
    /// Shut down.
    Stopped,
}

/// A snapshot of a subscription as its runner sees it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SubscriptionStatus {
    /// The subscription's name.
    pub name: String,
    /// Its lane.
    pub ordering: Ordering,
    /// Everything at or below this position has been handled and checkpointed.
    pub position: Position,
    /// What the runner is doing.
    pub state: SubscriptionState,
    /// Failed attempts on the current event.
    pub attempts: u32,
    /// The last handler error, if the current event has failed.
    pub last_error: Option<String>,
    /// Positions between the checkpoint and the lane's head in this process (for the insert
    /// lane, placeholders count).
    pub lag: u64,
}

/// The handle returned by [`Outbox::subscribe`](crate::Outbox::subscribe).
///
/// Dropping it asks the runner to stop after the event in hand, as
/// [`shutdown`](Self::shutdown) does, without waiting; so does the outbox's shutdown. To run a
/// subscription for the outbox's whole life without keeping the handle, call
/// [`detach`](Self::detach).
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// # use std::sync::Arc;
/// # struct S;
/// # impl ordo::Subscriber<serde_json::Value> for S {
/// #     async fn handle(&self, _: &mut sqlx::PgConnection, _: &ordo::Delivery<serde_json::Value>)
/// #         -> Result<(), ordo::HandlerError> { Ok(()) }
/// # }
/// # async fn run(outbox: ordo::Outbox<serde_json::Value>) -> ordo::Result<()> {
/// // Does not compile: the handle would be dropped at once, stopping the subscription.
/// outbox.subscribe(ordo::JobConfig::new("projection"), S).await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping a SubscriptionHandle stops its subscription: keep it, or call .detach() to run it until the Outbox shuts down"]
pub struct SubscriptionHandle {
    pub(crate) running: Arc<Running>,
    pub(crate) status: watch::Receiver<SubscriptionStatus>,
    pub(crate) heads: Heads,
    pub(crate) detached: bool,
}

/// Where each lane's head is, for the lag.
pub(crate) struct Heads {
    pub(crate) insert: watch::Receiver<u64>,
    pub(crate) commit: Arc<CommitShared>,
}

impl SubscriptionHandle {
    /// The subscription's current status, with its lag against this process's view of the
    /// lane head.
    pub fn status(&self) -> SubscriptionStatus {
        self.with_lag(&self.status.borrow())
    }

    /// `status` with its lag against this process's view of the lane head.
    fn with_lag(&self, status: &SubscriptionStatus) -> SubscriptionStatus {
        let mut status = status.clone();
        let head = match status.ordering {
            Ordering::Insert => *self.heads.insert.borrow(),
            Ordering::Commit => self.heads.commit.head(),
        };
        status.lag = head.saturating_sub(status.position.get());
        status
    }

    /// Waits until the status (as [`status`](Self::status) reports it, lag included)
    /// satisfies `condition`, or `limit` passes; returns the last status seen and whether the
    /// condition held. The condition is evaluated again whenever the runner's state or the
    /// lane's head changes.
    ///
    /// To wait for what a writer committed, prefer
    /// [`Outbox::wait_for_subscription`](crate::Outbox::wait_for_subscription): it is keyed by
    /// the sequences `commit()` returned and works from any process.
    pub async fn wait_for(
        &self,
        limit: Duration,
        mut condition: impl FnMut(&SubscriptionStatus) -> bool,
    ) -> (SubscriptionStatus, bool) {
        let mut changes = self.status.clone();
        let mut insert_head = self.heads.insert.clone();
        let mut commit_head = self.heads.commit.head.subscribe();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let current = self.with_lag(&changes.borrow_and_update());
            if condition(&current) {
                return (current, true);
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { break },
                _ = insert_head.changed() => {}
                _ = commit_head.changed() => {}
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        (self.status(), false)
    }

    /// Stops the runner gracefully: the unit in hand is finished and checkpointed, the lease
    /// is released, and the runner exits. Returns once the lease is released. Idempotent.
    ///
    /// The wait for the handler in hand is bounded by the subscription's
    /// [lease](crate::JobConfig::lease): past it another process may take the subscription
    /// over anyway. A handler still running then is aborted (its transaction rolls back and the
    /// unit is handled again by whoever runs the subscription next), and the lease is released
    /// all the same.
    pub async fn shutdown(&self) {
        self.running.shutdown().await;
    }
}

impl SubscriptionHandle {
    /// Lets the subscription run without this handle, until the [`Outbox`](crate::Outbox)
    /// shuts down (which stops it as [`shutdown`](Self::shutdown) would). Its progress stays
    /// visible in `ordo status` and `ordo subscriptions`.
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # struct Projection;
    /// # impl ordo::Subscriber<serde_json::Value> for Projection {
    /// #     async fn handle(&self, _: &mut sqlx::PgConnection, _: &ordo::Delivery<serde_json::Value>)
    /// #         -> Result<(), ordo::HandlerError> { Ok(()) }
    /// # }
    /// # async fn run(outbox: ordo::Outbox<serde_json::Value>) -> ordo::Result<()> {
    /// outbox
    ///     .subscribe(ordo::JobConfig::new("projection"), Projection)
    ///     .await?
    ///     .detach();
    /// # Ok(()) }
    /// ```
    pub fn detach(mut self) {
        self.detached = true;
    }
}

impl Drop for SubscriptionHandle {
    fn drop(&mut self) {
        if !self.detached {
            self.running.request_stop();
        }
    }
}
