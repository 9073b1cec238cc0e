//! [`NatsInbox`]: consume a NATS JetStream durable consumer into an [`Inbox`].
//!
//! Each message goes through [`Inbox::receive`]; the adapter acknowledges it to JetStream only
//! after the inbox transaction has committed (or the inbox already held its outcome). A
//! process that dies between the commit and the ack has the message redelivered after the
//! consumer's [`ack_wait`](NatsInboxBuilder::ack_wait); the inbox answers `Duplicate` and the
//! adapter acknowledges it then. What the adapter does for each answer is in the
//! [inbox module docs](super#broker-adapters).
//!
//! # The message
//!
//! | JetStream | [`InboxMessage`](super::InboxMessage) |
//! | --- | --- |
//! | header `Nats-Msg-Id` | `id` (required: a message without it is terminated, `TERM`) |
//! | the body (UTF-8 text) | `payload` |
//! | header `Ordo-Headers` (a JSON object) | `headers` |
//! | headers `Ordo-Source`, `Ordo-Position` (and `Ordo-Lane` `commit`, or none) | `source`, `position`, for [`InboxMode::Watermark`](super::InboxMode::Watermark) |
//!
//! An ordo relay with a [`NatsSink`](crate::relay::nats::NatsSink) sets all of them; set
//! [`RelayConfig::source`](crate::relay::RelayConfig::source) for watermark mode.
//!
//! # The consumer
//!
//! The adapter creates (or updates) the durable pull consumer on the stream with explicit
//! acks, its `ack_wait`, `max_ack_pending` and subject filter, and no delivery limit: the
//! inbox counts attempts and keeps the dead letters. Any number of adapters (tasks, processes)
//! may share one durable consumer: JetStream spreads the messages, and the inbox runs a
//! message redelivered to a second adapter while the first still handles it only once.
//!
//! # The stream
//!
//! The adapter creates its consumer, never the stream: the stream must exist when
//! [`NatsInbox::run`] starts, or it returns [`Error::Broker`] (`stream "ORDERS": ...`). It is
//! the stream the sender's [`NatsSink`](crate::relay::nats::NatsSink) publishes to; create it
//! as the relay docs show ([Preparing the stream](crate::relay::nats#preparing-the-stream)),
//! with the client ordo re-exports, [`ordo::relay::nats::async_nats`](crate::relay::nats::async_nats),
//! so that no `async-nats` dependency of your own is needed. The adapter's API takes no client
//! types.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::{self, AckKind};
use futures::StreamExt;

use super::Inbox;
use super::adapter::{self, Transport};
use super::handler::InboxHandler;
use super::transport::{Parts, Redelivery, Settle};
use crate::error::{Error, Result};
use crate::wire::nats as wire;
use crate::wire::redact_url;

/// The settings of a [`NatsInbox`]: start with [`NatsInbox::builder`].
#[must_use]
#[derive(Clone)]
pub struct NatsInboxBuilder {
    url: String,
    stream: String,
    durable: String,
    filter_subject: Option<String>,
    ack_wait: Duration,
    max_ack_pending: i64,
    connect_timeout: Duration,
    redelivery: Redelivery,
}

impl fmt::Debug for NatsInboxBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsInboxBuilder")
            .field("url", &redact_url(&self.url))
            .field("stream", &self.stream)
            .field("durable", &self.durable)
            .field("filter_subject", &self.filter_subject)
            .field("ack_wait", &self.ack_wait)
            .field("max_ack_pending", &self.max_ack_pending)
            .field("connect_timeout", &self.connect_timeout)
            .field("redelivery", &self.redelivery)
            .finish()
    }
}

impl NatsInboxBuilder {
    /// Only messages on subjects matching `subject` (wildcards allowed). Default: the whole
    /// stream.
    pub fn filter_subject(mut self, subject: impl Into<String>) -> Self {
        self.filter_subject = Some(subject.into());
        self
    }

    /// How long JetStream waits for an ack before it delivers a message again (to this adapter
    /// or another). Longer than the slowest handler, or a slow message is redelivered while it
    /// runs (the inbox answers that redelivery `Busy`). Default 30 s; 1 s to
    /// [`MAX_LEASE`](crate::MAX_LEASE) (24 hours: after a crash, JetStream holds the message
    /// from every receiver for the whole `ack_wait`).
    pub fn ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = ack_wait;
        self
    }

    /// How many messages may be delivered and not yet acknowledged at once (JetStream's
    /// `max_ack_pending`), the redeliveries waiting out a delay included. Default 1,000; at
    /// least 1.
    pub fn max_ack_pending(mut self, max: i64) -> Self {
        self.max_ack_pending = max;
        self
    }

    /// How long to wait for the server when connecting. Default 5 s; not zero.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// When messages the inbox did not settle are delivered again. Default
    /// [`Redelivery::default`].
    pub fn redelivery(mut self, redelivery: Redelivery) -> Self {
        self.redelivery = redelivery;
        self
    }

    /// Checks the settings and returns the adapter; it connects in [`NatsInbox::run`].
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the setting: an empty URL, a stream or durable name
    /// JetStream does not accept, an `ack_wait` under 1 s or over 24 hours, a zero `max_ack_pending` or
    /// `connect_timeout`, a zero redelivery delay.
    pub fn build(self) -> Result<NatsInbox> {
        if self.url.trim().is_empty() {
            return Error::invalid_config(
                "NatsInbox url",
                "is empty; pass e.g. nats://127.0.0.1:4222",
            );
        }
        for (setting, name) in [
            ("NatsInbox stream", &self.stream),
            ("NatsInbox durable", &self.durable),
        ] {
            let bad = name.is_empty()
                || name
                    .chars()
                    .any(|c| c.is_whitespace() || matches!(c, '.' | '*' | '>' | '/' | '\\'));
            if bad {
                return Err(Error::InvalidConfig {
                    setting,
                    reason: format!(
                        "{name:?} is not a JetStream name: non-empty, without spaces, '.', '*', '>', '/' or '\\'"
                    ),
                });
            }
        }
        if self.ack_wait < Duration::from_secs(1) || self.ack_wait > crate::MAX_LEASE {
            return Error::invalid_config(
                "NatsInbox ack_wait",
                "must be 1 second to 24 hours: after a crash, JetStream holds the message from every receiver that long",
            );
        }
        if self.max_ack_pending < 1 {
            return Error::invalid_config("NatsInbox max_ack_pending", "must be at least 1");
        }
        if self.connect_timeout.is_zero() {
            return Error::invalid_config("NatsInbox connect_timeout", "must be more than zero");
        }
        self.redelivery.validate("NatsInbox redelivery")?;
        Ok(NatsInbox { settings: self })
    }
}

/// Consumes a JetStream durable consumer into an [`Inbox`] (see the [module docs](self)).
///
/// ```no_run
/// # async fn run(inbox: ordo::inbox::Inbox, handler: impl ordo::inbox::InboxHandler) -> ordo::Result<()> {
/// use std::time::Duration;
/// use ordo::inbox::NatsInbox;
///
/// let adapter = NatsInbox::builder("nats://127.0.0.1:4222", "ORDERS", "billing")
///     .filter_subject("orders.>")
///     .ack_wait(Duration::from_secs(30))
///     .build()?;
/// // Runs until ctrl-c; each message acknowledged once the inbox has settled it.
/// adapter
///     .run(&inbox, &handler, async {
///         let _ = tokio::signal::ctrl_c().await;
///     })
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct NatsInbox {
    settings: NatsInboxBuilder,
}

impl NatsInbox {
    /// An adapter for the durable consumer `durable` of stream `stream` on the server at `url`.
    pub fn builder(
        url: impl Into<String>,
        stream: impl Into<String>,
        durable: impl Into<String>,
    ) -> NatsInboxBuilder {
        NatsInboxBuilder {
            url: url.into(),
            stream: stream.into(),
            durable: durable.into(),
            filter_subject: None,
            ack_wait: Duration::from_secs(30),
            max_ack_pending: 1_000,
            connect_timeout: Duration::from_secs(5),
            redelivery: Redelivery::default(),
        }
    }

    /// Receives messages into `inbox`, handled by `handler`, one at a time, until `shutdown`
    /// completes; then finishes the message in hand, flushes its acks and returns. Lost
    /// connections and failed pulls are logged and retried; they do not end the run.
    ///
    /// # Errors
    /// [`Error::Broker`] when the start fails: the server cannot be reached, the stream does
    /// not exist, the consumer cannot be created (e.g. a push consumer of that name exists).
    ///
    /// # Cancel safety
    /// Dropping the future is a crash: the message in hand is rolled back or, if its inbox
    /// transaction committed, redelivered after `ack_wait` and answered `Duplicate`.
    pub async fn run<H: InboxHandler>(
        &self,
        inbox: &Inbox,
        handler: &H,
        shutdown: impl Future<Output = ()>,
    ) -> Result<()> {
        adapter::run(self, inbox, handler, shutdown).await
    }

    /// The durable pull consumer, created or updated to these settings.
    async fn consumer(&self, client: &async_nats::Client) -> Result<PullConsumer> {
        let settings = &self.settings;
        let jetstream = jetstream::new(client.clone());
        let stream = jetstream
            .get_stream(&settings.stream)
            .await
            .map_err(|error| self.broker(format!("stream {:?}: {error}", settings.stream)))?;
        let config = pull::Config {
            durable_name: Some(settings.durable.clone()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: settings.ack_wait,
            max_ack_pending: settings.max_ack_pending,
            max_deliver: -1,
            filter_subject: settings.filter_subject.clone().unwrap_or_default(),
            ..Default::default()
        };
        stream.create_consumer(config).await.map_err(|error| {
            self.broker(format!(
                "creating durable consumer {:?} on stream {:?}: {error}",
                settings.durable, settings.stream
            ))
        })
    }

    fn broker(&self, reason: String) -> Error {
        Error::Broker {
            broker: "nats",
            at: redact_url(&self.settings.url),
            reason,
        }
    }
}

/// The client, the durable consumer and, once opened, its message stream.
pub(crate) struct Session {
    client: async_nats::Client,
    consumer: PullConsumer,
    messages: Option<pull::Stream>,
}

impl Transport for NatsInbox {
    const BROKER: &'static str = "NATS";
    const ID_HEADER: &'static str = wire::MSG_ID;
    type Session = Session;
    type Message = jetstream::Message;

    fn consumer(&self) -> &str {
        &self.settings.durable
    }

    fn redelivery(&self) -> &Redelivery {
        &self.settings.redelivery
    }

    fn rejected(&self) -> String {
        "terminated (TERM)".to_owned()
    }

    async fn start(&self) -> Result<Session> {
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(self.settings.connect_timeout)
            .connect(self.settings.url.as_str())
            .await
            .map_err(|error| self.broker(format!("cannot connect: {error}")))?;
        let consumer = self.consumer(&client).await?;
        Ok(Session {
            client,
            consumer,
            messages: None,
        })
    }

    /// The consumer may have been deleted, or the stream moved: set it up again.
    async fn resume(&self, session: &mut Session) -> Result<()> {
        session.messages = None;
        session.consumer = self.consumer(&session.client).await?;
        Ok(())
    }

    async fn next(
        &self,
        session: &mut Session,
    ) -> Option<std::result::Result<jetstream::Message, String>> {
        if session.messages.is_none() {
            match session.consumer.messages().await {
                Ok(messages) => session.messages = Some(messages),
                Err(error) => return Some(Err(format!("cannot open the message stream: {error}"))),
            }
        }
        let next = session.messages.as_mut()?.next().await;
        match next {
            Some(Ok(message)) => Some(Ok(message)),
            Some(Err(error)) => {
                session.messages = None;
                Some(Err(format!("pulling failed: {error}")))
            }
            None => {
                session.messages = None;
                None
            }
        }
    }

    fn parts<R>(message: &jetstream::Message, read: impl FnOnce(Parts<'_>) -> R) -> R {
        let header = |name: &str| {
            message
                .headers
                .as_ref()
                .and_then(|headers| headers.get(name))
                .map(|value| value.as_str())
        };
        read(Parts {
            id: header(wire::MSG_ID),
            payload: &message.payload,
            headers: header(wire::HEADERS),
            source: header(wire::SOURCE),
            position: header(wire::POSITION),
            lane: header(wire::LANE),
            history: header(wire::HISTORY),
            history_start: header(wire::HISTORY_START),
            route: header(wire::ROUTE),
            previous: header(wire::PREVIOUS),
        })
    }

    async fn settle(
        &self,
        _: &mut Session,
        message: jetstream::Message,
        settle: Settle,
    ) -> std::result::Result<(), String> {
        let acked = match settle {
            Settle::Ack => message.ack().await,
            Settle::Redeliver(delay) => message.ack_with(AckKind::Nak(Some(delay))).await,
            Settle::Reject(_) => message.ack_with(AckKind::Term).await,
        };
        acked.map_err(|error| error.to_string())
    }

    /// Nothing to drain: a pulled message not yet handled comes back after `ack_wait`.
    async fn cancel(&self, _: &mut Session) -> bool {
        false
    }

    /// The acks written so far reach the server before the connection goes.
    async fn close(&self, session: Session) {
        if let Err(error) = session.client.flush().await {
            tracing::warn!(durable = self.settings.durable, %error, "NATS inbox adapter: the last acks may not have been sent; those messages come back as duplicates");
        }
    }
}
