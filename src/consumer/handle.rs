//! [`SubscriptionHandle`]: a running subscription's status, waits and shutdown.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::shutdown::Running;
use super::start::LaneHeads;
use super::status::SubscriptionStatus;
use crate::position::Ordering;

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

/// Shows the subscription's current status.
impl std::fmt::Debug for SubscriptionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriptionHandle")
            .field("status", &*self.status.borrow())
            .field("detached", &self.detached)
            .finish_non_exhaustive()
    }
}

/// Where each lane's head is, for the lag: the outbox's current lanes.
pub(crate) struct Heads {
    pub(crate) current: Arc<dyn LaneHeads>,
}

impl SubscriptionHandle {
    /// The subscription's current status as this process's runner sees it (no query), with
    /// its lag against this process's view of the lane head. Its `state` is the runner's own;
    /// [`list_subscriptions`](crate::admin::list_subscriptions) reads the same status from the
    /// database, for any process's runner.
    pub fn status(&self) -> SubscriptionStatus {
        self.with_lag(&self.status.borrow())
    }

    /// `status` with its lag against this process's view of the lane head.
    fn with_lag(&self, status: &SubscriptionStatus) -> SubscriptionStatus {
        let mut status = status.clone();
        let head = match status.lane {
            Ordering::Insert => *self.heads.current.insert().borrow(),
            Ordering::Commit => self.heads.current.commit().head(),
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
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            // Taken again each time: the outbox starts new lanes after a rewind.
            let mut insert_head = self.heads.current.insert();
            let mut commit_head = self.heads.current.commit().follow_head();
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
