//! The AMQP properties and headers of a published message.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};

use super::{Message, SHORT_STRING_MAX};
use crate::relay::format::Framing;
use crate::wire::rabbitmq as wire;

/// ordo's headers, the relay's header templates and, in a CloudEvents format, the AMQP
/// binding's `cloudEvents_*` application properties and content type.
pub(super) fn properties(message: &Message, framing: &Framing) -> BasicProperties {
    let mut headers = FieldTable::default();
    let sequence = i64::try_from(message.sequence.get()).unwrap_or(i64::MAX);
    headers.insert(wire::SEQUENCE.into(), AMQPValue::LongLongInt(sequence));
    let position = i64::try_from(message.position).unwrap_or(i64::MAX);
    headers.insert(wire::POSITION.into(), AMQPValue::LongLongInt(position));
    headers.insert(
        wire::LANE.into(),
        AMQPValue::LongString(message.lane.as_str().into()),
    );
    if let Some(history) = message.history {
        headers.insert(
            wire::HISTORY.into(),
            AMQPValue::LongLongInt(i64::try_from(history.id).unwrap_or(i64::MAX)),
        );
        let start = i64::try_from(history.first_position).unwrap_or(i64::MAX);
        headers.insert(wire::HISTORY_START.into(), AMQPValue::LongLongInt(start));
    }
    if let Some(source) = &message.source {
        headers.insert(
            wire::SOURCE.into(),
            AMQPValue::LongString(source.as_str().into()),
        );
    }
    if let Some(route) = &message.route {
        headers.insert(
            wire::ROUTE.into(),
            AMQPValue::LongString(route.as_str().into()),
        );
    }
    if let Some(previous) = message.previous {
        let previous = i64::try_from(previous).unwrap_or(i64::MAX);
        headers.insert(wire::PREVIOUS.into(), AMQPValue::LongLongInt(previous));
    }
    if let Some(key) = &message.key {
        headers.insert(wire::KEY.into(), AMQPValue::LongString(key.as_str().into()));
    }
    if let Some(traceparent) = message.traceparent() {
        headers.insert(
            crate::wire::TRACEPARENT.into(),
            AMQPValue::LongString(traceparent.into()),
        );
    }
    if let Some(json) = message.headers_json() {
        headers.insert(wire::HEADERS.into(), AMQPValue::LongString(json.into()));
    }
    let chosen = message.header_fields.iter().cloned();
    for (name, value) in chosen.chain(framing.binary_attributes(message, wire::CE_PREFIX)) {
        headers.insert(name.into(), AMQPValue::LongString(value.into()));
    }
    let timestamp = u64::try_from(message.recorded_at.timestamp()).unwrap_or(0);
    let mut properties = BasicProperties::default()
        .with_message_id(message.id.to_string().into())
        .with_content_type(framing.content_type().into())
        .with_delivery_mode(2)
        .with_timestamp(timestamp)
        .with_headers(headers);
    if let Some(event_type) = &message.event_type
        && event_type.len() <= SHORT_STRING_MAX
    {
        properties = properties.with_type(event_type.as_str().into());
    }
    properties
}
