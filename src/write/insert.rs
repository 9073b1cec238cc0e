//! Turning buffered events into rows of `ordo.events`, in one statement.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::sql::INSERT_EVENTS;
use crate::envelope::{Envelope, Headers};
use crate::error::{Error, Result};
use crate::insert_lane::cache::{Slot, SlotItem};
use crate::insert_lane::rows::to_u64;
use crate::position::EventSequence;

/// An event serialised at publish time, so an encoding error surfaces at the call that caused
/// it, and kept typed, so the in-process lane hands out the very value published (no decode).
pub(crate) struct Buffered<P> {
    id: Uuid,
    payload: P,
    payload_json: String,
    headers: Headers,
    headers_json: String,
    /// `ordo.events.event_type`: the payload's serde tag unless set explicitly.
    event_type: Option<String>,
}

impl<P: Serialize> Buffered<P> {
    pub(crate) fn new(payload: P, mut headers: Headers) -> Result<Self> {
        crate::ops::trace::inject(&mut headers);
        let payload_json = serde_json::to_string(&payload).map_err(Error::Encode)?;
        let headers_json = serde_json::to_string(&headers).map_err(Error::Encode)?;
        let event_type = crate::event_type::type_of(&payload);
        Ok(Self {
            // Time-ordered ids keep the unique index append-mostly.
            id: Uuid::now_v7(),
            payload,
            payload_json,
            headers,
            headers_json,
            event_type,
        })
    }

    /// The same event with its type set explicitly (`None`: untyped).
    pub(crate) fn with_type(mut self, event_type: Option<String>) -> Self {
        self.event_type = event_type;
        self
    }
}

/// A row as the insert returned it.
pub(crate) struct Inserted {
    id: Uuid,
    sequence: u64,
    commit_xid: i64,
    recorded_at: DateTime<Utc>,
}

/// Inserts every buffered event in one statement on `conn`.
pub(crate) async fn insert<P>(
    conn: &mut PgConnection,
    events: &[Buffered<P>],
) -> Result<Vec<Inserted>> {
    let ids: Vec<Uuid> = events.iter().map(|e| e.id).collect();
    let payloads: Vec<&str> = events.iter().map(|e| e.payload_json.as_str()).collect();
    let headers: Vec<&str> = events.iter().map(|e| e.headers_json.as_str()).collect();
    let types: Vec<Option<&str>> = events.iter().map(|e| e.event_type.as_deref()).collect();
    let rows = sqlx::query(INSERT_EVENTS)
        .bind(ids)
        .bind(payloads)
        .bind(headers)
        .bind(types)
        .fetch_all(&mut *conn)
        .await?;
    rows.iter()
        .map(|row| {
            Ok(Inserted {
                id: row.try_get("id")?,
                sequence: to_u64(row.try_get("sequence")?),
                commit_xid: row.try_get("commit_xid")?,
                recorded_at: row.try_get("recorded_at")?,
            })
        })
        .collect()
}

/// Pairs each committed row with its typed event, giving the lane's slots in sequence order.
pub(crate) fn into_slots<P>(events: Vec<Buffered<P>>, rows: Vec<Inserted>) -> Vec<Slot<P>> {
    let in_order =
        events.len() == rows.len() && events.iter().zip(&rows).all(|(e, r)| e.id == r.id);
    let mut pairs: Vec<(Buffered<P>, Inserted)> = if in_order {
        events.into_iter().zip(rows).collect()
    } else {
        // RETURNING follows insertion order in practice; do not rely on it.
        let mut by_id: std::collections::HashMap<Uuid, Inserted> =
            rows.into_iter().map(|row| (row.id, row)).collect();
        events
            .into_iter()
            .filter_map(|event| by_id.remove(&event.id).map(|row| (event, row)))
            .collect()
    };
    pairs.sort_by_key(|(_, row)| row.sequence);
    pairs
        .into_iter()
        .map(|(event, row)| Slot {
            sequence: row.sequence,
            commit_xid: Some(row.commit_xid),
            item: SlotItem::Event(Arc::new(Envelope {
                id: row.id,
                sequence: EventSequence::new(row.sequence),
                commit_xid: row.commit_xid,
                payload: event.payload,
                headers: event.headers,
                event_type: event.event_type,
                recorded_at: row.recorded_at,
            })),
        })
        .collect()
}

pub(crate) fn sequences(rows: &[Inserted]) -> Vec<EventSequence> {
    let mut out: Vec<EventSequence> = rows
        .iter()
        .map(|r| EventSequence::new(r.sequence))
        .collect();
    out.sort();
    out
}
