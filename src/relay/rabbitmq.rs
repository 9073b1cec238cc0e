//! [`RabbitSink`]: publish to RabbitMQ with publisher confirms, delivered when confirmed.
//!
//! Every message is persistent (`delivery_mode` 2), `content_type` `application/json`, with
//! `message_id` = the event id (the receiver deduplicates on it), `type` = the event type,
//! `timestamp` = when it was recorded, and the headers `ordo-sequence`, `ordo-position` and
//! `ordo-lane` (the relay's lane and the event's position on it), and when present
//! `ordo-source` ([`RelayConfig::source`](super::RelayConfig::source)), `ordo-key`,
//! `traceparent` and `ordo-headers` (the stored header map as JSON). Publishes
//! are pipelined on one confirm-mode channel: up to
//! [`pipeline_depth`](RabbitSinkBuilder::pipeline_depth) messages await their confirm at once.
//!
//! # Routing
//!
//! By default the configured [`exchange`](RabbitSinkBuilder::exchange) and routing key = the
//! event type (`untyped` without one). Any other mapping with
//! [`route`](RabbitSinkBuilder::route). The exchange must exist, and a consumer's queue must be
//! bound to it before the events it wants are sent: see
//! [Preparing the exchange](self#preparing-the-exchange).
//!
//! # Preparing the exchange
//!
//! The sink publishes; it declares nothing. Declare the exchange **durable** (a non-durable one
//! is gone after a broker restart, and the relay then waits on a missing exchange), of type
//! **topic**: the routing key is the event type as stored (`Placed`, `billing.v2.Invoiced`,
//! `untyped`), and a topic exchange lets each consumer bind the types it wants, one exactly or
//! many with a pattern (`#` for every type, `billing.v2.*`). A `direct` exchange also works
//! when every binding names one type. Each consumer's queue is durable too (the messages are
//! persistent, `delivery_mode` 2, so they survive a restart in a durable queue), and bound
//! before the relay sends what it must receive: without `mandatory` (below), a message no
//! queue is bound for is confirmed and dropped by the broker. With the re-exported client
//! ([`lapin`], so no dependency of your own):
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use ordo::relay::rabbitmq::RabbitSink;
//! use ordo::relay::rabbitmq::lapin::options::{
//!     ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
//! };
//! use ordo::relay::rabbitmq::lapin::types::FieldTable;
//! use ordo::relay::rabbitmq::lapin::{Connection, ConnectionProperties, ExchangeKind};
//!
//! let uri = "amqp://guest:guest@127.0.0.1:5672/%2f";
//! let connection = Connection::connect(uri, ConnectionProperties::default()).await?;
//! let channel = connection.create_channel().await?;
//! let durable = ExchangeDeclareOptions { durable: true, ..ExchangeDeclareOptions::default() };
//! channel
//!     .exchange_declare("orders".into(), ExchangeKind::Topic, durable, FieldTable::default())
//!     .await?;
//! // A consumer's queue, bound to every event type. (An ordo `RabbitInbox` declares and binds
//! // its own queue: `.bind("orders", "#")`; declare only the exchange for it.)
//! let durable = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };
//! channel.queue_declare("billing".into(), durable, FieldTable::default()).await?;
//! channel
//!     .queue_bind(
//!         "billing".into(),
//!         "orders".into(),
//!         "#".into(),
//!         QueueBindOptions::default(),
//!         FieldTable::default(),
//!     )
//!     .await?;
//! connection.close(200, "declared".into()).await?;
//!
//! let sink = RabbitSink::builder(uri).exchange("orders").build()?;
//! # let _ = sink;
//! # Ok(()) }
//! ```
//!
//! Declaring is idempotent: the same declaration again is a no-op, a different type or
//! durability for an existing name is refused by the broker (`PRECONDITION_FAILED`). The
//! default exchange `""` needs no declaration, but it routes a message only to the queue named
//! exactly as its routing key (a queue `Placed` for the type `Placed`) and drops the rest.
//!
//! **Without the exchange**, the broker closes the channel at the first publish
//! (`NOT_FOUND - no exchange 'orders' in vhost '/'`): every message not yet confirmed fails
//! transiently and the channel is reopened on the next send. When nothing else gets through,
//! that is an outage: no attempt counted, nothing parked, a capped backoff, the relay's
//! status `sink down since T: ...` quoting the broker's error, and the events go out by
//! themselves once the exchange exists. With a [`route`](RabbitSinkBuilder::route) to several
//! exchanges of which one is missing, it is *not* an outage while the others deliver: the
//! failures are the messages' (the closed channel takes the batch's other unconfirmed
//! messages with it), they count attempts and park after the relay's `max_attempts`. Declare
//! every exchange before the relay starts.
//!
//! # Why no `mandatory` flag
//!
//! Messages are published without `mandatory`. In a fan-out topic exchange "no queue is bound
//! to this routing key right now" is a normal condition: nobody subscribed to that event type
//! yet. With `mandatory` the broker would return such a message, the relay would have to count
//! it as failed, and it would be retried and parked for ever although nothing is wrong. A
//! confirm means the broker took responsibility for routing it, to zero or more queues. (The
//! incident record behind this is seed 001 of the design notes, amendment #478.)
//!
//! # Errors, transient or permanent
//!
//! | what happened | [`SendError`] |
//! | --- | --- |
//! | no connection, the connection failed during the batch | outer `Transient` (no message blamed) |
//! | a nack | `Transient` |
//! | no confirm within [`confirm_timeout`](RabbitSinkBuilder::confirm_timeout) of its publish | `Transient` |
//! | the [`route`](RabbitSinkBuilder::route) function panicked on the message | `Permanent` |
//! | the broker closed the channel (a missing exchange, a refused message) | `Transient`, for every message not yet confirmed; the channel is reopened on the next send |
//! | an exchange name or routing key longer than 255 bytes | `Permanent` |

use crate::wire::rabbitmq as wire;
use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};

use tokio::time::Instant;

use super::{Message, Outcomes, SendError, Sink};
use crate::error::{Error, Result};

/// The AMQP client this module is built on (`lapin`, on tokio with rustls on ring), re-exported
/// so that code naming its types (declaring the exchange and queues, as in
/// [Preparing the exchange](self#preparing-the-exchange)) uses exactly the version and
/// features ordo was built with, and needs no `lapin` dependency of its own:
/// `use ordo::relay::rabbitmq::lapin;`. Present with the `rabbitmq` feature.
pub use lapin;

/// Maps a message to its `(exchange, routing key)`.
pub type RouteFn = Arc<dyn Fn(&Message) -> (String, String) + Send + Sync>;

/// AMQP short strings (exchange names, routing keys) are at most this many bytes.
const SHORT_STRING_MAX: usize = 255;

/// A confirm's timeout when none is set and no relay derived one.
const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);

/// The settings of a [`RabbitSink`]: start with [`RabbitSink::builder`].
#[must_use]
pub struct RabbitSinkBuilder {
    uri: String,
    exchange: String,
    route: Option<RouteFn>,
    pipeline_depth: usize,
    connect_timeout: Duration,
    confirm_timeout: Option<Duration>,
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
    /// message fails `Transient` (an attempt). Not zero. Default: derived by the relay that
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
        let route = self.route.unwrap_or_else(|| {
            let exchange = self.exchange;
            Arc::new(move |message: &Message| {
                (exchange.clone(), message.type_or_untyped().to_owned())
            })
        });
        Ok(RabbitSink {
            uri: self.uri,
            route,
            pipeline_depth: self.pipeline_depth,
            connect_timeout: self.connect_timeout,
            configured_confirm_timeout: self.confirm_timeout,
            confirm_timeout: self.confirm_timeout.unwrap_or(DEFAULT_CONFIRM_TIMEOUT),
            connection: None,
            dirty: false,
        })
    }
}

struct Open {
    /// Kept so the connection lives as long as the channel; dropping it closes the socket.
    connection: Connection,
    channel: Channel,
}

/// Delivers to RabbitMQ. See the [module docs](self) for routing, properties and errors.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use ordo::relay::{Message, Outcomes, Sink, rabbitmq::RabbitSink};
///
/// let mut sink = RabbitSink::builder("amqp://guest:guest@127.0.0.1:5672/%2f")
///     .exchange("orders")
///     .pipeline_depth(64)
///     .build()?;
/// let batch = [Message::new(br#"{"order_id": 7}"#.as_slice()).with_event_type(Some("placed"))];
/// // Published to exchange `orders` with routing key `placed`, confirmed by the broker.
/// let mut outcomes = Outcomes::new(batch.len());
/// sink.send(&batch, &mut outcomes).await?;
/// assert!(outcomes.all_delivered());
/// # Ok(()) }
/// ```
pub struct RabbitSink {
    uri: String,
    route: RouteFn,
    pipeline_depth: usize,
    connect_timeout: Duration,
    /// The confirm timeout its user set, if any; otherwise `confirm_timeout` is derived.
    configured_confirm_timeout: Option<Duration>,
    confirm_timeout: Duration,
    connection: Option<Open>,
    /// A `send` began and did not finish (its future was dropped): the channel may hold
    /// confirms nobody awaits, so the next `send` rebuilds the connection.
    dirty: bool,
}

impl fmt::Debug for RabbitSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitSink")
            .field("target", &self.describe())
            .field("connected", &self.connection.is_some())
            .finish_non_exhaustive()
    }
}

impl RabbitSink {
    /// Settings for a sink publishing through the broker at `uri`
    /// (`amqp://user:password@host:port/vhost`, `amqps://` for TLS), with the defaults above.
    pub fn builder(uri: impl Into<String>) -> RabbitSinkBuilder {
        RabbitSinkBuilder {
            uri: uri.into(),
            exchange: String::new(),
            route: None,
            pipeline_depth: 128,
            connect_timeout: Duration::from_secs(5),
            confirm_timeout: None,
        }
    }

    async fn channel(&mut self) -> Result<Channel, SendError> {
        if let Some(open) = &self.connection {
            if open.channel.status().connected() {
                return Ok(open.channel.clone());
            }
            self.connection = None;
        }
        let opened = tokio::time::timeout(self.connect_timeout, open(&self.uri)).await;
        let open = match opened {
            Ok(Ok(open)) => open,
            Ok(Err(error)) => {
                return Err(SendError::transient(format!(
                    "connecting to {}: {error}",
                    self.describe()
                )));
            }
            Err(_) => {
                return Err(SendError::transient(format!(
                    "connecting to {}: no answer within {:?}",
                    self.describe(),
                    self.connect_timeout
                )));
            }
        };
        let channel = open.channel.clone();
        self.connection = Some(open);
        Ok(channel)
    }

    /// Publishes `batch` pipelined on one confirm-mode channel, reporting each confirm as it
    /// comes; `Err` when the connection failed (the unconfirmed messages blamed on nobody).
    async fn publish_all(
        &mut self,
        batch: &[Message],
        outcomes: &mut Outcomes,
    ) -> Result<(), SendError> {
        let channel = self.channel().await?;
        let mut in_flight: VecDeque<(usize, lapin::PublisherConfirm, Instant)> = VecDeque::new();
        for (index, message) in batch.iter().enumerate() {
            if in_flight.len() >= self.pipeline_depth
                && let Some(oldest) = in_flight.pop_front()
            {
                self.land(oldest, outcomes).await?;
            }
            let (exchange, routing_key) = match self.destination(message) {
                Ok(destination) => destination,
                Err(refused) => {
                    outcomes.failed(index, refused);
                    continue;
                }
            };
            let due = Instant::now() + self.confirm_timeout;
            let published = channel
                .basic_publish(
                    exchange,
                    routing_key,
                    // No `mandatory`: see the module docs.
                    BasicPublishOptions::default(),
                    &message.payload,
                    properties(message),
                )
                .await;
            match published {
                Ok(confirm) => in_flight.push_back((index, confirm, due)),
                Err(error) if self.connection_alive() => {
                    // The broker closed the channel over an earlier message: this one was
                    // not sent; the connection may still be fine.
                    outcomes.failed(
                        index,
                        SendError::transient(format!(
                            "not published: the channel was closed ({error})"
                        )),
                    );
                }
                Err(error) => return Err(self.lost(&error)),
            }
        }
        while let Some(oldest) = in_flight.pop_front() {
            self.land(oldest, outcomes).await?;
        }
        Ok(())
    }

    /// The exchange and routing key of `message`, or why it can never be published.
    fn destination(&self, message: &Message) -> Result<(ShortString, ShortString), SendError> {
        let (exchange, routing_key) = super::guarded("route", || (self.route)(message))?;
        if exchange.len() > SHORT_STRING_MAX || routing_key.len() > SHORT_STRING_MAX {
            return Err(SendError::permanent(format!(
                "exchange {} or routing key {} is longer than 255 bytes",
                super::quoted(&exchange),
                super::quoted(&routing_key)
            )));
        }
        Ok((ShortString::from(exchange), ShortString::from(routing_key)))
    }

    /// Awaits one publish's confirm, until it is due, and reports it.
    async fn land(
        &self,
        (index, confirm, due): (usize, lapin::PublisherConfirm, Instant),
        outcomes: &mut Outcomes,
    ) -> Result<(), SendError> {
        let outcome = match tokio::time::timeout_at(due, confirm).await {
            Ok(confirm) => self.confirmed(confirm)?,
            Err(_) => Err(SendError::transient(
                "no publisher confirm within the confirm timeout of its publish",
            )),
        };
        outcomes.report(index, outcome);
        Ok(())
    }

    /// One confirm as a message's result, or the batch's error when the connection failed.
    fn confirmed(
        &self,
        confirm: lapin::Result<Confirmation>,
    ) -> Result<Result<(), SendError>, SendError> {
        match confirm {
            Ok(Confirmation::Ack(None)) => Ok(Ok(())),
            // Only a `mandatory` publish comes back; this sink never sets it (module docs), so
            // a returned message means the flag crept in: fail loudly rather than lose it.
            Ok(Confirmation::Ack(Some(returned))) => Ok(Err(SendError::transient(format!(
                "the broker returned the message as unroutable ({})",
                returned.reply_text
            )))),
            Ok(Confirmation::Nack(_)) => Ok(Err(SendError::transient(
                "the broker nacked the message (it could not store it)",
            ))),
            Ok(Confirmation::NotRequested) => Ok(Err(SendError::transient(
                "the channel was not in confirm mode",
            ))),
            // A channel-level error: the broker refused something on this channel (a missing
            // exchange, an oversized message). Every unconfirmed message of it fails; the
            // connection is fine.
            Err(error) if error.is_amqp_soft_error() && self.connection_alive() => Ok(Err(
                SendError::transient(format!("the broker closed the channel: {error}")),
            )),
            Err(error) => Err(self.lost(&error)),
        }
    }

    /// Whether the connection still stands: a failure on a live connection is the channel's
    /// (blamed on the messages), on a dead one the batch's (no message blamed).
    fn connection_alive(&self) -> bool {
        self.connection
            .as_ref()
            .is_some_and(|open| open.connection.status().connected())
    }

    fn lost(&self, error: &lapin::Error) -> SendError {
        SendError::transient(format!(
            "the connection to {} failed: {error}",
            self.describe()
        ))
    }
}

async fn open(uri: &str) -> lapin::Result<Open> {
    let connection = Connection::connect(uri, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok(Open {
        connection,
        channel,
    })
}

fn properties(message: &Message) -> BasicProperties {
    let mut headers = FieldTable::default();
    let sequence = i64::try_from(message.sequence.get()).unwrap_or(i64::MAX);
    headers.insert(wire::SEQUENCE.into(), AMQPValue::LongLongInt(sequence));
    let position = i64::try_from(message.position).unwrap_or(i64::MAX);
    headers.insert(wire::POSITION.into(), AMQPValue::LongLongInt(position));
    headers.insert(
        wire::LANE.into(),
        AMQPValue::LongString(message.lane.as_str().into()),
    );
    if let Some(source) = &message.source {
        headers.insert(
            wire::SOURCE.into(),
            AMQPValue::LongString(source.as_str().into()),
        );
    }
    if let Some(key) = &message.key {
        headers.insert(wire::KEY.into(), AMQPValue::LongString(key.as_str().into()));
    }
    if let Some(traceparent) = message.traceparent() {
        headers.insert(
            crate::wire::TRACEPARENT.into(),
            AMQPValue::LongString(traceparent.into()),
        );
    }
    if let Some(json) = message.headers_json() {
        headers.insert(wire::HEADERS.into(), AMQPValue::LongString(json.into()));
    }
    let timestamp = u64::try_from(message.recorded_at.timestamp()).unwrap_or(0);
    let mut properties = BasicProperties::default()
        .with_message_id(message.id.to_string().into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_timestamp(timestamp)
        .with_headers(headers);
    if let Some(event_type) = &message.event_type
        && event_type.len() <= SHORT_STRING_MAX
    {
        properties = properties.with_type(event_type.as_str().into());
    }
    properties
}

impl Sink for RabbitSink {
    async fn send(&mut self, batch: &[Message], outcomes: &mut Outcomes) -> Result<(), SendError> {
        if std::mem::replace(&mut self.dirty, true) {
            self.connection = None;
        }
        let sent = self.publish_all(batch, outcomes).await;
        // A batch error leaves the connection in doubt: the next send opens a new one. (A
        // channel the broker closed is reopened by the next send too.)
        if sent.is_err() {
            self.connection = None;
        }
        self.dirty = false;
        sent
    }

    async fn reset(&mut self) -> Result<(), SendError> {
        // Dropping the connection sends a close and lets its I/O loop end; nothing here waits
        // for the broker's answer, which a wedged connection never gives.
        self.connection = None;
        self.dirty = false;
        self.channel().await.map(drop)
    }

    fn describe(&self) -> String {
        format!("rabbitmq {}", crate::wire::redact_url(&self.uri))
    }

    fn fit_to_deadline(&mut self, batch_deadline: Duration) -> Result<()> {
        self.confirm_timeout = super::fitted_timeout(
            self.configured_confirm_timeout,
            DEFAULT_CONFIRM_TIMEOUT,
            batch_deadline,
            "rabbitmq confirm_timeout/batch_deadline",
        )?;
        Ok(())
    }
}
