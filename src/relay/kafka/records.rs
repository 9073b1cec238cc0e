//! A message as a Kafka record: its topic checked, its headers.

use rdkafka::message::{Header, OwnedHeaders};

use super::{Framing, Message, SendError};
use crate::wire::kafka as wire;

/// A topic name Kafka takes (`wire::kafka::check_topic`). Checked before a record is
/// produced, so that a destination an event's fields made invalid is that message's permanent
/// failure, named, rather than librdkafka's local error.
pub(crate) fn check_topic(topic: &str) -> Result<(), SendError> {
    wire::check_topic(topic).map_err(SendError::permanent)
}

/// The record's headers: ordo's own, the relay's header templates, and the envelope's.
pub(super) fn headers(message: &Message, framing: &Framing) -> OwnedHeaders {
    let mut texts: Vec<(&str, String)> = vec![
        (wire::EVENT_ID, message.id.to_string()),
        (wire::SEQUENCE, message.sequence.get().to_string()),
        (wire::POSITION, message.position.to_string()),
        (wire::LANE, message.lane.as_str().to_owned()),
    ];
    if let Some(history) = message.history {
        texts.push((wire::HISTORY, history.id.to_string()));
        texts.push((wire::HISTORY_START, history.first_position.to_string()));
    }
    if let Some(previous) = message.previous {
        texts.push((wire::PREVIOUS, previous.to_string()));
    }
    let optional = [
        (wire::ROUTE, message.route.clone()),
        (wire::SOURCE, message.source.clone()),
        (wire::EVENT_TYPE, message.event_type.clone()),
        (
            crate::wire::TRACEPARENT,
            message.traceparent().map(str::to_owned),
        ),
        (wire::HEADERS, message.headers_json()),
    ];
    texts.extend(
        optional
            .into_iter()
            .filter_map(|(name, value)| Some((name, value?))),
    );
    if framing.format != crate::relay::Format::Ordo {
        texts.push((wire::CONTENT_TYPE, framing.content_type().to_owned()));
    }
    let chosen = message.header_fields.iter();
    let envelope = framing.binary_attributes(message, wire::CE_PREFIX);
    let mut headers = OwnedHeaders::new_with_capacity(texts.len() + 8);
    for (name, value) in &texts {
        headers = headers.insert(Header {
            key: name,
            value: Some(value.as_bytes()),
        });
    }
    for (name, value) in chosen.chain(envelope.iter()) {
        headers = headers.insert(Header {
            key: name,
            value: Some(value.as_bytes()),
        });
    }
    headers
}
