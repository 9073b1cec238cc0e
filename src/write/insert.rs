//! Turning buffered events into rows of `ordo.events`, in bounded chunks.
//!
//! Events are serialised at publish time (an encoding error surfaces at the call that caused
//! it) into chunks of at most [`CHUNK_EVENTS`] events and [`CHUNK_BYTES`] bytes of JSON, and
//! inserted chunk by chunk at commit, each chunk's JSON dropped once sent. A small transaction
//! is one chunk, so one statement, as before. A very large one costs its JSON text while it is
//! buffered (the events must wait for commit: every insert comes after the transaction's reads)
//! plus one chunk in flight, instead of every row materialised several times over: a
//! 1,000,000-event transaction once peaked at 1.4 GB.
//!
//! The typed values are kept only for transactions of at most [`HANDOFF_EVENTS`] events, which
//! the commit hands to the in-process lane as they are (no decode). A larger transaction is
//! read back from the table by the lane, page by page, like events written by plain SQL.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use super::sql;
use crate::envelope::{Envelope, Headers};
use crate::error::{Error, Result};
use crate::insert_lane::cache::{Slot, SlotItem};
use crate::pooler::Statements;
use crate::position::EventSequence;

/// Events per insert statement at most. Large enough that a statement's round trip is small
/// next to its work, small enough that one chunk's rows, binds and answer stay a few megabytes.
pub(crate) const CHUNK_EVENTS: usize = 5_000;
/// Bytes of JSON (payloads and headers) per insert statement at most; a single bigger event is
/// a chunk of its own.
pub(crate) const CHUNK_BYTES: usize = 8 << 20;
/// Transactions of at most this many events are handed to the in-process lane as typed
/// values; larger ones are read back from the table. At or below the default cache capacity,
/// so a handed-over transaction fits the lane's window.
pub(crate) const HANDOFF_EVENTS: usize = CHUNK_EVENTS;

/// A statement carrying more payload bytes than this hands its connection's buffer back.
const SHRINK_AFTER_BYTES: usize = 1024 * 1024;

/// JSON texts stored end to end: one allocation per chunk, not one per event.
#[derive(Default)]
struct Column {
    text: String,
    ends: Vec<usize>,
}

impl Column {
    fn push(&mut self, json: &str) {
        self.text.push_str(json);
        self.ends.push(self.text.len());
    }

    fn strs(&self) -> Vec<&str> {
        let mut start = 0;
        self.ends
            .iter()
            .map(|&end| {
                let json = &self.text[start..end];
                start = end;
                json
            })
            .collect()
    }
}

/// The events of one insert statement: `ids[first..first + len]` of the buffer.
struct Chunk {
    first: usize,
    payloads: Column,
    headers: Column,
    /// `ordo.events.event_type` of each event (NULL: untyped).
    types: Vec<Option<String>>,
}

impl Chunk {
    fn len(&self) -> usize {
        self.payloads.ends.len()
    }

    fn bytes(&self) -> usize {
        self.payloads.text.len() + self.headers.text.len()
    }
}

/// A published event's typed values, for the in-process hand-off.
struct Typed<P> {
    payload: P,
    headers: Headers,
    /// Its JSON's length (payload and headers), what it weighs in the lane's byte budget.
    bytes: usize,
    event_type: Option<String>,
}

/// The events of one transaction, serialised, waiting for commit.
pub(crate) struct Buffer<P> {
    /// Every event's id, in publish order (kept to the end: an in-doubt commit reports them).
    ids: Vec<Uuid>,
    /// Not yet inserted, in order.
    chunks: VecDeque<Chunk>,
    /// `typed[i]` belongs to `ids[i]`; `None` once the transaction outgrew the hand-off.
    typed: Option<Vec<Typed<P>>>,
}

impl<P: Serialize> Buffer<P> {
    /// A buffer whose events will be handed to the in-process lane if it stays small.
    pub(crate) fn for_handoff() -> Self {
        Self {
            ids: Vec::new(),
            chunks: VecDeque::new(),
            typed: Some(Vec::new()),
        }
    }

    /// A buffer whose events the lane will read from the table.
    pub(crate) fn json_only() -> Self {
        Self {
            ids: Vec::new(),
            chunks: VecDeque::new(),
            typed: None,
        }
    }

    /// Serialises and appends one event, typed by its serde tag; on error nothing is appended.
    pub(crate) fn push(&mut self, id: Uuid, payload: P, headers: Headers) -> Result<()> {
        let event_type = crate::event_type::type_of(&payload);
        self.push_with_type(id, payload, headers, event_type)
    }

    /// [`push`](Self::push) with the event's type given (`None`: untyped).
    pub(crate) fn push_with_type(
        &mut self,
        id: Uuid,
        payload: P,
        mut headers: Headers,
        event_type: Option<String>,
    ) -> Result<()> {
        crate::telemetry::trace::inject(&mut headers);
        let payload_json = serde_json::to_string(&payload).map_err(Error::Encode)?;
        let headers_json = serde_json::to_string(&headers).map_err(Error::Encode)?;
        let chunk = self.open_chunk(payload_json.len() + headers_json.len());
        chunk.payloads.push(&payload_json);
        chunk.headers.push(&headers_json);
        chunk.types.push(event_type.clone());
        self.ids.push(id);
        if let Some(typed) = &mut self.typed {
            if self.ids.len() > HANDOFF_EVENTS {
                // Too big for the hand-off: stop holding typed values (the lane reads the table).
                self.typed = None;
            } else {
                let bytes = payload_json.len() + headers_json.len();
                typed.push(Typed {
                    payload,
                    headers,
                    bytes,
                    event_type,
                });
            }
        }
        Ok(())
    }
}

impl<P> Buffer<P> {
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    pub(crate) fn ids(&self) -> &[Uuid] {
        &self.ids
    }

    /// The chunk the next event of `bytes` bytes goes into.
    fn open_chunk(&mut self, bytes: usize) -> &mut Chunk {
        let first = self.ids.len();
        let fits = self.chunks.back().is_some_and(|chunk| {
            chunk.len() < CHUNK_EVENTS && chunk.bytes() + bytes <= CHUNK_BYTES
        });
        if !fits {
            self.chunks.push_back(Chunk {
                first,
                payloads: Column::default(),
                headers: Column::default(),
                types: Vec::new(),
            });
        }
        // Just ensured there is one.
        let last = self.chunks.len() - 1;
        &mut self.chunks[last]
    }

    /// Pairs each committed row with its typed event, giving the lane's slots in sequence
    /// order; `None` when the transaction was too large to hand over.
    pub(crate) fn into_slots(self, rows: Vec<Inserted>) -> Option<Vec<Slot<P>>> {
        let typed = self.typed?;
        if typed.len() != self.ids.len() || rows.len() != self.ids.len() {
            return None;
        }
        let count = rows.len();
        let mut by_id: HashMap<Uuid, Typed<P>> = self.ids.into_iter().zip(typed).collect();
        let mut slots: Vec<Slot<P>> = rows
            .into_iter()
            .filter_map(|row| {
                let typed = by_id.remove(&row.id)?;
                Some(Slot {
                    sequence: row.sequence.get(),
                    commit_xid: Some(row.commit_xid),
                    bytes: typed.bytes,
                    item: SlotItem::Event(Arc::new(Envelope {
                        id: row.id,
                        sequence: row.sequence,
                        commit_xid: row.commit_xid,
                        payload: typed.payload,
                        headers: typed.headers,
                        event_type: typed.event_type,
                        recorded_at: row.recorded_at,
                    })),
                })
            })
            .collect();
        // A caller-supplied id used twice in one transaction pairs ambiguously: let the lane
        // read such a transaction from the table rather than guess.
        if slots.len() != count {
            return None;
        }
        slots.sort_by_key(|slot| slot.sequence);
        Some(slots)
    }
}

/// A row as the insert returned it.
pub(crate) struct Inserted {
    id: Uuid,
    sequence: EventSequence,
    commit_xid: i64,
    recorded_at: DateTime<Utc>,
}

/// What the chunked insert wrote.
pub(crate) struct Written {
    /// The writing transaction's id (every chunk runs in the same transaction).
    pub(crate) xid: i64,
    /// Every sequence drawn, ascending.
    pub(crate) sequences: Vec<EventSequence>,
    /// The rows, only for a buffer that keeps its typed values (for the hand-off).
    pub(crate) rows: Vec<Inserted>,
}

/// Inserts every buffered event on `conn`, chunk by chunk, dropping each chunk's JSON once it
/// has been sent, as `statements` says (unnamed through a transaction-mode pooler). The buffer
/// keeps its ids.
pub(crate) async fn insert<P>(
    conn: &mut PgConnection,
    buffer: &mut Buffer<P>,
    statements: Statements,
) -> Result<Written> {
    let keep_rows = buffer.typed.is_some();
    let mut written = Written {
        xid: 0,
        sequences: Vec::with_capacity(buffer.ids.len()),
        rows: Vec::new(),
    };
    while let Some(chunk) = buffer.chunks.pop_front() {
        let ids = &buffer.ids[chunk.first..chunk.first + chunk.len()];
        // Every chunk is the same statement: the first one assigns the xid before its first
        // `nextval` (see INSERT_EVENTS); later ones run in a transaction that already has it,
        // and draw higher sequences, so insert order is sequence order across chunks.
        let rows = sql::insert_events(
            &mut *conn,
            ids,
            chunk.payloads.strs(),
            chunk.headers.strs(),
            &chunk.types,
            statements,
        )
        .await?;
        if chunk.bytes() > SHRINK_AFTER_BYTES {
            // sqlx keeps the write buffer at the largest statement sent: give it back, or a
            // large payload pins its size in this pooled connection for good.
            conn.shrink_buffers();
        }
        drop(chunk);
        for (id, sequence, commit_xid, recorded_at) in rows {
            let inserted = Inserted {
                id,
                sequence,
                commit_xid,
                recorded_at,
            };
            written.xid = commit_xid;
            written.sequences.push(sequence);
            if keep_rows {
                written.rows.push(inserted);
            }
        }
    }
    written.sequences.sort();
    Ok(written)
}
