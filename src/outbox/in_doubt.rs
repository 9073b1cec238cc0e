//! A commit whose answer was lost: whether it committed, asked of the events it stored (the
//! work is in `write::in_doubt`).

use serde::Serialize;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::Outbox;
use crate::error::Result;
use crate::write::in_doubt::{self, CommitStatus};
#[cfg(doc)]
use crate::{error::Error, write::transaction::OutboxTransaction};

impl<P> Outbox<P>
where
    P: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// Whether transaction `xid`, which published the events `event_ids`, committed: the
    /// question to ask after [`Error::CommitInDoubt`] (pass its `xid` and `event_ids`), or after
    /// a caller-owned transaction that used [`publish_in`](Self::publish_in) lost its
    /// `COMMIT`'s answer. `xid` is the 64-bit id in `ordo.events.commit_xid` and
    /// [`Envelope::commit_xid`](crate::Envelope).
    ///
    /// The stored events are the proof, so that the answer holds across a failover:
    /// `Committed` only if the server holds them under `xid`; `Aborted` if it rolled back, if
    /// the server has no record of `xid` (a promoted standby that never received the
    /// transaction), or if `xid` committed without them (a promoted standby gives a lost
    /// transaction's id to a transaction of its own, whose fate the id alone would report);
    /// `InProgress` while it can still commit: ask again later, and do not publish its events
    /// again meanwhile.
    ///
    /// With no `event_ids` (a transaction that published nothing) there is no proof: the answer
    /// is the server's word on `xid` alone, which a failover in between can make another
    /// transaction's. Retention drops events, not transaction ids: ask within the retention
    /// period, or a committed transaction whose events were dropped reads as `Aborted`.
    ///
    /// ```no_run
    /// # async fn run(outbox: ordo::Outbox<String>) -> ordo::Result<()> {
    /// let mut tx = outbox.begin().await?;
    /// tx.publish("order 17 placed".to_owned())?;
    /// match tx.commit().await {
    ///     Err(ordo::Error::CommitInDoubt { xid, event_ids, .. }) => {
    ///         match outbox.commit_status(xid, &event_ids).await? {
    ///             ordo::CommitStatus::Committed => {}        // done: do not publish again
    ///             ordo::CommitStatus::Aborted => {}          // retry the whole transaction
    ///             _ => {}                                    // ask again later
    ///         }
    ///     }
    ///     other => { other?; }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Database`] if the server cannot be asked: ask again later. With no
    /// `event_ids`, also if `xid` is not a transaction id of this server yet ("in the future").
    pub async fn commit_status(&self, xid: i64, event_ids: &[Uuid]) -> Result<CommitStatus> {
        in_doubt::status(&self.inner.direct, xid, event_ids).await
    }

    /// Which of `ids` are stored in `ordo.events` as committed events. For a caller that lost
    /// the transaction id of an in-doubt commit but kept its event ids
    /// ([`OutboxTransaction::event_ids`]): an id found was published; an id not found was not
    /// published *yet*, which is final only once the transaction that wrote it can no longer
    /// be in progress (its connection is gone and the server has noticed). Prefer
    /// [`commit_status`](Self::commit_status) when you have the xid.
    ///
    /// # Errors
    /// [`Error::Database`] if the query fails.
    pub async fn published(&self, ids: &[Uuid]) -> Result<Vec<Uuid>> {
        in_doubt::published(&self.inner.direct, ids).await
    }
}
