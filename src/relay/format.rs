//! [`Format`]: the envelope a relay's messages travel in, ordo's own or CloudEvents 1.0
//! (binary or structured content mode), and the CloudEvents attributes of a message, which
//! each built-in sink writes under its protocol binding's names (`wire/`).

// Without a sink feature only `Format` is reachable (it is public either way).
#![cfg_attr(
    not(any(
        feature = "http",
        feature = "kafka",
        feature = "nats",
        feature = "rabbitmq"
    )),
    allow(dead_code)
)]

use bytes::Bytes;

use super::{Message, SendError};

/// The envelope of a relay's messages, set with [`RelayConfig::format`](super::RelayConfig::format).
///
/// | | body | attributes |
/// | --- | --- | --- |
/// | `Ordo` | the payload as stored | ordo's headers (`Ordo-*`, `Nats-Msg-Id`, AMQP properties) |
/// | `CloudEventsBinary` | the payload as stored | CloudEvents attributes as headers, under the protocol binding's names: HTTP and NATS `ce-id`, Kafka `ce_id`, AMQP `cloudEvents_id`; the payload's media type as the content type |
/// | `CloudEventsStructured` | a CloudEvents JSON event whose `data` is the payload | content type `application/cloudevents+json; charset=UTF-8` |
///
/// Under either CloudEvents mode the attributes are `specversion` `1.0`, `id` (the event id),
/// `source` (the relay's [`source`](super::RelayConfig::source), else its name, as a URI
/// reference), `type` (the event type, `untyped` without one), `time` (when it was recorded),
/// `datacontenttype` `application/json`, and `partitionkey` (the CloudEvents partitioning
/// extension) when the message has an ordering key. ordo's own headers travel beside them, so
/// an ordo inbox reads a CloudEvents message as any other (in structured mode its payload is
/// the whole CloudEvents JSON).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Format {
    /// ordo's own headers, the payload as the body. The default.
    #[default]
    Ordo,
    /// CloudEvents 1.0, binary content mode.
    CloudEventsBinary,
    /// CloudEvents 1.0, structured content mode (the JSON event format).
    CloudEventsStructured,
}

/// What a built-in sink needs to frame its messages: the relay's [`Format`] and its name (the
/// CloudEvents `source` when the relay has no source name), learned in [`Sink::prepare`].
///
/// [`Sink::prepare`]: super::Sink::prepare
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Framing {
    pub(crate) format: Format,
    pub(crate) relay: String,
}

impl Default for Framing {
    /// ordo's own envelope; `ordo` as the CloudEvents source of a sink used without a relay.
    fn default() -> Self {
        Self {
            format: Format::Ordo,
            relay: "ordo".to_owned(),
        }
    }
}

impl Framing {
    /// The framing of the relay whose timing is `timing`.
    pub(crate) fn of(timing: &super::SinkTiming) -> Self {
        Self {
            format: timing.format,
            relay: timing.relay.clone(),
        }
    }

    /// The body of `message`: the payload, or the structured CloudEvent holding it.
    pub(crate) fn body(&self, message: &Message) -> Result<Bytes, SendError> {
        match self.format {
            Format::CloudEventsStructured => structured(message, &self.relay),
            Format::Ordo | Format::CloudEventsBinary => Ok(message.payload.clone()),
        }
    }

    /// The CloudEvents attributes a binary-mode message carries as headers, with the binding's
    /// `prefix` (`ce-`, `ce_`, `cloudEvents_`); none in the other formats.
    pub(crate) fn binary_attributes(
        &self,
        message: &Message,
        prefix: &str,
    ) -> Vec<(String, String)> {
        if self.format != Format::CloudEventsBinary {
            return Vec::new();
        }
        attributes(message, &self.relay)
            .into_iter()
            .map(|(name, value)| (format!("{prefix}{name}"), value))
            .collect()
    }

    /// The content type of the body.
    pub(crate) fn content_type(&self) -> &'static str {
        match self.format {
            Format::CloudEventsStructured => STRUCTURED_CONTENT_TYPE,
            Format::Ordo | Format::CloudEventsBinary => DATA_CONTENT_TYPE,
        }
    }
}

/// The payload's media type, CloudEvents' `datacontenttype`.
pub(crate) const DATA_CONTENT_TYPE: &str = "application/json";

/// The content type of a structured CloudEvent in the JSON event format.
pub(crate) const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json; charset=UTF-8";

/// The attributes of `message` as the CloudEvents context of a relay named `relay`, without
/// `datacontenttype` (each binding carries it as its content type): `(name, value)`.
pub(crate) fn attributes(message: &Message, relay: &str) -> Vec<(&'static str, String)> {
    let mut attributes = vec![
        ("specversion", "1.0".to_owned()),
        ("id", message.id.to_string()),
        (
            "source",
            uri_reference(message.source.as_deref().unwrap_or(relay)),
        ),
        ("type", message.type_or_untyped().to_owned()),
        (
            "time",
            message
                .recorded_at
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        ),
    ];
    if let Some(key) = &message.key {
        attributes.push(("partitionkey", key.clone()));
    }
    attributes
}

/// `message` as a structured CloudEvent: the JSON event format, with the payload's JSON text
/// as `data`, unchanged.
///
/// # Errors
///
/// A payload that is not JSON text cannot be `data` of the JSON format: the message's
/// permanent failure (a relay's payloads always are).
pub(crate) fn structured(message: &Message, relay: &str) -> Result<Bytes, SendError> {
    serde_json::from_slice::<serde::de::IgnoredAny>(&message.payload).map_err(|error| {
        SendError::permanent(format!(
            "the payload is not JSON, so it cannot be the data of a structured CloudEvent: {error}"
        ))
    })?;
    let mut body = String::with_capacity(message.payload.len() + 256);
    body.push('{');
    for (name, value) in attributes(message, relay) {
        let value = serde_json::Value::String(value).to_string();
        body.push_str(&format!("\"{name}\":{value},"));
    }
    body.push_str(&format!(
        "\"datacontenttype\":\"{DATA_CONTENT_TYPE}\",\"data\":"
    ));
    let mut bytes = body.into_bytes();
    bytes.extend_from_slice(&message.payload);
    bytes.push(b'}');
    Ok(Bytes::from(bytes))
}

/// `text` as a URI reference (RFC 3986): every byte outside the unreserved characters and
/// `/`, `:`, `@` percent-encoded.
fn uri_reference(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric()
            || matches!(byte, b'-' | b'.' | b'_' | b'~' | b'/' | b':' | b'@')
        {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_structured_event_wraps_the_payload_unchanged() {
        let message = Message::new(&br#"{"total": 1.10}"#[..])
            .with_event_type(Some("Placed"))
            .with_key(Some("customer 7"));
        let body = structured(&message, "orders out").expect("JSON payload");
        let json: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(json["specversion"], "1.0");
        assert_eq!(json["type"], "Placed");
        assert_eq!(json["source"], "orders%20out");
        assert_eq!(json["partitionkey"], "customer 7");
        assert!(String::from_utf8_lossy(&body).ends_with(r#""data":{"total": 1.10}}"#));
        let bad = Message::new(&b"not json"[..]);
        assert!(structured(&bad, "r").is_err_and(|error| error.is_permanent()));
    }
}
