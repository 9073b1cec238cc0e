//! `publish_in`: events inserted into a transaction the caller owns and commits.

use serde::Serialize;
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use super::insert::{self, Buffer};
use super::sink::CommitSink;
use crate::envelope::Headers;
use crate::error::Result;
use crate::position::EventSequence;
use crate::telemetry::metrics as m;

/// Inserts `events` in `tx` now and points the lane at them (it cannot see the caller's
/// commit). See [`Outbox::publish_in`](crate::Outbox::publish_in).
pub(crate) async fn publish_in<P: Serialize>(
    sink: &CommitSink<P>,
    tx: &mut Transaction<'_, Postgres>,
    events: impl IntoIterator<Item = P>,
) -> Result<Vec<EventSequence>> {
    let mut buffer = Buffer::json_only();
    for event in events {
        buffer.push(Uuid::now_v7(), event, Headers::new())?;
    }
    if buffer.is_empty() {
        return Ok(Vec::new());
    }
    let written = insert::insert(tx, &mut buffer, sink.statements).await?;
    metrics::counter!(m::EVENTS_PUBLISHED).increment(written.sequences.len() as u64);
    if let Some(&last) = written.sequences.last() {
        sink.hint_written(last);
    }
    Ok(written.sequences)
}
