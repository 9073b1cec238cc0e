//! [`RabbitSinkBuilder`]: the settings of a [`RabbitSink`], checked when it is built.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{DEFAULT_CONFIRM_TIMEOUT, Message, RabbitSink, RouteFn, SHORT_STRING_MAX};
use crate::error::{Error, Result};
#[cfg(doc)]
use crate::relay::Sink;

/// The settings of a [`RabbitSink`]: start with [`RabbitSink::builder`].
#[must_use]
pub struct RabbitSinkBuilder {
    pub(super) uri: String,
    pub(super) exchange: String,
    pub(super) route: Option<RouteFn>,
    pub(super) pipeline_depth: usize,
    pub(super) connect_timeout: Duration,
    pub(super) confirm_timeout: Option<Duration>,
}

impl fmt::Debug for RabbitSinkBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitSinkBuilder")
            .field("uri", &crate::wire::redact_url(&self.uri))
            .field("exchange", &self.exchange)
            .field("custom_route", &self.route.is_some())
            .field("pipeline_depth", &self.pipeline_depth)
            .field("connect_timeout", &self.connect_timeout)
            .field("confirm_timeout", &self.confirm_timeout)
            .finish()
    }
}

impl RabbitSinkBuilder {
    /// The exchange of the default route (routing key = the event type). Default `""`, the
    /// broker's default exchange, which routes to the queue named by the routing key.
    pub fn exchange(mut self, exchange: impl Into<String>) -> Self {
        self.exchange = exchange.into();
        self
    }

    /// The exchange and routing key of each message, instead of the default route.
    pub fn route(
        mut self,
        route: impl Fn(&Message) -> (String, String) + Send + Sync + 'static,
    ) -> Self {
        self.route = Some(Arc::new(route));
        self
    }

    /// How many published messages may await their confirm at once. Default 128; not zero.
    pub fn pipeline_depth(mut self, depth: usize) -> Self {
        self.pipeline_depth = depth;
        self
    }

    /// How long connecting, opening the channel and enabling confirms may take. Default 5 s;
    /// not zero.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long to wait for one message's publisher confirm, from its publish: past it, that
    /// message fails `Transient` (an attempt, unless the broker does not answer the sink's
    /// probe either, which also waits at most this long: see
    /// [Errors](super#errors-whose-fault)). Not zero. Default: derived by the relay that
    /// runs the sink, half its batch deadline, at most 5 s (5 s without a relay); one set at
    /// or past the relay's batch deadline is refused when the relay starts (see
    /// [`Sink::fit_to_deadline`]).
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = Some(timeout);
        self
    }

    /// Checks the settings and returns the sink. It connects on its first
    /// [`send`](Sink::send), so a broker that is down now is a transient send error later.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the setting: an empty URI, an exchange name longer than
    /// 255 bytes, a zero `pipeline_depth` or `connect_timeout`.
    pub fn build(self) -> Result<RabbitSink> {
        if self.uri.trim().is_empty() {
            return Error::invalid_config(
                "rabbitmq uri",
                "is empty; pass e.g. amqp://guest:guest@127.0.0.1:5672/%2f",
            );
        }
        if self.exchange.len() > SHORT_STRING_MAX {
            return Error::invalid_config("rabbitmq exchange", "is longer than 255 bytes");
        }
        if self.pipeline_depth == 0 {
            return Error::invalid_config("rabbitmq pipeline_depth", "must be at least 1");
        }
        if self.connect_timeout.is_zero() {
            return Error::invalid_config("rabbitmq connect_timeout", "must be more than zero");
        }
        if self
            .confirm_timeout
            .is_some_and(|timeout| timeout.is_zero())
        {
            return Error::invalid_config("rabbitmq confirm_timeout", "must be more than zero");
        }
        let probed = self.route.is_none().then(|| self.exchange.clone());
        let route = self.route.unwrap_or_else(|| {
            let exchange = self.exchange;
            Arc::new(move |message: &Message| {
                let key = match &message.destination {
                    Some(destination) => destination.clone(),
                    None => message.type_or_untyped().to_owned(),
                };
                (exchange.clone(), key)
            })
        });
        Ok(RabbitSink {
            uri: self.uri,
            route,
            exchange: probed,
            pipeline_depth: self.pipeline_depth,
            connect_timeout: self.connect_timeout,
            configured_confirm_timeout: self.confirm_timeout,
            confirm_timeout: self.confirm_timeout.unwrap_or(DEFAULT_CONFIRM_TIMEOUT),
            connection: None,
            framing: crate::relay::format::Framing::default(),
            dirty: false,
        })
    }
}
