//! [`Template`]: text with fields of the event in braces (`orders.{event_type}`,
//! `{payload:/aggregate_type}.events`), parsed when the relay starts and rendered for each
//! message.
//!
//! A template that does not parse is the relay's configuration error, refused at start-up
//! with the position of the mistake. A template that parses but cannot be rendered for one
//! event (a field that event lacks, an object where text is needed) is that event's
//! permanent failure: parked, never the relay's.

use std::fmt;

use super::super::{Message, UNTYPED};

/// One field a template reads from a message.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Field {
    /// The event type (`untyped` without one).
    EventType,
    /// The message's ordering key.
    Key,
    /// The event id.
    Id,
    /// The relay's source name.
    Source,
    /// A value of the payload, by JSON pointer (RFC 6901).
    Payload(String),
    /// A value of the stored header map, by name.
    Header(String),
}

/// A piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Field {
        field: Field,
        /// What a missing (or `null`) value renders as; without it, a missing value fails the
        /// message.
        default: Option<String>,
        /// The field as written, for errors.
        written: String,
    },
}

/// A routing template: literal text and `{field}`s, with `{{` and `}}` for braces.
///
/// | field | value |
/// | --- | --- |
/// | `{event_type}` | the event type (`untyped` for an untyped event) |
/// | `{key}` | the ordering key |
/// | `{id}` | the event id |
/// | `{source}` | the relay's source name ([`RelayConfig::source`](crate::relay::RelayConfig::source)) |
/// | `{payload:/json/pointer}` | the payload's value at that JSON pointer (RFC 6901) |
/// | `{header:NAME}` | the value of the stored header `NAME` |
///
/// A string renders as itself, a number or boolean as its JSON text; a missing value, `null`
/// included, fails the message unless the field gives a default after `|`
/// (`{payload:/region|eu}`); an object or an array always fails it.
///
/// ```
/// use ordo::relay::{Message, Template};
///
/// let template = Template::parse("{payload:/aggregate}.{event_type}")?;
/// let message = Message::new(&br#"{"aggregate": "orders"}"#[..]).with_event_type(Some("Placed"));
/// assert_eq!(template.render(&message).as_deref(), Ok("orders.Placed"));
/// let refused = Template::parse("orders.{evnt_type}").unwrap_err();
/// assert!(refused.to_string().contains("unknown field `evnt_type`"));
/// # Ok::<(), ordo::relay::TemplateError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    text: String,
    parts: Vec<Part>,
}

/// Why a template does not parse: the template, where, and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError {
    template: String,
    /// The character (0-based) where the mistake is.
    at: usize,
    reason: String,
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // One line (a CLI escapes line breaks): the position, and the text up to it.
        let shown = crate::telemetry::printable(&self.template);
        let before: String = self.template.chars().take(self.at).collect();
        write!(
            f,
            "template \"{shown}\", at character {} (after \"{}\"): {}",
            self.at + 1,
            crate::telemetry::printable(&before),
            self.reason
        )
    }
}

impl std::error::Error for TemplateError {}

/// The fields a template may name, for errors.
const FIELDS: &str = "event_type, key, id, source, payload:/JSON/POINTER, header:NAME";

impl Template {
    /// Parses `text`.
    ///
    /// # Errors
    ///
    /// [`TemplateError`] naming the character of the first mistake: an unknown field, a `{`
    /// never closed, a lone `}` (write `}}`), an empty field, a payload pointer that does not
    /// start with `/`, a header field without a name.
    pub fn parse(text: &str) -> Result<Self, TemplateError> {
        let refuse = |at: usize, reason: String| TemplateError {
            template: text.to_owned(),
            at,
            reason,
        };
        let chars: Vec<char> = text.chars().collect();
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut index = 0;
        while index < chars.len() {
            match chars[index] {
                '{' if chars.get(index + 1) == Some(&'{') => {
                    literal.push('{');
                    index += 2;
                }
                '}' if chars.get(index + 1) == Some(&'}') => {
                    literal.push('}');
                    index += 2;
                }
                '}' => {
                    return Err(refuse(
                        index,
                        "a `}` without its `{` (write `}}` for a brace)".to_owned(),
                    ));
                }
                '{' => {
                    let Some(length) = chars[index + 1..].iter().position(|c| *c == '}') else {
                        return Err(refuse(index, "a `{` that is never closed".to_owned()));
                    };
                    let written: String = chars[index + 1..index + 1 + length].iter().collect();
                    let (field, default) =
                        parse_field(&written).map_err(|reason| refuse(index + 1, reason))?;
                    if !literal.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Field {
                        field,
                        default,
                        written,
                    });
                    index += length + 2;
                }
                other => {
                    literal.push(other);
                    index += 1;
                }
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Text(literal));
        }
        Ok(Self {
            text: text.to_owned(),
            parts,
        })
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether it reads the payload (so rendering parses it).
    pub(crate) fn reads_payload(&self) -> bool {
        self.parts.iter().any(|part| {
            matches!(
                part,
                Part::Field {
                    field: Field::Payload(_),
                    ..
                }
            )
        })
    }

    /// The template's text for `message`.
    ///
    /// # Errors
    ///
    /// Why it cannot be rendered for this message (a field it lacks, an object where text is
    /// needed, a payload that is not JSON): the message's permanent failure.
    pub fn render(&self, message: &Message) -> Result<String, String> {
        let payload = if self.reads_payload() {
            Some(parse_payload(message)?)
        } else {
            None
        };
        self.render_with(message, payload.as_ref())
    }

    /// As [`render`](Self::render), with the payload already parsed (once for every template
    /// of a relay).
    pub(crate) fn render_with(
        &self,
        message: &Message,
        payload: Option<&serde_json::Value>,
    ) -> Result<String, String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Field {
                    field,
                    default,
                    written,
                } => match (value_of(field, message, payload)?, default) {
                    (Some(value), _) => out.push_str(&value),
                    (None, Some(default)) => out.push_str(default),
                    (None, None) => {
                        let written = crate::telemetry::printable(written);
                        return Err(format!(
                            "the event has no {} (template {}, field {{{written}}}; a default is written {{{written}|DEFAULT}})",
                            missing(field),
                            crate::relay::quoted(&self.text),
                        ));
                    }
                },
            }
        }
        Ok(out)
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The payload of `message` as JSON, for the templates that read it.
pub(crate) fn parse_payload(message: &Message) -> Result<serde_json::Value, String> {
    serde_json::from_slice(&message.payload).map_err(|error| {
        format!("the payload is not JSON, so a template cannot read its fields: {error}")
    })
}

fn parse_field(written: &str) -> Result<(Field, Option<String>), String> {
    let (name, default) = match written.split_once('|') {
        Some((name, default)) => (name, Some(default.to_owned())),
        None => (written, None),
    };
    let field = match name {
        "" => return Err(format!("an empty field (the fields: {FIELDS})")),
        "event_type" => Field::EventType,
        "key" => Field::Key,
        "id" => Field::Id,
        "source" => Field::Source,
        _ => {
            if let Some(pointer) = name.strip_prefix("payload:") {
                if !pointer.starts_with('/') {
                    return Err(format!(
                        "`{}`: a payload field is a JSON pointer starting with `/` (payload:/customer/id)",
                        crate::telemetry::printable(name)
                    ));
                }
                Field::Payload(pointer.to_owned())
            } else if let Some(header) = name.strip_prefix("header:") {
                if header.is_empty() {
                    return Err("`header:` without a header name".to_owned());
                }
                Field::Header(header.to_owned())
            } else {
                return Err(format!(
                    "unknown field `{}` (the fields: {FIELDS})",
                    crate::telemetry::printable(name)
                ));
            }
        }
    };
    Ok((field, default))
}

/// The value of `field` for `message`: `None` when missing (or `null`).
fn value_of(
    field: &Field,
    message: &Message,
    payload: Option<&serde_json::Value>,
) -> Result<Option<String>, String> {
    let found = match field {
        Field::EventType => Some(
            message
                .event_type
                .clone()
                .unwrap_or_else(|| UNTYPED.to_owned()),
        ),
        Field::Key => message.key.clone(),
        Field::Id => Some(message.id.to_string()),
        Field::Source => message.source.clone(),
        Field::Payload(pointer) => text_of(payload.and_then(|json| json.pointer(pointer)), field)?,
        Field::Header(name) => text_of(message.headers.get(name), field)?,
    };
    Ok(found)
}

/// A JSON value as template text: a string as itself, a number or boolean as its JSON text.
fn text_of(value: Option<&serde_json::Value>, field: &Field) -> Result<Option<String>, String> {
    use serde_json::Value;
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(Value::Number(number)) => Ok(Some(number.to_string())),
        Some(Value::Bool(flag)) => Ok(Some(flag.to_string())),
        Some(Value::Array(_) | Value::Object(_)) => Err(format!(
            "the {} is an object or an array, not a text a template can use",
            missing(field)
        )),
    }
}

/// What a field is called in an error about it.
fn missing(field: &Field) -> String {
    match field {
        Field::EventType => "event type".to_owned(),
        Field::Key => "ordering key".to_owned(),
        Field::Id => "id".to_owned(),
        Field::Source => "source name (RelayConfig::source, --source)".to_owned(),
        Field::Payload(pointer) => format!("payload field {}", crate::relay::quoted(pointer)),
        Field::Header(name) => format!("header {}", crate::relay::quoted(name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(payload: &str) -> Message {
        Message::new(payload.as_bytes().to_vec()).with_event_type(Some("Placed"))
    }

    #[test]
    fn fields_render_from_the_event() {
        let template = Template::parse(
            "{event_type}.{payload:/order/region}.{payload:/n}.{key|nokey}.{header:tenant}",
        )
        .expect("parses");
        let mut headers = crate::envelope::Headers::new();
        headers.insert("tenant".into(), serde_json::json!("acme"));
        let message = message(r#"{"order": {"region": "eu"}, "n": 7}"#).with_headers(headers);
        assert_eq!(
            template.render(&message).as_deref(),
            Ok("Placed.eu.7.nokey.acme")
        );
        let braces = Template::parse("{{literal}}-{id}").expect("parses");
        let rendered = braces.render(&message).expect("renders");
        assert_eq!(rendered, format!("{{literal}}-{}", message.id));
        let untyped = Message::new(&b"{}"[..]);
        let typed = Template::parse("t.{event_type}").expect("parses");
        assert_eq!(typed.render(&untyped).as_deref(), Ok("t.untyped"));
    }

    #[test]
    fn a_missing_field_fails_the_message_and_says_which() {
        let template = Template::parse("orders.{payload:/aggregate_type}").expect("parses");
        let why = template
            .render(&message(r#"{"other": 1}"#))
            .expect_err("missing");
        assert!(why.contains("payload field \"/aggregate_type\""), "{why}");
        let null = template.render(&message(r#"{"aggregate_type": null}"#));
        assert!(null.is_err());
        let object = template.render(&message(r#"{"aggregate_type": {"a": 1}}"#));
        assert!(object.is_err_and(|why| why.contains("object or an array")));
        let not_json = template.render(&message("not json"));
        assert!(not_json.is_err_and(|why| why.contains("not JSON")));
    }

    #[test]
    fn a_bad_template_points_at_the_mistake() {
        let cases = [
            ("orders.{evnt_type}", 8, "unknown field `evnt_type`"),
            ("orders.{event_type", 7, "never closed"),
            ("orders}", 6, "without its `{`"),
            ("a.{}", 3, "an empty field"),
            ("{payload:aggregate}", 1, "JSON pointer"),
            ("{header:}", 1, "without a header name"),
        ];
        for (text, at, reason) in cases {
            let error = Template::parse(text).expect_err(text);
            assert_eq!(error.at, at, "{text}");
            let shown = error.to_string();
            assert!(shown.contains(reason), "{shown}");
            let before: String = text.chars().take(at).collect();
            assert!(shown.contains(&format!("(after \"{before}\")")), "{shown}");
            assert!(!shown.contains('\n'), "{shown}");
        }
    }
}
