//! The contract between a relay and the system it delivers to.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
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
    /// The message's destination cannot take anything now (it is down or unreachable, and
    /// nothing sent to it got through since this message was sent): not the message's fault.
    /// No attempt is counted; the message is tried again after `retry_after`. A sink with
    /// many destinations (webhook URLs by route) reports this so that one dead destination
    /// holds only its own messages, in an outage of its own.
    Unavailable {
        /// What happened, for logs (no secrets).
        message: String,
        /// How long to wait before sending to that destination again.
        retry_after: Duration,
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

    /// Whether the message's destination is down ([`Unavailable`](Self::Unavailable)): no
    /// attempt counts against the message.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// The pause the receiver asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Transient { retry_after, .. } => *retry_after,
            Self::Unavailable { retry_after, .. } => Some(*retry_after),
            Self::Permanent { .. } => None,
        }
    }

    /// What happened, without the kind.
    pub fn message(&self) -> &str {
        match self {
            Self::Transient { message, .. }
            | Self::Permanent { message }
            | Self::Unavailable { message, .. } => message,
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
            Self::Unavailable { message, .. } => write!(f, "unavailable: {message}"),
        }
    }
}

impl std::error::Error for SendError {}

/// What [`Sink::send`] knows of each message of its batch, filled in by the sink as it learns
/// it: one slot per message, in the batch's order, each empty until the sink
/// [reports](Outcomes::report) the message delivered or failed.
///
/// The relay reads it **after `send` ended, however it ended**: returned, cancelled by the
/// batch deadline, or unwound by a panic. So an outcome reported is never lost with the rest
/// of the batch: a delivered message stays delivered, a failed one counts its attempt, and
/// only the messages still empty are released (see the trait's contract).
///
/// ```
/// use ordo::relay::{Message, Outcomes, SendError};
///
/// let batch = [Message::new(&b"{}"[..]), Message::new(&b"{}"[..])];
/// let mut outcomes = Outcomes::new(batch.len());
/// outcomes.delivered(0);
/// assert!(outcomes.get(0).is_some_and(Result::is_ok));
/// assert!(outcomes.get(1).is_none(), "not known yet");
/// outcomes.failed(1, SendError::transient("the endpoint answered 503"));
/// assert!(!outcomes.all_delivered());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcomes {
    slots: Vec<Option<Result<(), SendError>>>,
}

impl Outcomes {
    /// Empty outcomes for a batch of `len` messages.
    pub fn new(len: usize) -> Self {
        Self {
            slots: vec![None; len],
        }
    }

    /// Message `index` of the batch was delivered: the receiver took responsibility for it.
    pub fn delivered(&mut self, index: usize) {
        self.report(index, Ok(()));
    }

    /// Message `index` of the batch failed with `error` (blamed on that message alone).
    pub fn failed(&mut self, index: usize, error: SendError) {
        self.report(index, Err(error));
    }

    /// Message `index`'s outcome. A later report replaces an earlier one; an index past the
    /// batch is ignored (and logged): it names no message.
    pub fn report(&mut self, index: usize, outcome: Result<(), SendError>) {
        match self.slots.get_mut(index) {
            Some(slot) => *slot = Some(outcome),
            None => tracing::warn!(
                index,
                batch = self.slots.len(),
                "a sink reported an outcome for a message its batch does not hold"
            ),
        }
    }

    /// Message `index`'s outcome, if reported.
    pub fn get(&self, index: usize) -> Option<&Result<(), SendError>> {
        self.slots.get(index).and_then(Option::as_ref)
    }

    /// Whether message `index` has an outcome.
    pub fn is_known(&self, index: usize) -> bool {
        self.get(index).is_some()
    }

    /// The number of messages (reported or not).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Whether every message was reported delivered.
    pub fn all_delivered(&self) -> bool {
        self.slots.iter().all(|slot| matches!(slot, Some(Ok(()))))
    }

    /// Each message's outcome, in the batch's order (`None`: not reported).
    pub fn iter(&self) -> impl Iterator<Item = Option<&Result<(), SendError>>> {
        self.slots.iter().map(Option::as_ref)
    }

    /// The outcomes, one per message, in the batch's order.
    pub fn into_vec(self) -> Vec<Option<Result<(), SendError>>> {
        self.slots
    }
}

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
/// - **Outcomes as they come.** `send` reports each message's outcome into `outcomes` as soon
///   as it has it: [`delivered`](Outcomes::delivered) only once the receiver has taken
///   responsibility for it (a stream ack, a publisher confirm, a 2xx),
///   [`failed`](Outcomes::failed) when the receiver refused *that message* (counts an
///   attempt; [`SendError::Permanent`] parks it at once). The relay keeps every outcome
///   reported, whether `send` returns, is cancelled by the deadline or panics.
/// - **The batch as a whole.** `Err` from `send` says the sink as a whole failed (the
///   connection is gone, the receiver cannot be reached): the messages without an outcome are
///   released with **no attempt counted**, and the relay backs off. Reported outcomes stay.
/// - **Messages left without an outcome** (the deadline expired, `send` panicked, or returned
///   `Ok` without reporting them) are released without an attempt, but their next batch is
///   at most half as big; a message that is left without an outcome in a batch of its own
///   counts an attempt. So a message that never answers is blamed after at most
///   ⌈log₂ `batch_size`⌉ sends, never re-sent for ever (`docs/relays.md`, "The failure model").
/// - **Order.** A relay's batch holds at most one event per key (the next event of a key
///   waits for the one before it), so a sink may send a batch's messages in any order or all
///   at once. Used directly with several messages of one key, the built-in broker sinks
///   publish in order on one connection and [`WebhookSink`](super::http::WebhookSink) sends
///   one key's messages one after another.
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
/// use ordo::relay::{Message, Outcomes, SendError, Sink};
///
/// struct Stdout;
///
/// impl Sink for Stdout {
///     async fn send(&mut self, batch: &[Message], outcomes: &mut Outcomes) -> Result<(), SendError> {
///         for (index, message) in batch.iter().enumerate() {
///             println!("{} {}", message.id, String::from_utf8_lossy(&message.payload));
///             outcomes.delivered(index);
///         }
///         Ok(())
///     }
///
///     async fn reset(&mut self) -> Result<(), SendError> {
///         Ok(())
///     }
///
///     fn describe(&self) -> String {
///         "stdout".to_owned()
///     }
/// }
/// ```
pub trait Sink: Send + 'static {
    /// Delivers `batch`, reporting each message's outcome into `outcomes` (one slot per
    /// message, in order) as it learns it; `Err` when the sink as a whole failed. See the
    /// trait's contract.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in the sense that a dropped `send` may have delivered any part of the
    /// batch; what it reported into `outcomes` before the drop holds. After a drop, call
    /// [`reset`](Sink::reset) before sending again.
    fn send(
        &mut self,
        batch: &[Message],
        outcomes: &mut Outcomes,
    ) -> impl Future<Output = Result<(), SendError>> + Send;

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

    /// Fits the sink's own per-message timeout to the relay's `batch_deadline`: called once
    /// when the relay starts, before any `send`. A message that never answers must be blamed
    /// by its own timeout *before* the deadline releases its batch, so a sink that bounds
    /// each message's wait derives any timeout its user did not set from the deadline, and
    /// refuses one set at or past it. The built-in sinks take half the deadline (at most
    /// their stated default), the other half leaving room for the messages queued behind a
    /// slow one and for rebuilding a connection.
    ///
    /// The default does nothing: a sink without per-message timeouts relies on the deadline
    /// and the relay's halving of batches left without outcomes (see the trait's contract).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) naming the sink's setting and
    /// `batch_deadline`, when a configured timeout is at or past the deadline.
    fn fit_to_deadline(&mut self, batch_deadline: Duration) -> crate::Result<()> {
        let _ = batch_deadline;
        Ok(())
    }

    /// Prepares the sink for the relay that runs it: called once when the relay starts,
    /// before any `send`, with the relay's [`SinkTiming`]. A sink checks here whatever its
    /// receiver must hold for the relay's timing (the built-in [`NatsSink`](super::nats::NatsSink)
    /// checks its stream's duplicate window against [`SinkTiming::resend_span`]) and fits its
    /// own timeouts. The relay does not start when it fails.
    ///
    /// The default calls [`fit_to_deadline`](Sink::fit_to_deadline) with
    /// [`SinkTiming::batch_deadline`]; a sink that overrides `prepare` calls it itself if it
    /// needs both.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) naming the settings that cannot
    /// hold together; any other error the sink's check met (the relay reports it and does not
    /// start).
    fn prepare(&mut self, timing: &SinkTiming) -> impl Future<Output = crate::Result<()>> + Send {
        let fitted = self.fit_to_deadline(timing.batch_deadline);
        async move { fitted }
    }

    /// The route each message takes through this sink: the destination it is sent to, as a
    /// receiver that reads one destination sees it (the built-in sinks: the NATS subject; the
    /// RabbitMQ exchange and routing key, `exchange/key` with a `/` in the exchange written
    /// `%2F`; the webhook URL without its user, password and query, and a hash of the query
    /// when it has one). Called once when the relay starts; the function must give the same
    /// route for the same message every time, and never block.
    ///
    /// The relay links every message to the one it sent before it on the same route
    /// ([`Message::route`], [`Message::previous`]; `docs/relays.md`, "Route chains"), so a
    /// receiver of one route takes a position after positions sent elsewhere or never sent,
    /// and still sees a lost one. `None` (the default): every message of the relay takes one
    /// route. A relay with several sinks uses the first sink's router: give them the same
    /// routing.
    fn router(&self) -> Option<Router> {
        None
    }
}

/// Names the route a message takes through a sink: the destination it is sent to (a subject,
/// an exchange and routing key, a URL). See [`Sink::router`].
pub type Router = Arc<dyn Fn(&Message) -> String + Send + Sync>;

/// What a relay tells its sinks about its timing when it starts ([`Sink::prepare`]), derived
/// from its [`RelayConfig`](super::RelayConfig).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SinkTiming {
    /// The relay's name.
    pub relay: String,
    /// One deadline over each batch's send (and the rebuild of a connection before it).
    pub batch_deadline: Duration,
    /// The longest span between the first and the last send of one message by one owner,
    /// outages and ownership changes aside: `⌈log₂ batch_size⌉ + max_attempts` sends under a
    /// deadline each, the releases' pauses between the first ones and a backoff (at most the
    /// configured cap) before each later attempt (`docs/relays.md`, "The bound on sends per
    /// event"). A receiver that drops repeats within a window (JetStream's `duplicate_window`)
    /// drops every copy of one owner's retries when the window is at least this long.
    pub resend_span: Duration,
}

impl SinkTiming {
    /// The timing of a relay run with `config` (what the relay passes to [`Sink::prepare`];
    /// for a test of a sink's own checks).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ordo::relay::{RelayConfig, SinkTiming};
    ///
    /// let timing = SinkTiming::of(&RelayConfig::new("r"));
    /// assert_eq!(timing.batch_deadline, Duration::from_secs(10));
    /// // 7 halvings of a batch of 100 and 10 attempts, 10 s each, 9 backoffs of at most 10 s,
    /// // 7 pauses of 100 ms.
    /// assert_eq!(timing.resend_span, Duration::from_millis(260_700));
    /// ```
    pub fn of(config: &super::RelayConfig) -> Self {
        Self {
            relay: config.name.clone(),
            batch_deadline: config.batch_deadline,
            resend_span: config.resend_span(),
        }
    }
}

/// The per-message timeout a built-in sink uses under a relay whose batch deadline is
/// `deadline`: the one its user set (refused at or past the deadline, naming `setting`), or
/// half the deadline, at most `default`.
#[cfg(any(feature = "http", feature = "nats", feature = "rabbitmq"))]
pub(crate) fn fitted_timeout(
    configured: Option<Duration>,
    default: Duration,
    deadline: Duration,
    setting: &'static str,
) -> crate::Result<Duration> {
    match configured {
        Some(timeout) if timeout >= deadline => Err(crate::Error::InvalidConfig {
            setting,
            reason: format!(
                "the sink's per-message timeout ({timeout:?}) is at or past batch_deadline \
                 ({deadline:?}): a message that never answers would be released with its batch \
                 instead of blamed; make the timeout shorter or the deadline longer"
            ),
        }),
        Some(timeout) => Ok(timeout),
        None => Ok(default.min(deadline / 2)),
    }
}
