//! The headers and the subject of a published message, checked before it is sent.

use async_nats::{HeaderMap, HeaderValue};

#[cfg(doc)]
use super::NatsSinkBuilder;
use super::{Message, SendError};
use crate::relay::Format;
use crate::relay::format::Framing;
use crate::wire::nats as wire;

mod names {
    use crate::wire::nats as wire;
    use async_nats::HeaderName;

    // Built once: a name made from a `&str` per message is an allocation and a check each.
    pub(super) const MSG_ID: HeaderName = HeaderName::from_static(wire::MSG_ID);
    pub(super) const POSITION: HeaderName = HeaderName::from_static(wire::POSITION);
    pub(super) const LANE: HeaderName = HeaderName::from_static(wire::LANE);
    pub(super) const HISTORY: HeaderName = HeaderName::from_static(wire::HISTORY);
    pub(super) const HISTORY_START: HeaderName = HeaderName::from_static(wire::HISTORY_START);
    pub(super) const SOURCE: HeaderName = HeaderName::from_static(wire::SOURCE);
    pub(super) const ROUTE: HeaderName = HeaderName::from_static(wire::ROUTE);
    pub(super) const PREVIOUS: HeaderName = HeaderName::from_static(wire::PREVIOUS);
    pub(super) const EVENT_TYPE: HeaderName = HeaderName::from_static(wire::EVENT_TYPE);
    pub(super) const KEY: HeaderName = HeaderName::from_static(wire::KEY);
    pub(super) const TRACEPARENT: HeaderName = HeaderName::from_static(crate::wire::TRACEPARENT);
    pub(super) const HEADERS: HeaderName = HeaderName::from_static(wire::HEADERS);
    pub(super) const SEQUENCE: HeaderName = HeaderName::from_static(wire::SEQUENCE);
    pub(super) const RECORDED_AT: HeaderName = HeaderName::from_static(wire::RECORDED_AT);
    pub(super) const CONTENT_TYPE: HeaderName = HeaderName::from_static(wire::CONTENT_TYPE);
}

/// `Nats-Msg-Id` for JetStream's dedup, and what a consumer wants without parsing the body;
/// with `detail`, the [detail headers](NatsSinkBuilder::detail_headers) too.
/// A message with a header value NATS cannot carry (a line break) is refused as its permanent
/// failure before anything is sent.
/// The relay's [header templates](crate::relay::RelayConfig::header) and, in a CloudEvents
/// format, the envelope's headers come after ordo's own.
pub(super) fn headers(
    message: &Message,
    detail: bool,
    framing: &Framing,
) -> Result<HeaderMap, SendError> {
    let mut headers = HeaderMap::new();
    let mut id = uuid::Uuid::encode_buffer();
    headers.insert(
        names::MSG_ID,
        &*message.id.hyphenated().encode_lower(&mut id),
    );
    headers.insert(names::POSITION, message.position.to_string());
    headers.insert(names::LANE, message.lane.as_str());
    if let Some(history) = message.history {
        headers.insert(names::HISTORY, history.id.to_string());
        headers.insert(names::HISTORY_START, history.first_position.to_string());
    }
    if let Some(previous) = message.previous {
        headers.insert(names::PREVIOUS, previous.to_string());
    }
    // Text the event's writer chose (plain SQL can put a line break in it): checked, since the
    // client panics on a header value it cannot carry.
    let chosen = [
        (names::SOURCE, message.source.as_deref()),
        (names::ROUTE, message.route.as_deref()),
        (names::EVENT_TYPE, message.event_type.as_deref()),
        (names::KEY, message.key.as_deref()),
        (names::TRACEPARENT, message.traceparent()),
    ];
    for (name, value) in chosen {
        if let Some(value) = value {
            let value = header_value(&name, value)?;
            headers.insert(name, value);
        }
    }
    if let Some(json) = message.headers_json() {
        headers.insert(names::HEADERS, json);
    }
    if detail {
        headers.insert(names::SEQUENCE, message.sequence.get().to_string());
        headers.insert(names::RECORDED_AT, message.recorded_at.to_rfc3339());
    }
    if detail || framing.format != Format::Ordo {
        headers.insert(names::CONTENT_TYPE, framing.content_type());
    }
    let chosen = message.header_fields.iter().cloned();
    for (name, value) in chosen.chain(framing.binary_attributes(message, wire::CE_PREFIX)) {
        let name = name.parse::<async_nats::HeaderName>().map_err(|_| {
            SendError::permanent(format!(
                "{} is not a NATS header name",
                crate::relay::quoted(&name)
            ))
        })?;
        let value = header_value(&name, &value)?;
        headers.insert(name, value);
    }
    Ok(headers)
}

fn header_value(name: &async_nats::HeaderName, value: &str) -> Result<HeaderValue, SendError> {
    value.parse::<HeaderValue>().map_err(|_| {
        SendError::permanent(format!(
            "header {name} {} holds a line break, which a NATS header cannot carry",
            crate::relay::quoted(value)
        ))
    })
}

/// The longest subject published: the server refuses a control line (`HPUB`, the subject, the
/// reply inbox, two lengths) past 4,096 bytes by dropping the connection, which would look
/// like an outage; this leaves room for the rest of the line.
const MAX_SUBJECT: usize = 4_000;

/// A subject a message can be published on: dot-separated non-empty tokens, no whitespace,
/// no wildcard. Checked here so that a bad mapping is a permanent error naming the subject.
pub(super) fn check_subject(subject: &str) -> Result<(), SendError> {
    if subject.len() > MAX_SUBJECT {
        return Err(SendError::permanent(format!(
            "the subject is {} bytes long, past the {MAX_SUBJECT} a NATS server takes",
            subject.len()
        )));
    }
    let valid = !subject.is_empty()
        && subject.split('.').all(|token| {
            !token.is_empty()
                && token != "*"
                && token != ">"
                && !token.chars().any(char::is_whitespace)
        });
    if valid {
        Ok(())
    } else {
        Err(SendError::permanent(format!(
            "{} is not a NATS subject a message can be published on",
            crate::relay::quoted(subject)
        )))
    }
}
