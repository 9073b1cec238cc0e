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

use std::future::Future;
use std::time::Duration;

use lapin::{Channel, Connection};

use super::Inbox;
use super::adapter;
use super::handler::InboxHandler;
use super::transport::Redelivery;
use crate::error::{Error, Result};
use crate::wire::redact_url;

mod builder;
mod open;
mod transport;

pub use builder::RabbitInboxBuilder;

/// The exchange every inbox queue's dead letters go through.
pub const DEAD_LETTER_EXCHANGE: &str = "ordo.dlq";

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
    /// the [`prefetch`](RabbitInboxBuilder::prefetch)), closes the connection and returns. A
    /// lost connection is logged and made again; it does not end the run.
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
        adapter::run(self, inbox, handler, shutdown).await
    }

    fn broker(&self, reason: String) -> Error {
        Error::Broker {
            broker: "rabbitmq",
            at: redact_url(&self.settings.uri),
            reason,
        }
    }
}
