//! The runner's lease on its subscription's row: one process runs a subscription at a time.
//!
//! The runner claims the lease when it is free, expired or already its own, renews it every
//! third of its length while it waits for events (each checkpoint renews it too, in the
//! handler's transaction), and releases it on the way out so a standby takes over at once
//! rather than when it expires. Why each statement reads as it does is on the statements
//! (`sql.rs`): the claim skips a locked row, and the handler's transaction is bounded by the
//! lease on the server.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;

use super::runner::Runner;
use super::sql::{self, Stored};
use super::subscriber::Subscriber;

impl<P, S> Runner<P, S>
where
    P: DeserializeOwned + Send + Sync + 'static,
    S: Subscriber<P>,
{
    /// While idle, the lease is renewed this often: a third of it, so two renewals can fail
    /// before it runs out.
    pub(super) fn renew_every(&self) -> Duration {
        self.config.lease / 3
    }

    /// Takes the lease if free, expired or ours; the row, or `None` if another runner holds it.
    pub(super) async fn claim(&self) -> Result<Option<Stored>, sqlx::Error> {
        let c = &self.config;
        self.noted(sql::claim(
            &self.pool, &c.name, c.ordering, self.owner, c.lease,
        ))
        .await
    }

    /// Extends a lease we hold; the row, or `None` if we lost it.
    pub(super) async fn renew(&self) -> Result<Option<Stored>, sqlx::Error> {
        let c = &self.config;
        self.noted(sql::renew(
            &self.pool, &c.name, c.ordering, self.owner, c.lease,
        ))
        .await
    }

    /// The row a claim or renewal returned, with whether we hold the lease noted.
    async fn noted(
        &self,
        statement: impl Future<Output = Result<Option<Stored>, sqlx::Error>>,
    ) -> Result<Option<Stored>, sqlx::Error> {
        let row = statement.await?;
        self.note_lease(row.is_some());
        Ok(row)
    }

    /// Gives the lease up; on failure it expires by itself.
    pub(super) async fn release(&self) {
        if let Err(error) = sql::release(&self.pool, &self.config.name, self.owner).await {
            tracing::warn!(%error, subscription = %self.config.name, "releasing the lease failed; it expires by itself");
        }
        self.note_lease(false);
    }

    /// When a lease taken or extended now runs out, by this machine's clock (for the status
    /// only: the fence is the database's clock).
    pub(super) fn lease_expiry(&self) -> Option<DateTime<Utc>> {
        chrono::Duration::from_std(self.config.lease)
            .ok()
            .map(|lease| Utc::now() + lease)
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
}
