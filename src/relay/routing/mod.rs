//! Routing without code: a relay's destination and chosen headers from [`Template`]s over the
//! event, and its payload sent as stored or expanded ([`RelayConfig::destination`],
//! [`RelayConfig::header`], [`RelayConfig::payload`]).
//!
//! The templates are parsed when they are set and checked when the relay starts (a bad one
//! refuses the start, pointing at the mistake); they are rendered when each event's message
//! is built, so a field one event lacks fails that message permanently (parked), and the
//! relay goes on with every other event. Each built-in sink then checks the rendered
//! destination against what its broker takes (a NATS subject, a Kafka topic name, a URL
//! path): a value it cannot take is that message's permanent failure too.
//!
//! [`RelayConfig::destination`]: super::RelayConfig::destination
//! [`RelayConfig::header`]: super::RelayConfig::header
//! [`RelayConfig::payload`]: super::RelayConfig::payload

mod config;
mod template;

use std::sync::Arc;

pub use template::{Template, TemplateError};

use super::Message;
use crate::error::{Error, Result};

/// How a relay sends each event's payload, set with
/// [`RelayConfig::payload`](super::RelayConfig::payload).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum PayloadForm {
    /// The JSON text exactly as `ordo.events` stores it. The default.
    #[default]
    Stored,
    /// A payload stored as a JSON **string** that holds a JSON object or array (what a writer
    /// that encoded its document itself stores: `'"{\"id\": 7}"'::jsonb`) is sent as that
    /// document (`{"id": 7}`), as Debezium's outbox router does with
    /// `table.expand.json.payload`; any other payload is sent as stored.
    Expanded,
}

/// The longest value a template may place in a header, in bytes.
pub const MAX_HEADER_VALUE: usize = 4096;

/// A template as set: parsed, or why it does not parse (reported when the relay starts).
pub(crate) type Parsed = std::result::Result<Arc<Template>, TemplateError>;

/// The routing of a relay (see the module docs).
#[derive(Debug, Clone, Default)]
pub(crate) struct Routing {
    pub(crate) destination: Option<Parsed>,
    pub(crate) headers: Vec<(String, Parsed)>,
    pub(crate) payload: PayloadForm,
}

/// Header names a template may not take: the ones the sinks write themselves, and the ones
/// that frame an HTTP request.
const RESERVED_HEADERS: [&str; 12] = [
    "content-type",
    "content-length",
    "content-encoding",
    "transfer-encoding",
    "connection",
    "host",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "traceparent",
    "tracestate",
];

/// Prefixes of header names the sinks and envelopes write.
const RESERVED_PREFIXES: [&str; 6] = ["ordo-", "ce-", "ce_", "cloudevents", "webhook-", "nats-"];

impl Routing {
    /// Whether the relay routes nothing by template and sends payloads as stored.
    fn is_plain(&self) -> bool {
        self.destination.is_none() && self.headers.is_empty() && self.payload == PayloadForm::Stored
    }

    /// The start-up check: every template parses, every header name is one a broker and an
    /// HTTP request carry, no name twice, none the sinks write themselves.
    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(Err(error)) = &self.destination {
            return Err(Error::InvalidConfig {
                setting: "destination",
                reason: error.to_string(),
            });
        }
        if let Some(Ok(template)) = &self.destination
            && template.as_str().is_empty()
        {
            return Error::invalid_config("destination", "the template is empty");
        }
        let mut seen: Vec<String> = Vec::new();
        for (name, template) in &self.headers {
            let lower = name.to_ascii_lowercase();
            let valid = !name.is_empty()
                && name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
            if !valid {
                return Err(Error::InvalidConfig {
                    setting: "header",
                    reason: format!(
                        "{} is not a header name every sink carries: 1 to 64 of A-Z, a-z, 0-9, `-`, `_`, `.`",
                        crate::relay::quoted(name)
                    ),
                });
            }
            if RESERVED_HEADERS.contains(&lower.as_str())
                || RESERVED_PREFIXES
                    .iter()
                    .any(|prefix| lower.starts_with(prefix))
            {
                return Err(Error::InvalidConfig {
                    setting: "header",
                    reason: format!(
                        "{name:?} is a header the sinks write themselves (Ordo-*, ce-*, webhook-*, Content-Type, traceparent, ...): choose another name"
                    ),
                });
            }
            if seen.contains(&lower) {
                return Err(Error::InvalidConfig {
                    setting: "header",
                    reason: format!("{name:?} is given twice (header names are case-insensitive)"),
                });
            }
            seen.push(lower);
            if let Err(error) = template {
                return Err(Error::InvalidConfig {
                    setting: "header",
                    reason: format!("header {name:?}: {error}"),
                });
            }
        }
        Ok(())
    }

    /// Renders the destination and the headers into `message`, and expands its payload;
    /// or why this message cannot be sent (its permanent failure).
    pub(crate) fn apply(&self, message: &mut Message) -> std::result::Result<(), String> {
        if self.is_plain() {
            return Ok(());
        }
        let templates = self
            .destination
            .iter()
            .chain(self.headers.iter().map(|(_, template)| template));
        let reads_payload = templates
            .filter_map(|template| template.as_ref().ok())
            .any(|template| template.reads_payload());
        let payload = if reads_payload {
            Some(template::parse_payload(message)?)
        } else {
            None
        };
        if let Some(Ok(template)) = &self.destination {
            message.destination = Some(template.render_with(message, payload.as_ref())?);
        }
        for (name, template) in &self.headers {
            let Ok(template) = template else { continue };
            let value = template.render_with(message, payload.as_ref())?;
            check_header_value(name, &value)?;
            message.header_fields.push((name.clone(), value));
        }
        if self.payload == PayloadForm::Expanded
            && let Some(expanded) = expand(&message.payload)
        {
            message.payload = expanded;
        }
        Ok(())
    }
}

/// A value a template placed in a header: no control character (a line break would forge
/// another header), at most [`MAX_HEADER_VALUE`] bytes.
fn check_header_value(name: &str, value: &str) -> std::result::Result<(), String> {
    if value.len() > MAX_HEADER_VALUE {
        return Err(format!(
            "header {name} would be {} bytes, past the {MAX_HEADER_VALUE} a relay places in a header",
            value.len()
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(format!(
            "header {name} would hold a control character (a line break, a tab): {}",
            crate::relay::quoted(value)
        ));
    }
    Ok(())
}

/// The document a payload stored as a JSON string holds, when it holds a JSON object or
/// array.
fn expand(payload: &[u8]) -> Option<bytes::Bytes> {
    if payload.first() != Some(&b'"') {
        return None;
    }
    let inner: String = serde_json::from_slice(payload).ok()?;
    let trimmed = inner.trim_start();
    if !(trimmed.starts_with('{') || trimmed.starts_with('[')) {
        return None;
    }
    serde_json::from_str::<&serde_json::value::RawValue>(&inner).ok()?;
    Some(bytes::Bytes::from(inner))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Parsed {
        Template::parse(text).map(Arc::new)
    }

    #[test]
    fn routing_fills_the_destination_and_the_headers() {
        let routing = Routing {
            destination: Some(parsed("orders.{payload:/region}")),
            headers: vec![("tenant".to_owned(), parsed("{payload:/tenant|none}"))],
            payload: PayloadForm::Stored,
        };
        assert!(routing.validate().is_ok());
        let mut message = Message::new(&br#"{"region": "eu"}"#[..]);
        routing.apply(&mut message).expect("routed");
        assert_eq!(message.destination.as_deref(), Some("orders.eu"));
        assert_eq!(
            message.header_fields,
            vec![("tenant".to_owned(), "none".to_owned())]
        );
        let mut hostile = Message::new(&br#"{"region": "eu", "tenant": "a\r\nX: 1"}"#[..]);
        let why = routing.apply(&mut hostile).expect_err("a line break");
        assert!(
            why.contains("control character") && !why.contains('\n'),
            "{why}"
        );
    }

    #[test]
    fn header_names_the_sinks_write_are_refused() {
        for name in [
            "Ordo-Position",
            "ce_id",
            "Content-Type",
            "a b",
            "",
            "webhook-id",
        ] {
            let routing = Routing {
                headers: vec![(name.to_owned(), parsed("x"))],
                ..Routing::default()
            };
            assert!(routing.validate().is_err(), "{name:?}");
        }
        let twice = Routing {
            headers: vec![
                ("Tenant".to_owned(), parsed("x")),
                ("tenant".to_owned(), parsed("y")),
            ],
            ..Routing::default()
        };
        assert!(twice.validate().is_err());
    }

    #[test]
    fn an_expanded_payload_is_the_document_a_string_holds() {
        let stored = br#""{\"id\": 7}""#;
        assert_eq!(expand(stored).as_deref(), Some(&br#"{"id": 7}"#[..]));
        assert_eq!(expand(br#"{"id": 7}"#), None);
        assert_eq!(expand(br#""just text""#), None);
        assert_eq!(expand(br#""{not json""#), None);
    }
}
