//! The contract between a relay and the system it delivers to.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::{Message, Outcomes, SendError};

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
/// - **Blame at the source.** A failure is the message's ([`SendError::Transient`],
///   [`SendError::Permanent`]: the receiver answered that message with an error, dropped its
///   connection after it was sent, or did not answer it in time) or the sink's (`Err` from
///   `send`, [`SendError::Unavailable`]: it cannot connect, its destination is missing, it is
///   refused as a client). The message's counts an attempt **whether or not anything else is
///   in flight**; the sink's counts none. Where a batch delivered nothing and its failures
///   could be either (every message timed out), the relay asks [`probe`](Sink::probe).
/// - **The batch as a whole.** `Err` from `send` says the sink as a whole failed (the
///   connection is gone, the receiver cannot be reached): the messages without an outcome are
///   released with **no attempt counted**, and the relay backs off. Reported outcomes stay.
/// - **Messages left without an outcome** (the deadline expired, `send` panicked, or returned
///   `Ok` without reporting them) are released without an attempt, but their next batch is
///   at most half as big; a message that is left without an outcome in a batch of its own
///   counts an attempt (once the sink answered its probe). So a message that never answers is
///   blamed after at most ⌈log₂ `batch_size`⌉ sends, never re-sent for ever
///   (`docs/relays.md`, "The failure model").
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

    /// Whether the sink itself can take messages now, asked without sending any. The relay
    /// calls it after a `send` that delivered nothing and left a failure that may be the
    /// sink's rather than the message's (a [`SendError::Transient`] failure, a message without
    /// an outcome): `Ok` says the sink answers, so those failures are the messages' (each
    /// counts an attempt, even when nothing else is in flight); `Err` says it is down, so the
    /// batch is an outage (no attempt counted, nothing parked, a capped backoff). A sink that
    /// is down and says so itself (`Err` from `send`, [`SendError::Unavailable`]) is not
    /// probed.
    ///
    /// Make it cheap and free of side effects at the receiver: a broker's account or stream
    /// information, a channel opened, a `HEAD` request. Ask on the connection the last `send`
    /// used when there is one (a connection that stopped answering is the sink's fault, not
    /// the messages'), and never wait on it for longer than a message would be given: the
    /// probe shares the batch's deadline with the send before it, and the relay takes
    /// silence past the deadline for `Err` (a probe that answers at once is always heard).
    /// It is never called inside a database transaction, and carries no message.
    ///
    /// The default answers `Ok` without asking anything: a sink that does not probe is judged
    /// by what it reports, so it returns `Err` from `send` (or reports `Unavailable`) when it
    /// cannot reach its receiver, and a transient failure it reports is the message's.
    ///
    /// # Errors
    ///
    /// Any [`SendError`] (its kind does not matter) when the sink cannot take messages now;
    /// its message is shown as the reason the sink is down (no secrets).
    ///
    /// ```
    /// use ordo::relay::{Message, Outcomes, SendError, Sink};
    ///
    /// /// A sink whose receiver says, through a flag, whether it is up.
    /// struct Flagged(std::sync::Arc<std::sync::atomic::AtomicBool>);
    ///
    /// impl Sink for Flagged {
    ///     async fn send(&mut self, batch: &[Message], outcomes: &mut Outcomes) -> Result<(), SendError> {
    ///         (0..batch.len()).for_each(|index| outcomes.failed(index, SendError::transient("refused")));
    ///         Ok(())
    ///     }
    ///     async fn reset(&mut self) -> Result<(), SendError> { Ok(()) }
    ///     fn describe(&self) -> String { "flagged".to_owned() }
    ///     async fn probe(&mut self) -> Result<(), SendError> {
    ///         if self.0.load(std::sync::atomic::Ordering::SeqCst) {
    ///             Ok(())
    ///         } else {
    ///             Err(SendError::transient("the receiver says it is down"))
    ///         }
    ///     }
    /// }
    /// ```
    fn probe(&mut self) -> impl Future<Output = Result<(), SendError>> + Send {
        async { Ok(()) }
    }

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

/// What a relay tells its sinks when it starts ([`Sink::prepare`]): its timing and the envelope
/// of its messages, derived from its [`RelayConfig`](super::RelayConfig).
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
    /// The envelope of the relay's messages ([`RelayConfig::format`](super::RelayConfig::format)):
    /// the built-in sinks write CloudEvents attributes under their protocol's names when it
    /// says so. A sink of your own may ignore it (and should say so in its docs).
    pub format: super::Format,
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
            format: config.format,
        }
    }
}

/// The per-message timeout a built-in sink uses under a relay whose batch deadline is
/// `deadline`: the one its user set (refused at or past the deadline, naming `setting`), or
/// half the deadline, at most `default`.
#[cfg(any(
    feature = "http",
    feature = "kafka",
    feature = "nats",
    feature = "rabbitmq"
))]
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
