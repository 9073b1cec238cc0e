//! `--key-from`: where a standalone relay finds an event's ordering key. The relay's code
//! cannot be given a closure from another language, so the few sources an event row has are
//! named instead: its type, a value in its payload, a value in its headers, or none.

use ordo::{Envelope, Keys};
use serde_json::Value;
use serde_json::value::RawValue;

/// The payload as the standalone relay reads it: the stored JSON text, checked but never
/// decoded into a tree (nor re-encoded on the way out), whatever language wrote it.
pub(crate) type RawPayload = Box<RawValue>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyFrom {
    /// No key: events are delivered in no particular order.
    None,
    /// The event type: one type's events in order (an untyped event has no key).
    EventType,
    /// The value at a JSON pointer (RFC 6901) in the payload.
    Payload(String),
    /// The value of a header.
    Header(String),
}

impl KeyFrom {
    /// `event-type`, `none`, `payload:/json/pointer` or `header:NAME`.
    pub(crate) fn parse(text: &str) -> Result<KeyFrom, String> {
        let text = text.trim();
        match text {
            "none" => return Ok(KeyFrom::None),
            "event-type" => return Ok(KeyFrom::EventType),
            _ => {}
        }
        if let Some(pointer) = text.strip_prefix("payload:") {
            if !pointer.starts_with('/') {
                return Err(format!(
                    "{text:?}: after `payload:` comes a JSON pointer such as /customer/id"
                ));
            }
            return Ok(KeyFrom::Payload(pointer.to_owned()));
        }
        if let Some(name) = text.strip_prefix("header:") {
            if name.is_empty() {
                return Err(format!("{text:?}: after `header:` comes a header's name"));
            }
            return Ok(KeyFrom::Header(name.to_owned()));
        }
        Err(format!(
            "{text:?} is not a key source: event-type, none, payload:/json/pointer or header:NAME"
        ))
    }

    /// The event's keys: none, or one. (Without a sink feature no relay runs to ask.)
    #[cfg_attr(
        not(any(feature = "nats", feature = "rabbitmq", feature = "http")),
        allow(dead_code)
    )]
    pub(crate) fn keys(&self, event: &Envelope<RawPayload>) -> Keys {
        let key = match self {
            KeyFrom::None => None,
            KeyFrom::EventType => event.event_type.clone(),
            KeyFrom::Payload(pointer) => {
                // Only this source decodes the payload, and only to find the key.
                serde_json::from_str::<Value>(event.payload.get())
                    .ok()
                    .and_then(|payload| payload.pointer(pointer).and_then(key_text))
            }
            KeyFrom::Header(name) => event.headers.get(name.as_str()).and_then(key_text),
        };
        key.map_or_else(Keys::none, Keys::one)
    }
}

impl std::fmt::Display for KeyFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyFrom::None => write!(f, "none"),
            KeyFrom::EventType => write!(f, "event-type"),
            KeyFrom::Payload(pointer) => write!(f, "payload:{pointer}"),
            KeyFrom::Header(name) => write!(f, "header:{name}"),
        }
    }
}

/// A JSON value as a key: a string as itself, `null` as no key, anything else as its JSON
/// text (`42`, `true`, `{"a":1}`).
#[cfg_attr(
    not(any(feature = "nats", feature = "rabbitmq", feature = "http")),
    allow(dead_code)
)]
fn key_text(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(text) => Some(text.clone()),
        other => Some(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse_and_bad_ones_say_what_is_accepted() {
        assert_eq!(KeyFrom::parse("none"), Ok(KeyFrom::None));
        assert_eq!(KeyFrom::parse("event-type"), Ok(KeyFrom::EventType));
        assert_eq!(
            KeyFrom::parse("payload:/customer/id"),
            Ok(KeyFrom::Payload("/customer/id".to_owned()))
        );
        assert_eq!(
            KeyFrom::parse("header:tenant"),
            Ok(KeyFrom::Header("tenant".to_owned()))
        );
        let bad = KeyFrom::parse("payload:customer").err().unwrap_or_default();
        assert!(bad.contains("JSON pointer"), "{bad}");
        assert!(KeyFrom::parse("header:").is_err());
        let unknown = KeyFrom::parse("customer").err().unwrap_or_default();
        assert!(unknown.contains("event-type, none"), "{unknown}");
    }

    #[test]
    fn a_key_is_a_string_as_itself_and_anything_else_as_json() {
        assert_eq!(key_text(&Value::from("bob")), Some("bob".to_owned()));
        assert_eq!(key_text(&Value::from(42)), Some("42".to_owned()));
        assert_eq!(key_text(&Value::Null), None);
    }
}
