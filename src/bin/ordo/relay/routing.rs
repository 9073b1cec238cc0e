//! The settings of `ordo relay run` that route without code (the destination and headers from
//! templates, the payload's form, the envelope), and the Kafka sink's. Flattened into
//! [`Settings`](super::settings::Settings), so a file's lines and the flags share them.

use std::time::Duration;

use ordo::relay::{Format, PayloadForm, RelayConfig};

use crate::parse::parse_duration;

/// `--payload`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PayloadArg {
    /// The JSON text as stored.
    Stored,
    /// A JSON string holding a document is sent as that document.
    Expanded,
}

/// `--format`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FormatArg {
    /// ordo's own headers.
    Ordo,
    /// CloudEvents 1.0, attributes as headers.
    CloudeventsBinary,
    /// CloudEvents 1.0, a JSON event holding the payload.
    CloudeventsStructured,
}

/// `--signature`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SignatureArg {
    /// Ordo-Timestamp and Ordo-Signature.
    Ordo,
    /// Standard Webhooks 1.0: webhook-id, webhook-timestamp, webhook-signature.
    StandardWebhooks,
}

/// Routing, envelope and the sinks' settings added with them.
#[derive(clap::Args, Debug, Default, Clone)]
pub(crate) struct Routing {
    /// Where each event goes, from a template over the event: the NATS subject, the Kafka
    /// topic, the RabbitMQ routing key, or the path after the webhook's URL. Fields:
    /// {event_type}, {key}, {id}, {source}, {payload:/json/pointer}, {header:NAME}, with a
    /// default after | ({payload:/region|eu}). An event without a field is parked alone.
    #[arg(long, help_heading = "Routing", value_name = "TEMPLATE")]
    pub(crate) destination: Option<String>,
    /// A header sent with each event, its value from a template (repeat for more):
    /// tenant={payload:/tenant_id}.
    #[arg(
        long = "header",
        help_heading = "Routing",
        value_name = "NAME=TEMPLATE"
    )]
    pub(crate) headers: Option<Vec<String>>,
    /// The payload as stored, or expanded from a JSON string holding a document [default: stored].
    #[arg(long, help_heading = "Routing", value_enum)]
    pub(crate) payload: Option<PayloadArg>,
    /// The envelope: ordo's headers, or CloudEvents [default: ordo].
    #[arg(long, help_heading = "Routing", value_enum)]
    pub(crate) format: Option<FormatArg>,
    /// The name receivers know this database's events by (Ordo-Source; the CloudEvents source)
    /// [default: none; CloudEvents use the relay's name].
    #[arg(long, help_heading = "Routing", value_name = "NAME")]
    pub(crate) source: Option<String>,

    /// The topic of events without a --destination.
    #[arg(long, help_heading = "Kafka", value_name = "TOPIC")]
    pub(crate) topic: Option<String>,
    /// The longest librdkafka tries to deliver one record [default: half the batch deadline, at most 5s].
    #[arg(long, help_heading = "Kafka", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) delivery_timeout: Option<Duration>,
    /// A librdkafka producer setting, NAME=VALUE (repeat for more): security.protocol=SASL_SSL.
    /// Passwords only in the --config file.
    #[arg(
        long = "kafka-property",
        help_heading = "Kafka",
        value_name = "NAME=VALUE"
    )]
    pub(crate) kafka_properties: Option<Vec<String>>,

    /// The webhook's signature scheme [default: ordo].
    #[arg(long, help_heading = "Webhook", value_enum)]
    pub(crate) signature: Option<SignatureArg>,
    /// The environment variable holding a second signing secret, while receivers move to a
    /// new one (every request is signed with both).
    #[arg(long, help_heading = "Webhook", value_name = "VARIABLE")]
    pub(crate) also_secret_env: Option<String>,
}

/// `a`'s lists with `b`'s after them; `a`'s value otherwise.
fn joined(a: Option<Vec<String>>, b: Option<Vec<String>>) -> Option<Vec<String>> {
    match (a, b) {
        (Some(mut a), Some(b)) => {
            a.extend(b);
            Some(a)
        }
        (a, b) => a.or(b),
    }
}

impl Routing {
    /// These settings, with what they leave out taken from `fallback`; lists are joined
    /// (a header named twice keeps its first: the flag's, or the file's later line).
    pub(crate) fn or(self, fallback: Routing) -> Routing {
        Routing {
            destination: self.destination.or(fallback.destination),
            headers: joined(self.headers, fallback.headers),
            payload: self.payload.or(fallback.payload),
            format: self.format.or(fallback.format),
            source: self.source.or(fallback.source),
            topic: self.topic.or(fallback.topic),
            delivery_timeout: self.delivery_timeout.or(fallback.delivery_timeout),
            kafka_properties: joined(self.kafka_properties, fallback.kafka_properties),
            signature: self.signature.or(fallback.signature),
            also_secret_env: self.also_secret_env.or(fallback.also_secret_env),
        }
    }

    /// The Kafka and webhook settings given, by flag name and owner.
    pub(crate) fn owned(&self) -> [(bool, &'static str, &'static str); 5] {
        [
            (self.topic.is_some(), "topic", "kafka"),
            (self.delivery_timeout.is_some(), "delivery-timeout", "kafka"),
            (self.kafka_properties.is_some(), "kafka-property", "kafka"),
            (self.signature.is_some(), "signature", "webhook"),
            (self.also_secret_env.is_some(), "also-secret-env", "webhook"),
        ]
    }

    /// `config` with this routing; a `--header` without `=` is refused here, the templates
    /// when the relay starts (pointing at the mistake).
    pub(crate) fn apply(&self, mut config: RelayConfig) -> Result<RelayConfig, String> {
        if let Some(template) = &self.destination {
            config = config.destination(template);
        }
        let mut named: Vec<String> = Vec::new();
        for header in self.headers.iter().flatten() {
            let Some((name, template)) = header.split_once('=') else {
                return Err(format!(
                    "--header {header:?}: expected NAME=TEMPLATE, e.g. tenant={{payload:/tenant_id}}"
                ));
            };
            let name = name.trim();
            // The first of a name wins: a flag over the file, a later line over an earlier.
            if named.iter().any(|seen| seen.eq_ignore_ascii_case(name)) {
                continue;
            }
            named.push(name.to_owned());
            config = config.header(name, template.trim());
        }
        if let Some(payload) = self.payload {
            config = config.payload(match payload {
                PayloadArg::Stored => PayloadForm::Stored,
                PayloadArg::Expanded => PayloadForm::Expanded,
            });
        }
        if let Some(format) = self.format {
            config = config.format(match format {
                FormatArg::Ordo => Format::Ordo,
                FormatArg::CloudeventsBinary => Format::CloudEventsBinary,
                FormatArg::CloudeventsStructured => Format::CloudEventsStructured,
            });
        }
        if let Some(source) = &self.source {
            config = config.source(source);
        }
        Ok(config)
    }

    /// The `--kafka-property` pairs; a flag naming a secret is refused (the file holds those).
    #[cfg(feature = "kafka")]
    pub(crate) fn kafka_properties(&self) -> Result<Vec<(String, String)>, String> {
        self.kafka_properties
            .iter()
            .flatten()
            .map(|pair| {
                let (name, value) = pair.split_once('=').ok_or_else(|| {
                    format!(
                        "--kafka-property {pair:?}: expected NAME=VALUE, e.g. compression.type=lz4"
                    )
                })?;
                Ok((name.trim().to_owned(), value.trim().to_owned()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_join_and_the_first_header_of_a_name_wins() {
        let flags = Routing {
            headers: Some(vec!["tenant={payload:/t}".to_owned()]),
            ..Routing::default()
        };
        let file = Routing {
            headers: Some(vec!["Tenant=x".to_owned(), "region=eu".to_owned()]),
            destination: Some("orders.{event_type}".to_owned()),
            ..Routing::default()
        };
        let merged = flags.or(file);
        assert_eq!(merged.headers.as_ref().map(Vec::len), Some(3));
        assert!(merged.apply(RelayConfig::new("r")).is_ok());
        let bad = Routing {
            headers: Some(vec!["no-equals".to_owned()]),
            ..Routing::default()
        };
        assert!(
            bad.apply(RelayConfig::new("r"))
                .is_err_and(|e| e.contains("NAME=TEMPLATE"))
        );
    }
}
