//! The public insert-lane stream.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use serde::de::DeserializeOwned;

use super::cache::SlotItem;
use super::reader::LaneReader;
use crate::envelope::Envelope;
use crate::error::Error;
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
///
/// The stream ends when the outbox shuts down.
pub type EventStream<P> = BoxStream<'static, Result<Arc<Envelope<P>>, Error>>;

const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

pub(crate) fn stream<P>(mut reader: LaneReader<P>) -> EventStream<P>
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    Box::pin(async_stream::stream! {
        let mut backoff = FIRST_BACKOFF;
        while let Some(batch) = reader.next_batch().await {
            match batch {
                Ok(slots) => {
                    backoff = FIRST_BACKOFF;
                    for slot in slots {
                        match slot.item {
                            SlotItem::Event(event) => {
                                metrics::histogram!(m::DELIVERY_LATENCY, "lane" => "insert").record(m::since(event.recorded_at));
                                yield Ok(event)
                            }
                            SlotItem::Undecodable(source) => yield Err(Error::UndecodablePayload {
                                sequence: EventSequence::new(slot.sequence),
                                source,
                            }),
                            SlotItem::Meta | SlotItem::Placeholder => {}
                        }
                    }
                }
                Err(error @ (Error::MissingHistory { .. } | Error::BelowRetentionFloor { .. })) => {
                    yield Err(error);
                    break;
                }
                Err(error) => {
                    yield Err(error);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    })
}
