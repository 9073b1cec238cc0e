//! [`RabbitSink`]: publish to RabbitMQ with publisher confirms, delivered when confirmed.
//!
//! Every message is persistent (`delivery_mode` 2), `content_type` `application/json`, with
//! `message_id` = the event id (the receiver deduplicates on it), `type` = the event type,
//! `timestamp` = when it was recorded, and the headers `ordo-sequence`, `ordo-position` and
//! `ordo-lane` (the relay's lane and the event's position on it), on the commit lane
//! `ordo-history` and `ordo-history-start` (the position's server history,
//! [`Message::history`](super::Message::history)), `ordo-route` and `ordo-previous` (the
//! message's route chain: [`Message::route`](super::Message::route),
//! [`Message::previous`](super::Message::previous)), and when present
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
//! **Without the exchange**, the broker closes the channel at the first publish to it
//! (`NOT_FOUND - no exchange 'orders' in vhost '/'`), and the channel is reopened on the next
//! send. The messages published to the missing exchange are that exchange's outage
//! (`Unavailable`: no attempt counted, nothing parked, sent again after about a second), and a
//! batch of nothing else shows the relay's status `sink down since T: ...` quoting the
//! broker's error; the events go out by themselves once the exchange exists. With a
//! [`route`](RabbitSinkBuilder::route) to several exchanges of which one is missing, only its
//! messages wait: the others of the batch that the closed channel dropped unconfirmed get no
//! outcome (released without an attempt) and go out with the next batch. Declare every
//! exchange before the relay starts.
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
//! # Errors: whose fault
//!
//! A failure is the message's (`Transient`, `Permanent`: an attempt, even when nothing else is
//! in flight) when the broker answered about that message or did not confirm it in time, and
//! the sink's (no attempt) when the broker cannot take it:
//!
//! | what happened | [`SendError`] |
//! | --- | --- |
//! | no connection, the connection failed during the batch | outer `Transient` (the sink's: no message blamed) |
//! | the broker closed the channel: `NOT_FOUND` for the message's exchange, `ACCESS_REFUSED` | `Unavailable` |
//! | the broker closed the channel over another message, or for a reason that names none (`PRECONDITION_FAILED` for an oversized message) | no outcome: released without an attempt, its next batch halved until a message that closes the channel alone is blamed |
//! | a nack | `Transient` |
//! | no confirm within [`confirm_timeout`](RabbitSinkBuilder::confirm_timeout) of its publish | `Transient`, once the broker answered the sink's probe |
//! | the [`route`](RabbitSinkBuilder::route) function panicked on the message | `Permanent` |
//! | an exchange name or routing key longer than 255 bytes | `Permanent` |
//!
//! **The probe.** When a batch delivered nothing and a failure could be the broker's (a
//! confirm that did not come, a message left without an outcome), the relay asks the sink
//! ([`Sink::probe`]) before it counts anything: the sink opens a channel on the connection the
//! batch used and, with the default route, checks its exchange (a passive declare), within the
//! confirm timeout. Answered, the failures are the messages'; not answered, or the exchange
//! missing, the batch is an outage.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lapin::{Channel, Connection};

use super::{Message, Outcomes, SendError, Sink};
use crate::error::Result;

mod builder;
mod health;
mod properties;
mod publish;

pub use builder::RabbitSinkBuilder;

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

/// About how long a message whose exchange is missing waits (jittered by ±50%), or the
/// relay's outage backoff when that is longer.
const UNAVAILABLE_PAUSE: Duration = Duration::from_secs(1);

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
    /// The exchange of the default route (none with a custom route): checked by the probe.
    exchange: Option<String>,
    pipeline_depth: usize,
    connect_timeout: Duration,
    /// The confirm timeout its user set, if any; otherwise `confirm_timeout` is derived.
    configured_confirm_timeout: Option<Duration>,
    confirm_timeout: Duration,
    connection: Option<Open>,
    /// The relay's envelope, learned in `prepare`.
    framing: crate::relay::format::Framing,
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
}

impl Sink for RabbitSink {
    /// `exchange/routing-key`, with `%` and `/` in the exchange written `%25` and `%2F`.
    fn router(&self) -> Option<crate::relay::Router> {
        let route = Arc::clone(&self.route);
        Some(Arc::new(move |message: &Message| {
            let (exchange, key) = route(message);
            let exchange = exchange.replace('%', "%25").replace('/', "%2F");
            format!("{exchange}/{key}")
        }))
    }

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

    /// A channel opened, and the default route's exchange checked, on the last batch's
    /// connection (see [Errors](self#errors-whose-fault)).
    async fn probe(&mut self) -> Result<(), SendError> {
        self.health().await
    }

    fn describe(&self) -> String {
        format!("rabbitmq {}", crate::wire::redact_url(&self.uri))
    }

    async fn prepare(&mut self, timing: &super::SinkTiming) -> Result<()> {
        self.framing = crate::relay::format::Framing::of(timing);
        self.fit_to_deadline(timing.batch_deadline)
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
