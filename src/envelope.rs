//! What listeners and subscribers receive.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::position::{CommitSequence, EventSequence};

/// Free-form metadata stored beside a payload in `ordo.events.headers` (a JSON object): trace
/// context, correlation ids, anything the publisher wants a consumer to see.
pub type Headers = serde_json::Map<String, serde_json::Value>;

/// One committed event, shared between every listener of a process through an [`Arc`].
#[derive(Debug)]
#[non_exhaustive]
pub struct Envelope<P> {
    /// The event's unique id (`ordo.events.id`); consumers deduplicate on it.
    pub id: Uuid,
    /// Its position in the insert-ordered lane.
    pub sequence: EventSequence,
    /// The top-level transaction id of the transaction that wrote it. Events of one transaction
    /// share it; the commit lane groups by it.
    pub commit_xid: i64,
    /// The decoded payload.
    pub payload: P,
    /// The header map stored with it.
    pub headers: Headers,
    /// When the writing transaction started (`now()` at insert time).
    pub recorded_at: DateTime<Utc>,
    /// Its type (`ordo.events.event_type`): by default the payload's serde tag at publish
    /// time, or what plain SQL wrote; `None` is untyped. See the crate docs, "Event types".
    pub event_type: Option<String>,
}

impl<P> Envelope<P> {
    /// An envelope built by hand, for unit tests of handlers (no database needed): a fresh id,
    /// sequence 1, transaction 1, no headers, recorded now. Adjust with the `with_*` methods.
    ///
    /// ```
    /// # #[derive(Debug)] struct Deposited { cents: i64 }
    /// let event = ordo::Envelope::new(Deposited { cents: 250 })
    ///     .with_sequence(ordo::EventSequence::new(42))
    ///     .with_commit_xid(7);
    /// assert_eq!(event.sequence.get(), 42);
    /// assert_eq!(event.payload.cents, 250);
    /// ```
    pub fn new(payload: P) -> Self {
        Self {
            id: Uuid::now_v7(),
            sequence: EventSequence::new(1),
            commit_xid: 1,
            payload,
            headers: Headers::new(),
            recorded_at: Utc::now(),
            event_type: None,
        }
    }

    /// The same envelope of type `event_type` (`None`: untyped).
    pub fn with_event_type(mut self, event_type: Option<&str>) -> Self {
        self.event_type = event_type.map(str::to_owned);
        self
    }

    /// The same envelope at `sequence`.
    pub fn with_sequence(mut self, sequence: EventSequence) -> Self {
        self.sequence = sequence;
        self
    }

    /// The same envelope written by transaction `commit_xid`.
    pub fn with_commit_xid(mut self, commit_xid: i64) -> Self {
        self.commit_xid = commit_xid;
        self
    }

    /// The same envelope with `id`.
    pub fn with_id(mut self, id: Uuid) -> Self {
        self.id = id;
        self
    }

    /// The same envelope with `headers`.
    pub fn with_headers(mut self, headers: Headers) -> Self {
        self.headers = headers;
        self
    }

    /// The same envelope recorded at `recorded_at`.
    pub fn with_recorded_at(mut self, recorded_at: DateTime<Utc>) -> Self {
        self.recorded_at = recorded_at;
        self
    }
}

/// One event on the commit-ordered lane: the shared event plus its place in the commit log.
#[derive(Debug)]
#[non_exhaustive]
pub struct CommitOrderedEnvelope<P> {
    /// Its position in the commit log (dense from 1).
    pub commit_sequence: CommitSequence,
    /// True on the last event of its source transaction.
    pub boundary: bool,
    /// The event itself, the same allocation the insert lane hands out.
    pub event: Arc<Envelope<P>>,
}

impl<P> Clone for CommitOrderedEnvelope<P> {
    fn clone(&self) -> Self {
        Self {
            commit_sequence: self.commit_sequence,
            boundary: self.boundary,
            event: Arc::clone(&self.event),
        }
    }
}
