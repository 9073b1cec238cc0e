//! [`OutboxTransaction`]: a database transaction that also publishes events.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{PgConnection, Postgres, Transaction};
use uuid::Uuid;

use super::in_doubt::{self, CommitStatus};
use super::insert::{self, Buffer};
use super::sink::CommitSink;
use crate::envelope::Headers;
use crate::error::{Error, Result};
use crate::position::EventSequence;

/// A transaction opened by [`Outbox::begin`](crate::Outbox::begin). Domain writes go through
/// it (it derefs to [`PgConnection`]); [`publish`](Self::publish) buffers events, and
/// [`commit`](Self::commit) inserts them just before `COMMIT` (in one statement, or in bounded
/// chunks for a very large transaction).
///
/// Inserting at commit time puts every outbox insert after all of the transaction's reads,
/// which is what makes the commit lane's order causal (see the crate docs).
///
/// Dropping it without `commit` rolls back: nothing is published.
pub struct OutboxTransaction<P> {
    tx: Transaction<'static, Postgres>,
    buffer: Buffer<P>,
    sink: Arc<CommitSink<P>>,
}

impl<P> OutboxTransaction<P>
where
    P: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    pub(crate) fn new(tx: Transaction<'static, Postgres>, sink: Arc<CommitSink<P>>) -> Self {
        Self {
            tx,
            buffer: Buffer::for_handoff(),
            sink,
        }
    }

    /// Buffers `event` for publication at commit. Returns the id it will be stored under
    /// (`ordo.events.id`, [`Envelope::id`](crate::Envelope::id)), a time-ordered UUIDv7.
    ///
    /// # Errors
    /// [`Error::Encode`](crate::Error::Encode) if `event` does not serialise to JSON.
    pub fn publish(&mut self, event: P) -> Result<Uuid> {
        self.publish_with_headers(event, Headers::new())
    }

    /// Buffers `event` with a header map (stored in `ordo.events.headers`). Returns its id.
    ///
    /// # Errors
    /// [`Error::Encode`](crate::Error::Encode) if `event` or `headers` does not serialise.
    pub fn publish_with_headers(&mut self, event: P, headers: Headers) -> Result<Uuid> {
        let id = Uuid::now_v7();
        self.buffer.push(id, event, headers)?;
        Ok(id)
    }

    /// Buffers `event` under an id the caller chose, with a header map (`Headers::new()` for
    /// none). Made for retrying a transaction whose commit was in doubt
    /// ([`Error::CommitInDoubt`]) with the same ids, and for ids derived from domain keys, so
    /// that consumers that deduplicate by id see one event however often it is retried.
    ///
    /// `ordo.events.id` is indexed but **not unique** (the table is partitioned by sequence), so
    /// the database does not refuse an id stored before: retry only after
    /// [`Outbox::commit_status`](crate::Outbox::commit_status) (with the first attempt's xid
    /// and these ids) says it aborted, or check with
    /// [`Outbox::published`](crate::Outbox::published). A second copy stored all the same is
    /// never relayed: a relay sends an id only for the first event stored with it and refuses
    /// the others (`docs/relays.md`, "One event per id"); in-process listeners and
    /// subscriptions still see both rows.
    ///
    /// # Errors
    /// [`Error::Encode`](crate::Error::Encode) if `event` or `headers` does not serialise.
    pub fn publish_with_id(&mut self, id: Uuid, event: P, headers: Headers) -> Result<()> {
        self.buffer.push(id, event, headers)
    }

    /// Buffers `event` with its type set to `event_type` (stored in `ordo.events.event_type`)
    /// instead of the one found in its serde tag; `None` publishes it untyped. Returns its id.
    ///
    /// # Errors
    /// [`Error::Encode`](crate::Error::Encode) if `event` does not serialise to JSON.
    pub fn publish_typed(&mut self, event_type: Option<&str>, event: P) -> Result<Uuid> {
        let id = Uuid::now_v7();
        self.buffer
            .push_with_type(id, event, Headers::new(), event_type.map(str::to_owned))?;
        Ok(id)
    }

    /// Buffers every event of `events`, in order. Their ids are in [`event_ids`](Self::event_ids).
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

    /// Publishes `value` as the newest value of `event_type` in this transaction: it takes
    /// effect, and listeners hear of it, only if the transaction commits. Unlike
    /// [`publish`](Self::publish) it is written now, not at commit, and returns its version.
    ///
    /// The upsert locks the type's row until the transaction ends: another publisher of the
    /// same type waits for it (so versions follow commit order and the last to commit wins).
    /// Publish latest values late in a transaction. Under `REPEATABLE READ` or `SERIALIZABLE`,
    /// a concurrent publish of the same type fails this one with a serialization failure.
    /// See [`Outbox::publish_latest`](crate::Outbox::publish_latest).
    ///
    /// # Errors
    /// As [`Outbox::publish_latest`](crate::Outbox::publish_latest); a failed upsert aborts
    /// the transaction.
    pub async fn publish_latest<V>(&mut self, event_type: &str, value: &V) -> Result<u64>
    where
        V: Serialize + ?Sized,
    {
        crate::latest::publish(
            &mut self.tx,
            event_type,
            value,
            &Headers::new(),
            self.sink.statements,
        )
        .await
    }

    /// How many events are buffered.
    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }

    /// The ids of the buffered events, in publish order: what to keep in case the commit is in
    /// doubt.
    pub fn event_ids(&self) -> &[Uuid] {
        self.buffer.ids()
    }

    /// Inserts the buffered events, commits, and hands the committed events to this process's
    /// listeners directly (a transaction of more than a few thousand events is read back from
    /// the table instead, to keep memory bounded). Returns their sequences, in order.
    ///
    /// If the connection breaks while `COMMIT` is in flight, the server may have committed
    /// without the answer arriving. `commit` then asks PostgreSQL, on another connection of
    /// the pool and for a few seconds at most, whether the transaction committed
    /// (`pg_xact_status`, and its events stored under its id, which is what holds across a
    /// failover): if it did, `commit` returns `Ok` as if nothing had happened.
    ///
    /// # Errors
    /// - [`Error::Database`](crate::Error::Database) if the insert or the commit failed: then
    ///   **nothing was published** (the server refused the commit, or it is known to have
    ///   rolled back). Retrying the transaction is safe. (With no event buffered there is no
    ///   outcome to resolve: a lost answer to `COMMIT` is this error too, as with plain sqlx,
    ///   and the domain writes may have committed.)
    /// - [`Error::CommitInDoubt`] if the connection broke during `COMMIT` and the outcome could
    ///   not be learned: the events may or may not be stored. Do **not** retry before
    ///   [`Outbox::commit_status`](crate::Outbox::commit_status) with the error's `xid` and
    ///   `event_ids` says `Aborted`; the variant's docs give the whole procedure.
    ///
    /// A retry that never publishes twice:
    ///
    /// ```no_run
    /// # #[derive(serde::Serialize, serde::Deserialize)] struct Paid { order: i64 }
    /// # async fn run(outbox: ordo::Outbox<Paid>) -> ordo::Result<()> {
    /// use std::time::Duration;
    /// use ordo::{CommitStatus, Error, Headers};
    ///
    /// let id = uuid::Uuid::now_v7(); // the same id on every attempt
    /// 'attempt: loop {
    ///     let mut tx = outbox.begin().await?;
    ///     sqlx::query("UPDATE orders SET paid = true WHERE id = 7").execute(&mut *tx).await?;
    ///     tx.publish_with_id(id, Paid { order: 7 }, Headers::new())?;
    ///     match tx.commit().await {
    ///         Ok(_) => return Ok(()),
    ///         Err(Error::CommitInDoubt { xid, event_ids, .. }) => loop {
    ///             // The ids are the proof: after a failover, `xid` may be another's.
    ///             match outbox.commit_status(xid, &event_ids).await {
    ///                 Ok(CommitStatus::Committed) => return Ok(()),
    ///                 Ok(CommitStatus::Aborted) => continue 'attempt,
    ///                 // In progress, or the server still unreachable: ask again later.
    ///                 _ => tokio::time::sleep(Duration::from_secs(1)).await,
    ///             }
    ///         },
    ///         // Nothing was stored: retrying is safe (here: give up).
    ///         Err(error) => return Err(error),
    ///     }
    /// }
    /// # }
    /// ```
    ///
    /// # Cancel safety
    /// Not cancel safe: dropping the future while `COMMIT` is in flight leaves the outcome
    /// unknown and unreported. Keep [`event_ids`](Self::event_ids) before calling it if you
    /// may cancel, and ask [`Outbox::published`](crate::Outbox::published) afterwards.
    pub async fn commit(mut self) -> Result<Vec<EventSequence>> {
        if self.buffer.is_empty() {
            self.tx.commit().await?;
            return Ok(Vec::new());
        }
        let written = insert::insert(&mut self.tx, &mut self.buffer, self.sink.statements).await?;
        let last = written
            .sequences
            .last()
            .copied()
            .unwrap_or(EventSequence::BEGIN);
        // `written.sequences` is ascending.
        self.sink.expect_commit(written.xid, &written.sequences);
        if let Err(error) = self.tx.commit().await {
            settle(&self.sink, written.xid, last, error, self.buffer.ids()).await?;
            // Committed after all: go on as on the normal path. The lane keeps one copy per
            // sequence, whether it has them from here or from the table.
        }
        let count = written.sequences.len();
        let slots = self.buffer.into_slots(written.rows);
        self.sink.committed(last, count, slots);
        Ok(written.sequences)
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

/// A `COMMIT` of transaction `xid` failed with `error`: `Ok` if it committed all the same,
/// otherwise the error to report.
async fn settle<P>(
    sink: &CommitSink<P>,
    xid: i64,
    last: EventSequence,
    error: sqlx::Error,
    event_ids: &[Uuid],
) -> Result<()> {
    // The server answered: COMMIT failed (a deferred constraint, a serialization failure) and
    // the transaction rolled back.
    if let sqlx::Error::Database(_) = error {
        sink.commit_failed(xid);
        return Err(error.into());
    }
    match in_doubt::resolve(&sink.pool, xid, event_ids).await {
        CommitStatus::Committed => {
            tracing::info!(xid, %error, "the answer to COMMIT was lost, but the transaction committed");
            Ok(())
        }
        CommitStatus::Aborted => {
            sink.commit_failed(xid);
            Err(error.into())
        }
        _ => {
            // If it did commit, the lane will find the rows: point it at them. What
            // `expect_commit` noted stays: exact if it committed, never met if not.
            sink.hint_written(last);
            Err(Error::CommitInDoubt {
                xid,
                event_ids: event_ids.to_vec(),
                source: error,
            })
        }
    }
}
