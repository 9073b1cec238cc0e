//! The contract between a relay and the system it delivers to.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use super::Message;

/// Why a message (or a whole batch) was not delivered.
///
/// The relay retries a [`Transient`](SendError::Transient) failure later (no sooner than
/// `retry_after` when the receiver asked for a pause) and parks an event after its maximum
/// attempts; a [`Permanent`](SendError::Permanent) failure parks the event at once, because
/// sending the same bytes again cannot succeed (a request the receiver rejects as malformed, a
/// message larger than the broker takes).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendError {
    /// Worth retrying: a lost connection, a timeout, a broker nack, an overloaded receiver.
    Transient {
        /// What happened, for logs and the event's `last_error` (no secrets).
        message: String,
        /// How long the receiver asked us to wait (HTTP `Retry-After`), if it did.
        retry_after: Option<Duration>,
    },
    /// Not worth retrying as is: the event stays parked until an operator requeues it.
    Permanent {
        /// What happened, for logs and the event's `last_error` (no secrets).
        message: String,
    },
}

impl SendError {
    /// A transient failure without a requested pause.
    pub fn transient(message: impl Into<String>) -> Self {
        Self::Transient {
            message: message.into(),
            retry_after: None,
        }
    }

    /// A permanent failure.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self::Permanent {
            message: message.into(),
        }
    }

    /// Whether retrying cannot help.
    pub fn is_permanent(&self) -> bool {
        matches!(self, Self::Permanent { .. })
    }

    /// The pause the receiver asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Transient { retry_after, .. } => *retry_after,
            Self::Permanent { .. } => None,
        }
    }

    /// What happened, without the kind.
    pub fn message(&self) -> &str {
        match self {
            Self::Transient { message, .. } | Self::Permanent { message } => message,
        }
    }
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Transient {
                message,
                retry_after: Some(after),
            } => write!(f, "transient: {message} (retry after {after:?})"),
            Self::Transient { message, .. } => write!(f, "transient: {message}"),
            Self::Permanent { message } => write!(f, "permanent: {message}"),
        }
    }
}

impl std::error::Error for SendError {}

/// The result of [`Sink::send`]: one result per message of the batch, in the batch's order, or
/// an error for the batch as a whole.
pub type BatchResult = Result<Vec<Result<(), SendError>>, SendError>;

/// Where a relay delivers events: a broker, an HTTP endpoint, anything. Implement it to relay
/// to Kafka, SQS or your own system; `ordo` ships [`NatsSink`](super::nats::NatsSink),
/// [`RabbitSink`](super::rabbitmq::RabbitSink) and [`WebhookSink`](super::http::WebhookSink).
///
/// # The contract
///
/// - **At least once.** A message may be sent more than once: after a deadline, a lost
///   connection, or a crash between the receiver's acknowledgement and the relay's mark. The
///   receiver deduplicates by [`Message::id`], which a sink must send as the message id of
///   its protocol. A sink never needs to deduplicate itself.
/// - **Results.** `send` returns one result per message, in order: `Ok(())` only once the
///   receiver has taken responsibility for it (a stream ack, a publisher confirm, a 2xx). The
///   outer `Err` says the batch as a whole failed (the connection is gone, the receiver cannot
///   be reached): no message of it is blamed, and any of them may or may not have arrived. A
///   vector of another length than the batch is a bug in the sink; the relay treats it as an
///   outer transient error.
/// - **Order.** Messages of one key are handed over in order within a batch. A sink that sends
///   them concurrently gives up that order at the receiver; the built-in broker sinks publish
///   in order on one connection; [`WebhookSink`](super::http::WebhookSink) sends one key's
///   messages one after another.
/// - **Cancellation.** The relay runs `send` under one deadline for the batch
///   (`tokio::time::timeout`) and drops the future when it expires: `send` may be stopped at
///   any await. Then the relay calls [`reset`](Sink::reset) before the next `send`. So `send`
///   must leave the sink in a state that `reset` repairs (a half-used channel, a connection
///   that stopped answering), and `reset` must not wait on the old connection: drop it and
///   build a new one. The built-in sinks also repair themselves when `send` is called after a
///   cancelled `send` without a `reset`.
/// - **No database work.** The relay never calls a sink inside a database transaction, and a
///   sink must not open one on the outbox's pool for its delivery.
///
/// # Example
///
/// A sink that prints each event (and so never fails):
///
/// ```
/// use ordo::relay::{BatchResult, Message, Sink};
///
/// struct Stdout;
///
/// impl Sink for Stdout {
///     async fn send(&mut self, batch: &[Message]) -> BatchResult {
///         for message in batch {
///             println!("{} {}", message.id, String::from_utf8_lossy(&message.payload));
///         }
///         Ok(batch.iter().map(|_| Ok(())).collect())
///     }
///
///     async fn reset(&mut self) -> Result<(), ordo::relay::SendError> {
///         Ok(())
///     }
///
///     fn describe(&self) -> String {
///         "stdout".to_owned()
///     }
/// }
/// ```
pub trait Sink: Send + 'static {
    /// Delivers `batch`: one result per message, in order, or an outer error for the whole
    /// batch. See the trait's contract.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in the sense that a dropped `send` may have delivered any part of the
    /// batch; after a drop, call [`reset`](Sink::reset) before sending again.
    fn send(&mut self, batch: &[Message]) -> impl Future<Output = BatchResult> + Send;

    /// Drops the connection (without waiting on it) and builds a new one. The relay calls it
    /// after a batch's deadline expired, and after an outer error, before the next `send`.
    ///
    /// # Errors
    ///
    /// [`SendError::Transient`] when the receiver cannot be reached now; the relay retries
    /// with a backoff.
    fn reset(&mut self) -> impl Future<Output = Result<(), SendError>> + Send;

    /// What this sink delivers to, for logs and status: its kind and target, never a secret
    /// (no password in a URL, no signing key).
    fn describe(&self) -> String;
}
