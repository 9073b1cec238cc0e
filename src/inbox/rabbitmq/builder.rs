//! [`RabbitInboxBuilder`]: the settings of a [`RabbitInbox`], checked when it is built.

use std::fmt;
use std::time::Duration;

use super::RabbitInbox;
use crate::error::{Error, Result};
use crate::inbox::transport::Redelivery;
use crate::wire::redact_url;

/// The settings of a [`RabbitInbox`]: start with [`RabbitInbox::builder`].
#[must_use]
#[derive(Clone)]
pub struct RabbitInboxBuilder {
    pub(super) uri: String,
    pub(super) queue: String,
    pub(super) declare: bool,
    pub(super) bindings: Vec<(String, String)>,
    pub(super) prefetch: u16,
    pub(super) connect_timeout: Duration,
    pub(super) redelivery: Redelivery,
}

impl fmt::Debug for RabbitInboxBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitInboxBuilder")
            .field("uri", &redact_url(&self.uri))
            .field("queue", &self.queue)
            .field("declare", &self.declare)
            .field("bindings", &self.bindings)
            .field("prefetch", &self.prefetch)
            .field("connect_timeout", &self.connect_timeout)
            .field("redelivery", &self.redelivery)
            .finish()
    }
}

impl RabbitInboxBuilder {
    /// Whether the adapter declares the queue, its dead-letter queue and exchange, and its
    /// bindings (see the [module docs](super#dead-letters-derived-from-the-queue-name)).
    /// Default true. Off, the queue must exist; nothing is declared or bound.
    pub fn declare(mut self, declare: bool) -> Self {
        self.declare = declare;
        self
    }

    /// Binds the queue to `exchange` with `routing_key` (a pattern, for a topic exchange), when
    /// declaring. An ordo relay's [`RabbitSink`](crate::relay::rabbitmq::RabbitSink) routes by
    /// event type: `.bind("orders", "#")` takes every type.
    pub fn bind(mut self, exchange: impl Into<String>, routing_key: impl Into<String>) -> Self {
        self.bindings.push((exchange.into(), routing_key.into()));
        self
    }

    /// How many deliveries may be unacknowledged at once (`basic.qos`), the ones waiting out a
    /// redelivery delay included. Default 100; at least 1.
    pub fn prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// How long connecting may take. Default 5 s; not zero.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// When deliveries the inbox did not settle are delivered again. Default
    /// [`Redelivery::default`].
    pub fn redelivery(mut self, redelivery: Redelivery) -> Self {
        self.redelivery = redelivery;
        self
    }

    /// Checks the settings and returns the adapter; it connects in [`RabbitInbox::run`].
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the setting: an empty URI, a queue name that is empty,
    /// starts with `amq.` or is too long for its `.dlq` to fit 255 bytes, a zero prefetch or
    /// timeout, a zero redelivery delay.
    pub fn build(self) -> Result<RabbitInbox> {
        if self.uri.trim().is_empty() {
            return Error::invalid_config(
                "RabbitInbox uri",
                "is empty; pass e.g. amqp://guest:guest@127.0.0.1:5672/%2f",
            );
        }
        if self.queue.is_empty() || self.queue.starts_with("amq.") || self.queue.len() > 251 {
            return Error::invalid_config(
                "RabbitInbox queue",
                "must be 1 to 251 bytes (its dead-letter queue adds .dlq) and not start with amq.",
            );
        }
        if self
            .bindings
            .iter()
            .any(|(exchange, key)| exchange.len() > 255 || key.len() > 255)
        {
            return Error::invalid_config(
                "RabbitInbox bind",
                "exchange names and routing keys are at most 255 bytes",
            );
        }
        if self.prefetch == 0 {
            return Error::invalid_config("RabbitInbox prefetch", "must be at least 1");
        }
        if self.connect_timeout.is_zero() {
            return Error::invalid_config("RabbitInbox connect_timeout", "must be more than zero");
        }
        self.redelivery.validate("RabbitInbox redelivery")?;
        Ok(RabbitInbox { settings: self })
    }
}
