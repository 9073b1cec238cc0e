//! [`RabbitInbox`]: consume a RabbitMQ queue into an [`Inbox`].
//!
//! Each delivery goes through [`Inbox::receive`]; the adapter acknowledges it only after the
//! inbox transaction has committed (or the inbox already held its outcome). A process that
//! dies between the commit and the ack leaves the delivery unacknowledged: the broker requeues
//! it when the connection closes, the inbox answers `Duplicate` and the adapter acknowledges it
//! then. What the adapter does for each answer is in the
//! [inbox module docs](super#broker-adapters); a redelivery after a delay is a `nack` with
//! requeue sent when the delay is over (the delivery counts against the prefetch until then).
//!
//! # The message
//!
//! | AMQP | [`InboxMessage`](super::InboxMessage) |
//! | --- | --- |
//! | property `message_id` | `id` (required: a delivery without it is dead-lettered) |
//! | the body (UTF-8 text) | `payload` |
//! | header `ordo-headers` (a JSON object) | `headers` |
//! | headers `ordo-source`, `ordo-position` (and `ordo-lane` `commit`, or none) | `source`, `position`, for [`InboxMode::Watermark`](super::InboxMode::Watermark) |
//!
//! An ordo relay with a [`RabbitSink`](crate::relay::rabbitmq::RabbitSink) sets all of them.
//!
//! # Dead letters, derived from the queue name
//!
//! With [`declare`](RabbitInboxBuilder::declare) on (the default) the adapter declares, for
//! queue `Q`:
//!
//! - the direct exchange `ordo.dlq` (durable),
//! - the queue `Q.dlq` (durable), bound to `ordo.dlq` with routing key `Q`,
//! - the queue `Q` (durable) with `x-dead-letter-exchange = ordo.dlq` and
//!   `x-dead-letter-routing-key = Q`, bound to each [`bind`](RabbitInboxBuilder::bind)ing.
//!
//! No wiring per caller: every inbox queue has its dead letters next to it. Only deliveries the
//! inbox cannot store go there (no `message_id`, a body that is not UTF-8 text, malformed ordo
//! headers): rejected without requeue, the broker moves them to `Q.dlq`, where an operator sees
//! them with the broker's tools. A message whose *handler* fails for good is not sent there:
//! the inbox keeps it as `failed` in `ordo.inbox`, with its payload, error and attempts, and
//! `ordo inbox replay` runs it again. One dead-letter store per kind of failure, each where it
//! can be acted on.
//!
//! A queue `Q` that already exists with other arguments makes the declaration fail (RabbitMQ
//! refuses to change a queue's arguments): [`RabbitInbox::run`] says so. Delete the queue, or
//! turn `declare` off and set the dead-lettering with a broker policy.
//!
//! # The exchange
//!
//! The adapter declares its queues and binds them; it does not declare the exchanges it binds
//! to. Each exchange a [`bind`](RabbitInboxBuilder::bind) names must exist when
//! [`RabbitInbox::run`] starts, or the binding fails and `run` returns [`Error::Broker`]
//! quoting the broker's `NOT_FOUND - no exchange ...`. It is the exchange the sender's
//! [`RabbitSink`](crate::relay::rabbitmq::RabbitSink) publishes to; declare it as the relay
//! docs show ([Preparing the exchange](crate::relay::rabbitmq#preparing-the-exchange)), with
//! the client ordo re-exports, [`ordo::relay::rabbitmq::lapin`](crate::relay::rabbitmq::lapin),
//! so that no `lapin` dependency of your own is needed (and declare only the exchange: the
//! adapter declares the queue with its dead-letter arguments). Run the adapter once, so that
//! its queue is bound, **before** the relay sends what it must receive: the broker drops a
//! message no queue is bound for. The adapter's API takes no client types.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
    BasicRejectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use tokio::task::JoinSet;

use super::Inbox;
use super::handler::InboxHandler;
use super::transport::{Parts, Redelivery, Settle, settle};
use crate::error::{Error, Result};
use crate::wire::rabbitmq as wire;
use crate::wire::redact_url;

/// The exchange every inbox queue's dead letters go through.
pub const DEAD_LETTER_EXCHANGE: &str = "ordo.dlq";

/// How long a stopping adapter waits for the next delivery the broker sent before its cancel.
const DRAIN_PATIENCE: Duration = Duration::from_secs(5);

/// How long the adapter waits before connecting again after the connection failed.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);

/// The settings of a [`RabbitInbox`]: start with [`RabbitInbox::builder`].
#[must_use]
#[derive(Clone)]
pub struct RabbitInboxBuilder {
    uri: String,
    queue: String,
    declare: bool,
    bindings: Vec<(String, String)>,
    prefetch: u16,
    connect_timeout: Duration,
    redelivery: Redelivery,
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
    /// bindings (see the [module docs](self#dead-letters-derived-from-the-queue-name)).
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

/// Consumes a RabbitMQ queue into an [`Inbox`] (see the [module docs](self)).
///
/// ```no_run
/// # async fn run(inbox: ordo::inbox::Inbox, handler: impl ordo::inbox::InboxHandler) -> ordo::Result<()> {
/// use ordo::inbox::RabbitInbox;
///
/// let adapter = RabbitInbox::builder("amqp://guest:guest@127.0.0.1:5672/%2f", "billing")
///     .bind("orders", "#")
///     .prefetch(50)
///     .build()?;
/// adapter
///     .run(&inbox, &handler, async {
///         let _ = tokio::signal::ctrl_c().await;
///     })
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RabbitInbox {
    settings: RabbitInboxBuilder,
}

/// An open connection with its consuming channel.
struct Open {
    connection: Connection,
    channel: Channel,
    consumer: lapin::Consumer,
}

impl RabbitInbox {
    /// An adapter for `queue` on the broker at `uri`.
    pub fn builder(uri: impl Into<String>, queue: impl Into<String>) -> RabbitInboxBuilder {
        RabbitInboxBuilder {
            uri: uri.into(),
            queue: queue.into(),
            declare: true,
            bindings: Vec::new(),
            prefetch: 100,
            connect_timeout: Duration::from_secs(5),
            redelivery: Redelivery::default(),
        }
    }

    /// The dead-letter queue of this adapter's queue: `{queue}.dlq`.
    pub fn dead_letter_queue(&self) -> String {
        format!("{}.dlq", self.settings.queue)
    }

    /// Receives deliveries into `inbox`, handled by `handler`, one at a time, until `shutdown`
    /// completes; then cancels the consumer, settles the deliveries already received (up to
    /// the [`prefetch`](RabbitInboxBuilder::prefetch)), closes the connection and returns. A lost connection is logged and made
    /// again; it does not end the run.
    ///
    /// # Errors
    /// [`Error::Broker`] when the start fails: the broker cannot be reached, the queue cannot
    /// be declared (it exists with other arguments) or, with `declare` off, does not exist.
    ///
    /// # Cancel safety
    /// Dropping the future is a crash: the delivery in hand is rolled back or, if its inbox
    /// transaction committed, requeued when the connection closes and answered `Duplicate`.
    pub async fn run<H: InboxHandler>(
        &self,
        inbox: &Inbox,
        handler: &H,
        shutdown: impl Future<Output = ()>,
    ) -> Result<()> {
        let mut open = Some(self.open().await?);
        tracing::info!(
            consumer = inbox.config().consumer(),
            queue = self.settings.queue,
            "inbox adapter consuming from RabbitMQ"
        );
        let mut shutdown = std::pin::pin!(shutdown);
        // Deliveries waiting out their redelivery delay before their nack.
        let mut delayed = JoinSet::new();
        loop {
            if let Some(current) = open.as_mut() {
                loop {
                    while delayed.try_join_next().is_some() {}
                    let next = tokio::select! {
                        () = &mut shutdown => {
                            delayed.abort_all();
                            return self.stop(inbox, handler, current).await;
                        }
                        next = current.consumer.next() => next,
                    };
                    match next {
                        Some(Ok(delivery)) => {
                            self.deliver(inbox, handler, delivery, &mut delayed).await;
                        }
                        Some(Err(error)) => {
                            tracing::warn!(queue = self.settings.queue, %error, "RabbitMQ inbox adapter: the consumer failed; connecting again");
                            break;
                        }
                        None => {
                            tracing::warn!(
                                queue = self.settings.queue,
                                "RabbitMQ inbox adapter: the broker ended the consumer; connecting again"
                            );
                            break;
                        }
                    }
                }
            }
            // The deliveries of a lost channel are requeued by the broker; their nacks are void.
            delayed.abort_all();
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                () = tokio::time::sleep(RECONNECT_AFTER) => {}
            }
            open = match self.open().await {
                Ok(open) => Some(open),
                Err(error) => {
                    tracing::warn!(queue = self.settings.queue, %error, "RabbitMQ inbox adapter: cannot connect; trying again");
                    None
                }
            };
        }
    }

    /// Connects, declares (when asked) and starts consuming.
    async fn open(&self) -> Result<Open> {
        let settings = &self.settings;
        let connecting = Connection::connect(&settings.uri, ConnectionProperties::default());
        let connection = tokio::time::timeout(settings.connect_timeout, connecting)
            .await
            .map_err(|_| {
                self.broker(format!(
                    "no connection within {:?}",
                    settings.connect_timeout
                ))
            })?
            .map_err(|error| self.broker(format!("cannot connect: {error}")))?;
        let setup = async {
            let channel = connection.create_channel().await?;
            if settings.declare {
                self.declare(&channel).await?;
            } else {
                let passive = QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                };
                channel
                    .queue_declare(
                        settings.queue.as_str().into(),
                        passive,
                        FieldTable::default(),
                    )
                    .await?;
            }
            channel
                .basic_qos(settings.prefetch, BasicQosOptions::default())
                .await?;
            let consumer = channel
                .basic_consume(
                    settings.queue.as_str().into(),
                    "".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            Ok::<_, lapin::Error>((channel, consumer))
        };
        match setup.await {
            Ok((channel, consumer)) => Ok(Open {
                connection,
                channel,
                consumer,
            }),
            Err(error) => {
                let _ = connection.close(200, "setup failed".into()).await;
                Err(self.broker(format!(
                    "setting up queue {:?}: {error}{}",
                    settings.queue,
                    if settings.declare {
                        " (a queue that exists with other arguments cannot be declared again: delete it, or turn declare off and dead-letter with a policy)"
                    } else {
                        " (with declare off, the queue must exist)"
                    }
                )))
            }
        }
    }

    /// The dead-letter exchange and queue, the queue, its bindings.
    async fn declare(&self, channel: &Channel) -> lapin::Result<()> {
        let queue = self.settings.queue.as_str();
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .exchange_declare(
                DEAD_LETTER_EXCHANGE.into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        let dead_letters = self.dead_letter_queue();
        channel
            .queue_declare(dead_letters.as_str().into(), durable, FieldTable::default())
            .await?;
        channel
            .queue_bind(
                dead_letters.as_str().into(),
                DEAD_LETTER_EXCHANGE.into(),
                queue.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let mut arguments = FieldTable::default();
        arguments.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(DEAD_LETTER_EXCHANGE.into()),
        );
        arguments.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(queue.into()),
        );
        channel
            .queue_declare(queue.into(), durable, arguments)
            .await?;
        for (exchange, routing_key) in &self.settings.bindings {
            channel
                .queue_bind(
                    queue.into(),
                    exchange.as_str().into(),
                    routing_key.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
        }
        Ok(())
    }

    /// One delivery through the inbox, then its ack, delayed requeue or dead-lettering.
    async fn deliver<H: InboxHandler>(
        &self,
        inbox: &Inbox,
        handler: &H,
        delivery: Delivery,
        delayed: &mut JoinSet<()>,
    ) {
        let headers = delivery.properties.headers().as_ref();
        let header = |name: &str| headers.and_then(|table| text(table, name));
        let (source, position, lane, ordo_headers) = (
            header(wire::SOURCE),
            header(wire::POSITION),
            header(wire::LANE),
            header(wire::HEADERS),
        );
        let parts = Parts {
            id: delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.as_str()),
            payload: &delivery.data,
            headers: ordo_headers.as_deref(),
            source: source.as_deref(),
            position: position.as_deref(),
            lane: lane.as_deref(),
        };
        let result = match parts.message("message_id") {
            Ok(message) => inbox.receive(&message, handler).await,
            Err(reason) => Err(inbox.refused(parts.id, reason)),
        };
        let acked = match settle(&result, &self.settings.redelivery) {
            Settle::Ack => delivery.ack(BasicAckOptions::default()).await.map(drop),
            Settle::Redeliver(delay) => {
                if let Err(error) = &result {
                    tracing::warn!(queue = self.settings.queue, %error, "RabbitMQ inbox adapter: the inbox failed; the delivery will be requeued");
                }
                let acker = delivery.acker;
                delayed.spawn(async move {
                    tokio::time::sleep(delay).await;
                    let requeue = BasicNackOptions {
                        requeue: true,
                        multiple: false,
                    };
                    let _ = acker.nack(requeue).await;
                });
                Ok(())
            }
            Settle::Reject(reason) => {
                inbox.count_rejected();
                tracing::warn!(
                    queue = self.settings.queue,
                    dead_letters = self.dead_letter_queue(),
                    reason,
                    "RabbitMQ inbox adapter: a delivery the inbox cannot store is dead-lettered"
                );
                delivery
                    .reject(BasicRejectOptions { requeue: false })
                    .await
                    .map(drop)
            }
        };
        if let Err(error) = acked {
            // Unacknowledged, it is requeued when the channel closes; the inbox answers it then.
            tracing::warn!(queue = self.settings.queue, %error, "RabbitMQ inbox adapter: the ack was not sent");
        }
    }

    /// A clean stop: no more deliveries; the ones already received (up to the prefetch) are
    /// settled, so that a stop leaves nothing to redeliver; then the channel and connection
    /// are closed after the acks.
    async fn stop<H: InboxHandler>(
        &self,
        inbox: &Inbox,
        handler: &H,
        open: &mut Open,
    ) -> Result<()> {
        let cancel = open
            .channel
            .basic_cancel(open.consumer.tag(), BasicCancelOptions::default())
            .await;
        if cancel.is_ok() {
            // After the cancel, the stream yields what the broker sent before it, then ends.
            let mut delayed = JoinSet::new();
            while let Ok(Some(Ok(delivery))) =
                tokio::time::timeout(DRAIN_PATIENCE, open.consumer.next()).await
            {
                self.deliver(inbox, handler, delivery, &mut delayed).await;
            }
            // Those waiting out a redelivery delay go back to the queue as the channel closes.
            delayed.abort_all();
        }
        let _ = open
            .channel
            .close(200, "inbox adapter stopping".into())
            .await;
        let _ = open
            .connection
            .close(200, "inbox adapter stopping".into())
            .await;
        Ok(())
    }

    fn broker(&self, reason: String) -> Error {
        Error::Broker {
            broker: "rabbitmq",
            at: redact_url(&self.settings.uri),
            reason,
        }
    }
}

/// A header's value as text: strings as they are, integers in decimal.
fn text(table: &FieldTable, name: &str) -> Option<String> {
    let value = table
        .inner()
        .iter()
        .find(|(key, _)| key.as_str() == name)
        .map(|(_, value)| value)?;
    match value {
        AMQPValue::LongString(text) => std::str::from_utf8(text.as_bytes()).ok().map(str::to_owned),
        AMQPValue::ShortString(text) => Some(text.as_str().to_owned()),
        AMQPValue::LongLongInt(n) => Some(n.to_string()),
        AMQPValue::LongInt(n) => Some(n.to_string()),
        AMQPValue::LongUInt(n) => Some(n.to_string()),
        AMQPValue::ShortInt(n) => Some(n.to_string()),
        AMQPValue::ShortUInt(n) => Some(n.to_string()),
        AMQPValue::Timestamp(n) => Some(n.to_string()),
        _ => None,
    }
}
