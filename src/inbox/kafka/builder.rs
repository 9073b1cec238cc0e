//! [`KafkaInboxBuilder`]: the settings of a [`KafkaInbox`], checked when it is built.

use std::fmt;
use std::time::Duration;

use rdkafka::ClientConfig;

use super::KafkaInbox;
use super::Redelivery;
use crate::error::{Error, Result};

/// The settings of a [`KafkaInbox`]: start with [`KafkaInbox::builder`].
#[must_use]
#[derive(Clone)]
pub struct KafkaInboxBuilder {
    pub(super) bootstrap: String,
    pub(super) group: String,
    pub(super) topics: Vec<String>,
    pub(super) properties: Vec<(String, String)>,
    pub(super) commit_interval: Duration,
    pub(super) session_timeout: Duration,
    pub(super) connect_timeout: Duration,
    pub(super) redelivery: Redelivery,
}

impl fmt::Debug for KafkaInboxBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self
            .properties
            .iter()
            .map(|(name, _)| name.as_str())
            .collect();
        f.debug_struct("KafkaInboxBuilder")
            .field("bootstrap", &self.bootstrap)
            .field("group", &self.group)
            .field("topics", &self.topics)
            .field("properties", &names)
            .field("commit_interval", &self.commit_interval)
            .field("session_timeout", &self.session_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("redelivery", &self.redelivery)
            .finish()
    }
}

impl KafkaInboxBuilder {
    /// A librdkafka setting of the consumer (TLS and SASL with the `kafka-tls` feature,
    /// `client.id`, `fetch.max.bytes`). Refused when built: the settings the adapter owns
    /// (`group.id`, `enable.auto.commit`, `enable.auto.offset.store`, `auto.offset.reset`,
    /// `bootstrap.servers`). Values are never shown (a password).
    pub fn property(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.push((name.into(), value.into()));
        self
    }

    /// How often the offsets of the records the inbox settled are committed. A crash
    /// redelivers what was settled since the last commit (the inbox answers `Duplicate`); a
    /// shorter interval is more commits. Default 1 s; 10 ms to 1 hour.
    pub fn commit_interval(mut self, interval: Duration) -> Self {
        self.commit_interval = interval;
        self
    }

    /// How long the group waits for a member that stopped (`session.timeout.ms`) before its
    /// partitions go to the others. Default 45 s (Kafka's); 1 s to 1 hour, and within what the
    /// brokers allow (`group.min.session.timeout.ms`, `group.max.session.timeout.ms`).
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// How long the start waits for the cluster's metadata. Default 5 s; at least 1 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// When records the inbox did not settle are fetched again. Default
    /// [`Redelivery::default`].
    pub fn redelivery(mut self, redelivery: Redelivery) -> Self {
        self.redelivery = redelivery;
        self
    }

    /// Checks the settings and returns the adapter; it connects in [`KafkaInbox::run`].
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the setting: an empty bootstrap list, group or topic
    /// list, a property the adapter owns or one librdkafka refuses, an interval or timeout out
    /// of range, a zero redelivery delay.
    pub fn build(self) -> Result<KafkaInbox> {
        if self.bootstrap.trim().is_empty() {
            return Error::invalid_config(
                "KafkaInbox bootstrap",
                "is empty; pass e.g. 127.0.0.1:9092",
            );
        }
        if self.group.is_empty() || self.group.len() > 255 {
            return Error::invalid_config("KafkaInbox group", "must be 1 to 255 bytes");
        }
        if self.topics.is_empty() {
            return Error::invalid_config("KafkaInbox topics", "name at least one topic");
        }
        for topic in &self.topics {
            crate::wire::kafka::check_topic(topic).map_err(|reason| Error::InvalidConfig {
                setting: "KafkaInbox topics",
                reason,
            })?;
        }
        if !(Duration::from_millis(10)..=Duration::from_secs(3600)).contains(&self.commit_interval)
        {
            return Error::invalid_config("KafkaInbox commit_interval", "must be 10 ms to 1 hour");
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&self.session_timeout) {
            return Error::invalid_config("KafkaInbox session_timeout", "must be 1 s to 1 hour");
        }
        if self.connect_timeout < Duration::from_secs(1) {
            return Error::invalid_config("KafkaInbox connect_timeout", "must be at least 1 s");
        }
        for (name, _) in &self.properties {
            if crate::wire::kafka::OWNED_PROPERTIES.contains(&name.as_str()) {
                return Err(Error::InvalidConfig {
                    setting: "KafkaInbox property",
                    reason: format!(
                        "{name:?} is set by the adapter itself: offsets are committed only once the inbox settled their records"
                    ),
                });
            }
        }
        self.redelivery.validate("KafkaInbox redelivery")?;
        let inbox = KafkaInbox { settings: self };
        inbox
            .config()
            .create_native_config()
            .map_err(|error| Error::InvalidConfig {
                setting: "KafkaInbox property",
                reason: format!("librdkafka refuses the consumer's settings: {error}"),
            })?;
        Ok(inbox)
    }
}

impl KafkaInbox {
    /// The consumer's settings.
    pub(super) fn config(&self) -> ClientConfig {
        let settings = &self.settings;
        let mut config = ClientConfig::new();
        for (name, value) in &settings.properties {
            config.set(name, value);
        }
        config
            .set("bootstrap.servers", &settings.bootstrap)
            .set("group.id", &settings.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set(
                "session.timeout.ms",
                settings.session_timeout.as_millis().to_string(),
            )
            // Heartbeats well inside the session: a third of it, as Kafka advises.
            .set(
                "heartbeat.interval.ms",
                (settings.session_timeout / 3).as_millis().to_string(),
            );
        config
    }
}
