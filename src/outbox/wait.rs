//! Read-your-writes: waiting until what a writer committed is in the commit log, or has been
//! handled by a subscription.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Outbox;
use crate::error::Result;
use crate::position::{CommitSequence, EventSequence};
#[cfg(doc)]
use crate::{error::Error, write::transaction::OutboxTransaction};

impl<P> Outbox<P>
where
    P: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// Read-your-writes on the commit lane: waits until every one of `sequences` (what
    /// [`OutboxTransaction::commit`] returned) is in the commit log, and returns their commit
    /// positions in the same order. Answered from the database, so it works in any process,
    /// whoever folds; woken early when this process sees the log head move.
    ///
    /// ```no_run
    /// # async fn run(outbox: ordo::Outbox<serde_json::Value>) -> ordo::Result<()> {
    /// use std::time::Duration;
    /// let mut tx = outbox.begin().await?;
    /// tx.publish(serde_json::json!({"order": 7}))?;
    /// let sequences = tx.commit().await?;
    /// let positions = outbox.wait_for_commit(&sequences, Duration::from_secs(5)).await?;
    /// println!("order 7 is at commit position {}", positions[0]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::WaitTimedOut`] when `limit` passes first (the commit lane is stalled, or no
    /// process folds: see `ordo status`); [`Error::Database`] if a query fails.
    pub async fn wait_for_commit(
        &self,
        sequences: &[EventSequence],
        limit: std::time::Duration,
    ) -> Result<Vec<CommitSequence>> {
        crate::commit_lane::wait::commit_positions(
            &self.inner.direct,
            self.inner.generations.running().commit.follow_head(),
            sequences,
            limit,
        )
        .await
    }

    /// Read-your-writes through a subscription: waits until the subscription `name` (run by
    /// this or any other process) has handled and checkpointed every one of `sequences` (what
    /// [`OutboxTransaction::commit`] returned), on whichever lane it follows. After it returns,
    /// the subscription's writes for those events are committed (a projection can be read).
    ///
    /// ```no_run
    /// # async fn run(outbox: ordo::Outbox<serde_json::Value>) -> ordo::Result<()> {
    /// use std::time::Duration;
    /// let mut tx = outbox.begin().await?;
    /// tx.publish(serde_json::json!({"deposit": 100}))?;
    /// let sequences = tx.commit().await?;
    /// outbox.wait_for_subscription("balances", &sequences, Duration::from_secs(5)).await?;
    /// // the `balances` projection now includes the deposit
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::UnknownSubscription`] for a name with no row; [`Error::SubscriptionNotRunning`]
    /// when it is halted or paused short of the target; [`Error::WaitTimedOut`] when `limit`
    /// passes first; [`Error::Database`] if a query fails.
    pub async fn wait_for_subscription(
        &self,
        name: &str,
        sequences: &[EventSequence],
        limit: std::time::Duration,
    ) -> Result<()> {
        crate::subscription::wait::subscription_reached(
            &self.inner.direct,
            self.inner.generations.running().commit.follow_head(),
            name,
            sequences,
            limit,
        )
        .await
    }
}
