//! The public insert-lane stream.

use std::sync::Arc;

use futures::stream::BoxStream;
use serde::de::DeserializeOwned;

use super::cache::{Slot, SlotItem};
use super::reader::LaneReader;
use crate::envelope::Envelope;
use crate::error::Error;
use crate::event_type::TypeFilter;
use crate::listener::{BatchSource, retrying_stream};
use crate::ops::metrics as m;
use crate::position::EventSequence;

/// The stream returned by [`Outbox::listen_inserted`](crate::Outbox::listen_inserted).
///
/// Items are committed events in strictly increasing [`EventSequence`], each once, none
/// missing. An `Err` item is one of:
/// - [`Error::UndecodablePayload`]: that event's payload does not decode; the stream goes on
///   with the next event.
/// - [`Error::Database`]: reading a page from the table failed; the stream retries the same
///   position after a capped backoff, so nothing is skipped.
/// - [`Error::MissingHistory`]: a resolved row was deleted; the stream ends after it.
/// - [`Error::BelowRetentionFloor`]: the start is below what retention keeps; the stream ends.
///
/// The stream ends when the outbox shuts down.
pub type EventStream<P> = BoxStream<'static, Result<Arc<Envelope<P>>, Error>>;

impl<P> BatchSource for LaneReader<P>
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    type Item = Slot<P>;

    async fn next_batch(&mut self) -> Option<crate::Result<Vec<Slot<P>>>> {
        LaneReader::next_batch(self).await
    }
}

/// The stream of `reader`'s events whose type `filter` admits; the others are passed over
/// before their payload is looked at, so a foreign type is never an `Err` item.
pub(crate) fn stream<P>(reader: LaneReader<P>, filter: TypeFilter) -> EventStream<P>
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    // One handle per stream, not a registry lookup per event.
    let latency = metrics::histogram!(m::DELIVERY_LATENCY, "lane" => "insert");
    retrying_stream(reader, move |slot| match slot.item {
        SlotItem::Event(event) if filter.admits(event.event_type.as_deref()) => {
            latency.record(m::since(event.recorded_at));
            Some(Ok(event))
        }
        SlotItem::Undecodable(row) if filter.admits(row.event_type.as_deref()) => {
            Some(Err(Error::UndecodablePayload {
                sequence: EventSequence::new(slot.sequence),
                source: Arc::clone(&row.error),
            }))
        }
        SlotItem::Event(_) | SlotItem::Undecodable(_) => None,
        SlotItem::Meta | SlotItem::Placeholder => None,
    })
}
