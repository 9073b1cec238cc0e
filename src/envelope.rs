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
