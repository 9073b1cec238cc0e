//! [`OutboxTransaction`]: a database transaction that also publishes events.

use std::ops::{Deref, DerefMut};

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{PgConnection, Postgres, Transaction};

use super::insert::{self, Buffered};
use super::outbox::Outbox;
use crate::envelope::Headers;
use crate::error::Result;
use crate::position::EventSequence;

/// A transaction opened by [`Outbox::begin`]. Domain writes go through it (it derefs to
/// [`PgConnection`]); [`publish`](Self::publish) buffers events, and [`commit`](Self::commit)
/// inserts them all in one statement just before `COMMIT`.
///
/// Inserting at commit time puts every outbox insert after all of the transaction's reads,
/// which is what makes the commit lane's order causal (see the crate docs).
///
/// Dropping it without `commit` rolls back: nothing is published.
pub struct OutboxTransaction<P> {
    tx: Transaction<'static, Postgres>,
    buffered: Vec<Buffered<P>>,
    outbox: Outbox<P>,
}

impl<P> OutboxTransaction<P>
where
    P: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    pub(crate) fn new(tx: Transaction<'static, Postgres>, outbox: Outbox<P>) -> Self {
        Self {
            tx,
            buffered: Vec::new(),
            outbox,
        }
    }

    /// Buffers `event` for publication at commit.
    ///
    /// # Errors
    /// [`Error::Encode`](crate::Error::Encode) if `event` does not serialise to JSON.
    pub fn publish(&mut self, event: P) -> Result<()> {
        self.publish_with_headers(event, Headers::new())
    }

    /// Buffers `event` with a header map (stored in `ordo.events.headers`).
    ///
    /// # Errors
    /// [`Error::Encode`](crate::Error::Encode) if `event` or `headers` does not serialise.
    pub fn publish_with_headers(&mut self, event: P, headers: Headers) -> Result<()> {
        self.buffered.push(Buffered::new(event, headers)?);
        Ok(())
    }

    /// Buffers `event` with its type set to `event_type` (stored in `ordo.events.event_type`)
    /// instead of the one found in its serde tag; `None` publishes it untyped.
    ///
    /// # Errors
    /// [`Error::Encode`](crate::Error::Encode) if `event` does not serialise to JSON.
    pub fn publish_typed(&mut self, event_type: Option<&str>, event: P) -> Result<()> {
        let buffered = Buffered::new(event, Headers::new())?;
        self.buffered
            .push(buffered.with_type(event_type.map(str::to_owned)));
        Ok(())
    }

    /// Buffers every event of `events`, in order.
    ///
    /// # Errors
    /// [`Error::Encode`](crate::Error::Encode) at the first event that does not serialise;
    /// the ones before it stay buffered.
    pub fn publish_all(&mut self, events: impl IntoIterator<Item = P>) -> Result<()> {
        for event in events {
            self.publish(event)?;
        }
        Ok(())
    }

    /// How many events are buffered.
    pub fn buffered(&self) -> usize {
        self.buffered.len()
    }

    /// Inserts the buffered events, commits, and hands the committed events to this process's
    /// listeners directly. Returns their sequences, in order.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) if the insert or the commit fails; then
    /// nothing was published.
    pub async fn commit(mut self) -> Result<Vec<EventSequence>> {
        if self.buffered.is_empty() {
            self.tx.commit().await?;
            return Ok(Vec::new());
        }
        let rows = insert::insert(&mut self.tx, &self.buffered).await?;
        self.tx.commit().await?;
        let sequences = insert::sequences(&rows);
        let slots = insert::into_slots(self.buffered, rows);
        self.outbox.committed(slots);
        Ok(sequences)
    }

    /// Rolls back: the domain writes are undone and nothing is published.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) if the rollback itself fails.
    pub async fn rollback(self) -> Result<()> {
        self.tx.rollback().await?;
        Ok(())
    }

    /// The underlying sqlx transaction, for APIs that want one.
    pub fn transaction(&mut self) -> &mut Transaction<'static, Postgres> {
        &mut self.tx
    }
}

impl<P> Deref for OutboxTransaction<P> {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.tx
    }
}

impl<P> DerefMut for OutboxTransaction<P> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.tx
    }
}
