//! [`KafkaSinkBuilder`]: the settings of a [`KafkaSink`], checked when it is built, and the
//! producer they make.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;

use super::{DEFAULT_DELIVERY_TIMEOUT, KafkaSink, Message, Producer, TopicFn};
use crate::error::{Error, Result};
use crate::relay::SendError;
use crate::relay::format::Framing;
#[cfg(doc)]
use crate::relay::{RelayConfig, Sink};

/// The settings of a [`KafkaSink`]: start with [`KafkaSink::builder`].
#[must_use]
pub struct KafkaSinkBuilder {
    pub(super) bootstrap: String,
    pub(super) topic: Option<String>,
    pub(super) topic_fn: Option<TopicFn>,
    pub(super) properties: Vec<(String, String)>,
    pub(super) delivery_timeout: Option<Duration>,
    pub(super) connect_timeout: Duration,
}

impl fmt::Debug for KafkaSinkBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self
            .properties
            .iter()
            .map(|(name, _)| name.as_str())
            .collect();
        f.debug_struct("KafkaSinkBuilder")
            .field("bootstrap", &self.bootstrap)
            .field("topic", &self.topic)
            .field("custom_topic", &self.topic_fn.is_some())
            // Values may be passwords (`sasl.password`): names only.
            .field("properties", &names)
            .field("delivery_timeout", &self.delivery_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

impl KafkaSinkBuilder {
    /// The topic of every message without a [destination template](RelayConfig::destination).
    /// Required unless the relay has one or [`topic_fn`](Self::topic_fn) is set (a message
    /// with neither fails permanently).
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }

    /// The topic of each message, instead of the destination template and
    /// [`topic`](Self::topic). A topic name Kafka cannot take fails that message permanently.
    pub fn topic_fn(mut self, topic: impl Fn(&Message) -> String + Send + Sync + 'static) -> Self {
        self.topic_fn = Some(Arc::new(topic));
        self
    }

    /// A librdkafka setting of the producer (see librdkafka's `CONFIGURATION.md`): TLS and SASL
    /// (`security.protocol`, `sasl.mechanism`, `sasl.username`, `sasl.password`,
    /// `ssl.ca.location`; with the `kafka-tls` feature), `compression.type`, `linger.ms`,
    /// `client.id`. The settings the guarantees rest on are the sink's and refused when
    /// built: `bootstrap.servers`, `enable.idempotence`, `acks`, `message.timeout.ms` (see
    /// [`delivery_timeout`](Self::delivery_timeout)), `max.in.flight.requests.per.connection`,
    /// `partitioner`. Values are never shown (a password).
    pub fn property(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.push((name.into(), value.into()));
        self
    }

    /// How long librdkafka may try to deliver one record (`message.timeout.ms`), from its
    /// produce: past it, that message fails `Transient` (an attempt, unless the cluster does
    /// not answer the sink's probe either). At least 1 ms. Default: derived by the relay that
    /// runs the sink, half its batch deadline, at most 5 s (5 s without a relay); one set at or
    /// past the relay's batch deadline is refused when the relay starts (see
    /// [`Sink::fit_to_deadline`]).
    pub fn delivery_timeout(mut self, timeout: Duration) -> Self {
        self.delivery_timeout = Some(timeout);
        self
    }

    /// How long connecting to a broker may take (`socket.connection.setup.timeout.ms`).
    /// Default 5 s; at least 1 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Checks the settings and returns the sink. It connects on its first
    /// [`send`](Sink::send), so a cluster that is down now is an outage later, not a start-up
    /// failure.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the setting: an empty bootstrap list, an invalid
    /// [`topic`](Self::topic), a property the sink owns or one librdkafka refuses, a timeout
    /// out of range.
    pub fn build(self) -> Result<KafkaSink> {
        if self.bootstrap.trim().is_empty() {
            return Error::invalid_config("kafka bootstrap", "is empty; pass e.g. 127.0.0.1:9092");
        }
        if let Some(topic) = &self.topic {
            super::records::check_topic(topic).map_err(|error| Error::InvalidConfig {
                setting: "kafka topic",
                reason: error.message().to_owned(),
            })?;
        }
        if self
            .delivery_timeout
            .is_some_and(|timeout| timeout < Duration::from_millis(1))
        {
            return Error::invalid_config("kafka delivery_timeout", "must be at least 1 ms");
        }
        if self.connect_timeout < Duration::from_secs(1) {
            return Error::invalid_config(
                "kafka connect_timeout",
                "must be at least 1 s (librdkafka's least)",
            );
        }
        for (name, _) in &self.properties {
            if crate::wire::kafka::OWNED_PROPERTIES.contains(&name.as_str()) {
                return Err(Error::InvalidConfig {
                    setting: "kafka property",
                    reason: format!(
                        "{name:?} is set by the sink itself (idempotent producer, acks=all, the delivery timeout, the Java client's partitioner): the guarantees rest on it"
                    ),
                });
            }
        }
        let topic = match (self.topic_fn, self.topic) {
            (Some(topic_fn), _) => topic_fn,
            (None, topic) => Arc::new(move |message: &Message| {
                message
                    .destination
                    .clone()
                    .or_else(|| topic.clone())
                    .unwrap_or_default()
            }),
        };
        let sink = KafkaSink {
            bootstrap: self.bootstrap,
            topic,
            properties: self.properties,
            configured_timeout: self.delivery_timeout,
            delivery_timeout: self.delivery_timeout.unwrap_or(DEFAULT_DELIVERY_TIMEOUT),
            connect_timeout: self.connect_timeout,
            producer: None,
            framing: Framing::default(),
            known_topics: HashSet::new(),
            last_topic: None,
            dirty: false,
        };
        // librdkafka checks every setting when a client is made: a refused one is refused here,
        // not at the first send.
        sink.config()
            .create_native_config()
            .map_err(|error| Error::InvalidConfig {
                setting: "kafka property",
                reason: format!("librdkafka refuses the producer's settings: {error}"),
            })?;
        Ok(sink)
    }
}

impl KafkaSink {
    /// The producer's settings.
    fn config(&self) -> ClientConfig {
        let millis = |duration: Duration| duration.as_millis().max(1).to_string();
        let mut config = ClientConfig::new();
        for (name, value) in &self.properties {
            config.set(name, value);
        }
        config
            .set("bootstrap.servers", &self.bootstrap)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("partitioner", "murmur2_random")
            .set("message.timeout.ms", millis(self.delivery_timeout))
            // A request the broker does not answer is given up no later than its record.
            .set("request.timeout.ms", millis(self.delivery_timeout))
            .set(
                "socket.connection.setup.timeout.ms",
                millis(self.connect_timeout),
            );
        config
    }

    /// The producer, made now if there is none (making one connects nothing yet).
    pub(super) fn producer(&mut self) -> Result<&Producer, SendError> {
        if self.producer.is_none() {
            let producer = self
                .config()
                .create_with_context::<_, Producer>(crate::telemetry::Logs)
                .map_err(|error| {
                    SendError::transient(format!("creating the Kafka producer: {error}"))
                })?;
            self.producer = Some(producer);
        }
        self.producer
            .as_ref()
            .ok_or_else(|| SendError::transient("no Kafka producer"))
    }
}
