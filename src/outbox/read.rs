//! Reading the lanes: listener streams and the positions this process knows.

use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Outbox;
use crate::commit_lane::listener::{self as commit_listener, CommitReader, CommitStream};
use crate::event_type::TypeFilter;
use crate::insert_lane::listener::{self, EventStream};
use crate::insert_lane::reader::LaneReader;
use crate::insert_lane::rows::ReadMode;
use crate::position::{CommitSequence, EventSequence, Start};

impl<P> Outbox<P>
where
    P: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// A stream of the insert-ordered lane from `start`: every committed event once, in
    /// strictly increasing sequence, none missing. See [`EventStream`] for its error items.
    ///
    /// A listener that is behind the process-wide cache reads the table by pages and joins
    /// live delivery without a hole or repeat. Events are shared `Arc`s, never deep-copied.
    ///
    /// `Start::Now` starts after the lane's current frontier: every event that becomes
    /// visible to this process from then on.
    pub fn listen_inserted(&self, start: Start<EventSequence>) -> EventStream<P> {
        self.listen_filtered(start, TypeFilter::default())
    }

    /// [`listen_inserted`](Self::listen_inserted), but only the events whose type
    /// ([`Envelope::event_type`](crate::Envelope::event_type)) is one of `types`, and untyped
    /// ones. Events of other types are passed over before their payload is decoded, so a type
    /// `P` does not know never becomes an `Err` item. See the crate docs, "Event types".
    ///
    /// ```no_run
    /// # #[derive(serde::Serialize, serde::Deserialize)] enum Orders { Placed { id: u64 } }
    /// # async fn run(outbox: ordo::Outbox<Orders>) {
    /// use ordo::Start;
    /// let placed = outbox.listen_inserted_types(Start::Now, ["Placed"]);
    /// # }
    /// ```
    pub fn listen_inserted_types<I, T>(
        &self,
        start: Start<EventSequence>,
        types: I,
    ) -> EventStream<P>
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        self.listen_filtered(start, TypeFilter::only(types))
    }

    fn listen_filtered(&self, start: Start<EventSequence>, filter: TypeFilter) -> EventStream<P> {
        let generation = self.inner.generations.running();
        let after = match start {
            Start::Beginning => 0,
            Start::After(position) => position.get(),
            Start::Now => generation.lane.frontier(),
        };
        let reader = LaneReader::new(
            Arc::clone(&generation.lane),
            generation.tasks.signal(),
            ReadMode::Full,
            after,
        );
        listener::stream(reader, filter)
    }

    /// The insert lane's frontier in this process: every sequence at or below it is resolved
    /// (a committed event or a placeholder).
    pub fn insert_frontier(&self) -> EventSequence {
        EventSequence::new(self.inner.generations.running().lane.frontier())
    }

    /// A stream of the commit-ordered lane from `start`: dense [`CommitSequence`]s (+1 each
    /// time), every source transaction's events contiguous and in insert order, the last one
    /// of each flagged as its `boundary`. See [`CommitStream`] for its error items.
    ///
    /// Groups are ordered by their lowest sequence: causal (a transaction that read another's
    /// committed row lands after it), not commit-timestamp order. See the crate docs.
    ///
    /// This process's own transactions (committed through
    /// [`OutboxTransaction::commit`](crate::OutboxTransaction::commit)) reach it at their positions before
    /// the append that logs them commits, unless
    /// [`OutboxConfig::early_commit_listeners`](crate::OutboxConfig::early_commit_listeners) is
    /// off; the log gives them the same positions, and a difference ends the stream with
    /// [`Error::ServerRewound`](crate::Error::ServerRewound).
    ///
    /// `Start::Now` starts after the log head as this process knows it.
    pub fn listen_committed(&self, start: Start<CommitSequence>) -> CommitStream<P> {
        let generation = self.inner.generations.running();
        let after = match start {
            Start::Beginning => 0,
            Start::After(position) => position.get(),
            Start::Now => generation.commit.head(),
        };
        let reader = CommitReader::new(
            Arc::clone(&generation.lane),
            Arc::clone(&generation.commit),
            generation.tasks.signal(),
            after,
        );
        let reader = if self.inner.config.early_commit_listeners {
            reader.taking_promises()
        } else {
            reader
        };
        commit_listener::stream(reader)
    }

    /// The commit log's head as this process knows it (`last_commit_seq`).
    /// A [`listen_committed`](Self::listen_committed) stream may be past it by this process's
    /// own transactions, whose positions it has before their append
    /// ([`OutboxConfig::early_commit_listeners`](crate::OutboxConfig::early_commit_listeners)).
    pub fn commit_head(&self) -> CommitSequence {
        CommitSequence::new(self.inner.generations.running().commit.head())
    }
}
