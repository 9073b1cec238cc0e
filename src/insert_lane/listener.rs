//! The public insert-lane stream.

use std::sync::Arc;

use futures::stream::BoxStream;
use serde::de::DeserializeOwned;

use super::cache::Slot;
use super::reader::LaneReader;
use crate::envelope::Envelope;
use crate::error::Error;
use crate::event_type::TypeFilter;
use crate::listener::{BatchSource, retrying_stream};
use crate::position::{EventSequence, Ordering};
use crate::task::StopSignal;
use crate::telemetry::metrics as m;

/// The stream returned by [`Outbox::listen_inserted`](crate::Outbox::listen_inserted).
///
/// Items are committed events in strictly increasing [`EventSequence`], each once, none
/// missing.
///
/// # Errors a stream yields
///
/// Only what you must act on. An `Err` item is one of:
/// - [`Error::UndecodablePayload`]: that event's payload does not decode as `P`; it names the
///   sequence, and the stream **goes on** with the next event.
/// - [`Error::BelowRetentionFloor`]: the start is below what retention keeps; the stream ends.
/// - [`Error::MissingHistory`]: a row the lane had resolved was deleted; the stream ends.
/// - [`Error::Database`] with a permanent cause: the `ordo` schema is missing (not migrated),
///   permission denied, the pool was closed, or another failure that reading again cannot
///   mend; the stream ends.
///
/// After an error that ends the stream, the stream returns `None`; a new listener from the
/// last position you handled resumes without a hole once the cause is fixed.
///
/// Transient failures are **not** yielded: a lost or reset connection, a server shutting down
/// or restarting (SQLSTATE class 08, 57P01 to 57P03), a pool that had no free connection in
/// time, a serialization failure or deadlock, a cancelled statement, an I/O error. The stream
/// retries the same position after a capped, jittered backoff (50 ms doubling to 5 s), logs a
/// WARN naming the lane and position, and counts it in `ordo_stream_retries_total`
/// ([`metrics`](crate::metrics)). While the database is unreachable the stream just waits.
///
/// The stream ends (`None`) when the outbox shuts down.
pub type EventStream<P> = BoxStream<'static, Result<Arc<Envelope<P>>, Error>>;

impl<P> BatchSource for LaneReader<P>
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    type Item = Slot<P>;
    const LANE: &'static str = "insert";

    async fn next_batch(&mut self) -> Option<crate::Result<Vec<Slot<P>>>> {
        LaneReader::next_batch(self).await
    }

    fn position(&self) -> u64 {
        LaneReader::position(self)
    }

    fn stop_signal(&self) -> StopSignal {
        LaneReader::stop_signal(self)
    }
}

/// The stream of `reader`'s events whose type `filter` admits; the others are passed over
/// before their payload is looked at, so a foreign type is never an `Err` item.
pub(crate) fn stream<P>(reader: LaneReader<P>, filter: TypeFilter) -> EventStream<P>
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    // One handle per stream, not a registry lookup per event.
    let latency = metrics::histogram!(m::DELIVERY_LATENCY, "lane" => Ordering::Insert.as_str());
    retrying_stream(reader, move |slot| match slot.item.into_event()? {
        Ok(event) if filter.admits(event.event_type.as_deref()) => {
            latency.record(m::since(event.recorded_at));
            Some(Ok(event))
        }
        Err(row) if filter.admits(row.event_type.as_deref()) => {
            Some(Err(Error::UndecodablePayload {
                sequence: EventSequence::new(slot.sequence),
                source: Arc::clone(&row.error),
            }))
        }
        Ok(_) | Err(_) => None,
    })
}
