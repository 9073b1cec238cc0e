//! [`NatsSink`]: publish to NATS JetStream, delivered when the stream acknowledges.
//!
//! Each message is published with `Nats-Msg-Id` = the event id, so JetStream's duplicate
//! window (the stream's `duplicate_window`, 2 minutes by default) drops a redelivery: the
//! stream acknowledges it with `duplicate: true`, which counts as delivered. A batch is
//! pipelined: messages are published without waiting for their acks, up to
//! [`max_in_flight`](NatsSinkBuilder::max_in_flight) awaited at once.
//!
//! # Subjects
//!
//! By default `"{prefix}.{event_type}"`, with `untyped` for an event without a type
//! ([`subject_prefix`](NatsSinkBuilder::subject_prefix), default `ordo`). Any other mapping with
//! [`subject`](NatsSinkBuilder::subject). The subject must be bound to a stream: a plain NATS
//! subject with no stream gets no acknowledgement (see [Preparing the stream](self#preparing-the-stream)).
//!
//! # Headers
//!
//! `Nats-Msg-Id` (the event id), `Ordo-Position` and `Ordo-Lane` (the event's position on the
//! relay's lane: `commit`, dense, or `insert`), and when present `Ordo-Source`
//! ([`RelayConfig::source`](super::RelayConfig::source)), `Ordo-Event-Type`, `Ordo-Key`,
//! `traceparent` and `Ordo-Headers` (the stored header map as JSON). An
//! [`ordo::inbox::NatsInbox`](crate::inbox::NatsInbox) reads them back. The body is always the
//! event's JSON.
//!
//! [`detail_headers`](NatsSinkBuilder::detail_headers) adds `Ordo-Sequence` (the insert-lane
//! sequence), `Ordo-Recorded-At` (RFC 3339) and `Content-Type: application/json`. They are off
//! by default: together about 100 bytes on every message, which JetStream stores and scans,
//! for what few consumers read (the body is always JSON; the position says where the event
//! sits).
//!
//! # Errors, transient or permanent
//!
//! | what happened | [`SendError`] |
//! | --- | --- |
//! | no connection, the connection was lost during the batch | outer `Transient` (no message blamed) |
//! | no ack within [`ack_timeout`](NatsSinkBuilder::ack_timeout) of its publish | `Transient` |
//! | the [`subject`](NatsSinkBuilder::subject) function panicked on the message | `Permanent` |
//! | *no responders*: no stream listens on the subject | `Unavailable` (see below) |
//! | an invalid subject, one over 4,000 bytes, a key, type, source or `traceparent` holding a line break (refused before it is sent) | `Permanent` |
//! | a message larger than the server's or the stream's maximum | `Permanent` |
//! | any other JetStream error (limits, a sealed stream) | `Transient` |
//!
//! *No responders* is an outage of the subject, never the message's failure: the client cannot
//! tell "no stream is bound to this subject" from "the stream is being created, moved or
//! elected" (a server restart, a cluster leader election), and a missing stream is the sink's
//! state, not the event's. So no attempt is counted and nothing parks: the message is sent
//! again after about a second (or the relay's outage backoff, when every message of the batch
//! failed so), the relay's status says `sink down since T: no responders ...` while nothing
//! else gets through, and the events go out by themselves once the stream exists. (As a
//! transient failure it parked after the maximum attempts, and a batch that straddled the
//! stream's return charged the messages sent before it came back.)
//!
//! # Duplicate window
//!
//! JetStream drops a repeat of a `Nats-Msg-Id` only within the stream's `duplicate_window`; a
//! copy that arrives after it is **stored twice**, and consumers see it twice (an
//! [`Inbox`](crate::inbox::Inbox), which deduplicates by message id, absorbs it). When a relay
//! starts ([`Sink::prepare`]), the sink reads the window of its stream (the one named with
//! [`stream`](NatsSinkBuilder::stream), or the one bound to `"{prefix}.>"` with the default
//! subject) and compares it with the longest span over which the relay may send one message
//! again ([`SinkTiming::resend_span`]: about 4.3 minutes at the defaults, against JetStream's
//! default window of 2 minutes). A shorter window is logged as a warning naming the stream, its
//! window and the span; with
//! [`require_duplicate_window(true)`](NatsSinkBuilder::require_duplicate_window) the relay
//! refuses to start instead (and also when the window cannot be read).
//!
//! A warning, not a refusal, by default: the window is a saving, never the guarantee. Copies
//! sent apart by an outage (retried for as long as the sink is down) or an ownership change
//! fall outside any window, so receivers must deduplicate by message id whatever the window;
//! and refusing would stop the default relay on JetStream's default stream. The check is there
//! so that a window made short by mistake (seconds) is seen when the relay starts, not as
//! stored duplicates.
//!
//! # Preparing the stream
//!
//! The sink publishes; it never creates a stream. Create one that binds the subjects, with a
//! `duplicate_window` at least the relay's [`SinkTiming::resend_span`] (260.7 s at the
//! defaults; [`SinkTiming::of`] computes it for any [`RelayConfig`](super::RelayConfig), and a
//! relay whose window is shorter names the span in its start-up warning). With the re-exported
//! client ([`async_nats`], so no dependency of your own):
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//!
//! use ordo::relay::nats::async_nats::{self, jetstream};
//! use ordo::relay::nats::NatsSink;
//! use ordo::relay::{RelayConfig, SinkTiming};
//!
//! let config = RelayConfig::new("orders-to-nats"); // the relay's settings, as it will run
//! let span = SinkTiming::of(&config).resend_span; // 260.7 s here
//! let jetstream = jetstream::new(async_nats::connect("nats://127.0.0.1:4222").await?);
//! // Creates the stream, or sets an existing one to this configuration (every setting not
//! // named here goes back to its default: name the ones you rely on).
//! jetstream
//!     .create_or_update_stream(jetstream::stream::Config {
//!         name: "ORDERS".to_owned(),
//!         subjects: vec!["orders.>".to_owned()], // "{prefix}.>" of subject_prefix("orders")
//!         duplicate_window: span.max(Duration::from_secs(5 * 60)),
//!         storage: jetstream::stream::StorageType::File,
//!         ..Default::default()
//!     })
//!     .await?;
//! let sink = NatsSink::builder("nats://127.0.0.1:4222")
//!     .subject_prefix("orders")
//!     .build()?;
//! # let _ = sink;
//! # Ok(()) }
//! ```
//!
//! With a custom [`subject`](NatsSinkBuilder::subject), bind what it returns and name the
//! stream with [`stream`](NatsSinkBuilder::stream) so that its window is checked. A stream with
//! a `max_age` needs a `duplicate_window` no longer than it. JetStream keeps every id of the
//! window in memory: at 1,000 messages a second, a 5-minute window holds 300,000 ids.
//!
//! **Without the stream**, nothing is lost and nothing parks: the relay starts (logging at WARN
//! that the window was not checked, since no stream is bound to `"{prefix}.>"`; with
//! [`require_duplicate_window(true)`](NatsSinkBuilder::require_duplicate_window) it refuses to
//! start instead), every publish is answered *no responders*, which is an outage (above): no
//! attempt counted, the events held back and sent again after a capped backoff, the relay's
//! status `sink down since T: ...no responders...`. The events go out by themselves once the
//! stream exists; a relay to a subject that no stream ever binds waits, visibly, for ever.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::context::{PublishAckFuture, PublishError, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::{Client, HeaderMap, HeaderValue, connection::State};

use tokio::time::Instant;

use super::{Message, Outcomes, SendError, Sink, SinkTiming};
use crate::error::{Error, Result};

/// The NATS client this module is built on (`async-nats`, with JetStream and rustls on ring),
/// re-exported so that code naming its types (creating the stream the sink publishes to, as in
/// [Preparing the stream](self#preparing-the-stream), or reading it back) uses exactly the
/// version and features ordo was built with, and needs no `async-nats` dependency of its own:
/// `use ordo::relay::nats::async_nats;`. Present with the `nats` feature.
pub use async_nats;

/// Maps a message to its subject.
pub type SubjectFn = Arc<dyn Fn(&Message) -> String + Send + Sync>;

/// The settings of a [`NatsSink`]: start with [`NatsSink::builder`].
#[must_use]
pub struct NatsSinkBuilder {
    url: String,
    subject_prefix: String,
    subject: Option<SubjectFn>,
    ack_timeout: Option<Duration>,
    connect_timeout: Duration,
    max_in_flight: usize,
    detail_headers: bool,
    stream: Option<String>,
    require_duplicate_window: bool,
}

/// An ack's timeout when none is set and no relay derived one.
const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(5);

impl fmt::Debug for NatsSinkBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsSinkBuilder")
            .field("url", &crate::wire::redact_url(&self.url))
            .field("subject_prefix", &self.subject_prefix)
            .field("custom_subject", &self.subject.is_some())
            .field("ack_timeout", &self.ack_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_in_flight", &self.max_in_flight)
            .field("detail_headers", &self.detail_headers)
            .field("stream", &self.stream)
            .field("require_duplicate_window", &self.require_duplicate_window)
            .finish()
    }
}

impl NatsSinkBuilder {
    /// The first subject token of the default subject `"{prefix}.{event_type}"`. Default
    /// `ordo`. Not empty, no spaces, no wildcard (`*`, `>`), no leading or trailing `.`.
    pub fn subject_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.subject_prefix = prefix.into();
        self
    }

    /// The subject of each message, instead of `"{prefix}.{event_type}"`. A subject that is
    /// not valid NATS makes that message fail permanently.
    pub fn subject(mut self, subject: impl Fn(&Message) -> String + Send + Sync + 'static) -> Self {
        self.subject = Some(Arc::new(subject));
        self
    }

    /// How long to wait for one message's stream ack, from its publish: past it, that message
    /// fails `Transient` (an attempt). Not zero. Default: derived by the relay that runs the
    /// sink, half its batch deadline, at most 5 s (5 s without a relay); one set at or past
    /// the relay's batch deadline is refused when the relay starts (see
    /// [`Sink::fit_to_deadline`]).
    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = Some(timeout);
        self
    }

    /// How long to wait for the server when connecting. Default 5 s; not zero.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How many acks may be awaited at once; past it, the next publish waits for the oldest
    /// ack. Default 1,024; not zero.
    pub fn max_in_flight(mut self, max: usize) -> Self {
        self.max_in_flight = max;
        self
    }

    /// Also send `Ordo-Sequence`, `Ordo-Recorded-At` and `Content-Type: application/json` with
    /// every message (see [Headers](self#headers)). Default off.
    ///
    /// ```
    /// let sink = ordo::relay::nats::NatsSink::builder("nats://127.0.0.1:4222")
    ///     .detail_headers(true)
    ///     .build()?;
    /// # Ok::<(), ordo::Error>(())
    /// ```
    pub fn detail_headers(mut self, on: bool) -> Self {
        self.detail_headers = on;
        self
    }

    /// The JetStream stream the subjects are bound to, whose `duplicate_window` the relay
    /// checks when it starts (see [Duplicate window](self#duplicate-window)). Default: the
    /// stream bound to `"{prefix}.>"` with the default subject; none with a custom
    /// [`subject`](Self::subject) (then the window is not checked unless named here).
    pub fn stream(mut self, name: impl Into<String>) -> Self {
        self.stream = Some(name.into());
        self
    }

    /// Refuse to start a relay whose stream's `duplicate_window` is shorter than the span over
    /// which the relay may send one message again ([`SinkTiming::resend_span`]), or whose
    /// window cannot be read, instead of logging a warning. Default off (see
    /// [Duplicate window](self#duplicate-window) for why).
    pub fn require_duplicate_window(mut self, on: bool) -> Self {
        self.require_duplicate_window = on;
        self
    }

    /// Checks the settings and returns the sink. It connects on its first
    /// [`send`](Sink::send), so a server that is down now is a transient send error later,
    /// not a start-up failure.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the setting: an empty URL, an invalid subject prefix,
    /// a zero timeout or `max_in_flight`.
    pub fn build(self) -> Result<NatsSink> {
        if self.url.trim().is_empty() {
            return Error::invalid_config("nats url", "is empty; pass e.g. nats://127.0.0.1:4222");
        }
        if self.subject.is_none() {
            check_prefix(&self.subject_prefix)?;
        }
        if self.ack_timeout.is_some_and(|timeout| timeout.is_zero()) {
            return Error::invalid_config("nats ack_timeout", "must be more than zero");
        }
        if self.connect_timeout.is_zero() {
            return Error::invalid_config("nats connect_timeout", "must be more than zero");
        }
        if self.max_in_flight == 0 {
            return Error::invalid_config("nats max_in_flight", "must be at least 1");
        }
        let probe = match (&self.stream, &self.subject) {
            (Some(stream), _) => Some(Probe::Stream(stream.clone())),
            (None, None) => Some(Probe::Subject(format!("{}.>", self.subject_prefix))),
            (None, Some(_)) => None,
        };
        let subject = self.subject.unwrap_or_else(|| {
            let prefix = self.subject_prefix;
            Arc::new(move |message: &Message| format!("{prefix}.{}", message.type_or_untyped()))
        });
        Ok(NatsSink {
            url: self.url,
            subject,
            configured_ack_timeout: self.ack_timeout,
            ack_timeout: self.ack_timeout.unwrap_or(DEFAULT_ACK_TIMEOUT),
            connect_timeout: self.connect_timeout,
            max_in_flight: self.max_in_flight,
            detail_headers: self.detail_headers,
            probe,
            require_duplicate_window: self.require_duplicate_window,
            connection: None,
            dirty: false,
        })
    }
}

fn check_prefix(prefix: &str) -> Result<()> {
    let bad = prefix.is_empty()
        || prefix.starts_with('.')
        || prefix.ends_with('.')
        || prefix.contains("..")
        || prefix
            .chars()
            .any(|c| c.is_whitespace() || c == '*' || c == '>');
    if bad {
        return Error::invalid_config(
            "nats subject_prefix",
            &format!(
                "{prefix:?} is not a subject prefix: it must be non-empty tokens separated by '.', without spaces or wildcards"
            ),
        );
    }
    Ok(())
}

/// How the sink finds its stream: named, or the stream bound to the default subjects.
#[derive(Debug, Clone)]
enum Probe {
    Stream(String),
    Subject(String),
}

struct Connection {
    client: Client,
    jetstream: async_nats::jetstream::Context,
}

/// Delivers to NATS JetStream. See the [module docs](self) for subjects and errors.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use ordo::relay::{Message, Outcomes, Sink, nats::NatsSink};
///
/// let mut sink = NatsSink::builder("nats://127.0.0.1:4222")
///     .subject_prefix("orders")
///     .build()?;
/// let batch = [Message::new(br#"{"order_id": 7}"#.as_slice()).with_event_type(Some("placed"))];
/// // Published on `orders.placed`, with Nats-Msg-Id = the event id.
/// let mut outcomes = Outcomes::new(batch.len());
/// sink.send(&batch, &mut outcomes).await?;
/// assert!(outcomes.all_delivered());
/// # Ok(()) }
/// ```
pub struct NatsSink {
    url: String,
    subject: SubjectFn,
    /// The ack timeout its user set, if any; otherwise `ack_timeout` is derived.
    configured_ack_timeout: Option<Duration>,
    ack_timeout: Duration,
    connect_timeout: Duration,
    max_in_flight: usize,
    detail_headers: bool,
    /// Where to find the stream whose duplicate window is checked at start-up.
    probe: Option<Probe>,
    require_duplicate_window: bool,
    connection: Option<Connection>,
    /// A `send` began and did not finish (its future was dropped): the connection's state is
    /// unknown, so the next `send` rebuilds it even if nobody called `reset`.
    dirty: bool,
}

impl fmt::Debug for NatsSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsSink")
            .field("target", &self.describe())
            .field("connected", &self.connection.is_some())
            .finish_non_exhaustive()
    }
}

impl NatsSink {
    /// Settings for a sink publishing through the server at `url` (`nats://host:port`,
    /// credentials in the URL if any), with the defaults above.
    pub fn builder(url: impl Into<String>) -> NatsSinkBuilder {
        NatsSinkBuilder {
            url: url.into(),
            subject_prefix: "ordo".to_owned(),
            subject: None,
            ack_timeout: None,
            connect_timeout: Duration::from_secs(5),
            max_in_flight: 1024,
            detail_headers: false,
            stream: None,
            require_duplicate_window: false,
        }
    }

    /// The stream's name and duplicate window, as the server reports them.
    async fn duplicate_window(&mut self) -> std::result::Result<(String, Duration), String> {
        let Some(probe) = self.probe.clone() else {
            return Err("no stream is named (a custom subject function: set `stream`)".to_owned());
        };
        let wait = self.connect_timeout;
        let connection = self.connect().await.map_err(|error| error.to_string())?;
        let jetstream = connection.jetstream.clone();
        let lookup = async move {
            let name = match probe {
                Probe::Stream(name) => name,
                Probe::Subject(subject) => jetstream
                    .stream_by_subject(subject.as_str())
                    .await
                    .map_err(|error| format!("finding the stream bound to {subject}: {error}"))?,
            };
            let stream = jetstream
                .get_stream(name.as_str())
                .await
                .map_err(|error| format!("reading stream {name:?}: {error}"))?;
            let window = stream.cached_info().config.duplicate_window;
            Ok::<_, String>((name, window))
        };
        tokio::time::timeout(wait, lookup)
            .await
            .map_err(|_| format!("the server did not answer within {wait:?}"))?
    }

    /// The start-up check of the stream's duplicate window against the relay's `timing`.
    async fn check_duplicate_window(&mut self, timing: &SinkTiming) -> Result<()> {
        let span = timing.resend_span;
        let relay = super::quoted(&timing.relay);
        let strict = self.require_duplicate_window;
        match self.duplicate_window().await {
            Ok((stream, window)) if window < span => {
                let stream = super::quoted(&stream);
                let reason = format!(
                    "stream {stream}'s duplicate_window ({window:?}) is shorter than the span over which relay {relay} may send one message again ({span:?}: batch_deadline, max_attempts, backoff and batch_size, see docs/relays.md): a copy sent after the window is stored twice, and receivers must deduplicate by message id; make the window at least {span:?}"
                );
                if strict {
                    return Err(Error::InvalidConfig {
                        setting: "nats duplicate_window/relay timing",
                        reason,
                    });
                }
                tracing::warn!(relay = %relay, %stream, ?window, ?span, "{reason}");
            }
            Ok((stream, window)) => {
                tracing::debug!(relay = %relay, stream = %super::quoted(&stream), ?window, ?span, "the stream's duplicate window covers the relay's re-sends");
            }
            Err(why) if strict => {
                return Err(Error::InvalidConfig {
                    setting: "nats duplicate_window/relay timing",
                    reason: format!(
                        "the stream's duplicate_window could not be checked ({why}) and require_duplicate_window is on"
                    ),
                });
            }
            Err(why) => {
                tracing::warn!(relay = %relay, %why, "the stream's duplicate_window was not checked");
            }
        }
        Ok(())
    }

    async fn connect(&mut self) -> Result<&Connection, SendError> {
        if self.connection.is_none() {
            let client = async_nats::ConnectOptions::new()
                .connection_timeout(self.connect_timeout)
                .connect(self.url.as_str())
                .await
                .map_err(|error| {
                    SendError::transient(format!("connecting to {}: {error}", self.describe()))
                })?;
            let jetstream = async_nats::jetstream::context::ContextBuilder::new()
                .timeout(self.ack_timeout)
                .max_ack_inflight(self.max_in_flight)
                .backpressure_on_inflight(true)
                .build(client.clone());
            self.connection = Some(Connection { client, jetstream });
        }
        self.connection
            .as_ref()
            .ok_or_else(|| SendError::transient("no NATS connection"))
    }

    fn lost(&self, client: &Client) -> Option<SendError> {
        (client.connection_state() == State::Disconnected)
            .then(|| SendError::transient(format!("the connection to {} is lost", self.describe())))
    }

    /// Publishes `batch`, pipelined, reporting each ack as it comes. Failures are reported
    /// at the end, once it is known whether the connection still stands: a failure on a lost
    /// connection is the batch's (`Err`, nobody blamed), on a live one the message's.
    async fn publish_all(
        &mut self,
        batch: &[Message],
        outcomes: &mut Outcomes,
    ) -> Result<(), SendError> {
        let subject = Arc::clone(&self.subject);
        let (detail, ack_timeout) = (self.detail_headers, self.ack_timeout);
        let connection = self.connect().await?;
        let (client, jetstream) = (connection.client.clone(), connection.jetstream.clone());
        if let Some(lost) = self.lost(&client) {
            return Err(lost);
        }
        // Pipelined: publishes go out without waiting for acks, up to `max_in_flight`
        // awaited at once (each holds one of the context's permits, so publishing more before
        // awaiting the oldest would wait for ever).
        let mut failures: Vec<(usize, SendError)> = Vec::new();
        let mut in_flight: VecDeque<InFlight> = VecDeque::new();
        for (index, message) in batch.iter().enumerate() {
            if in_flight.len() >= self.max_in_flight
                && let Some(oldest) = in_flight.pop_front()
            {
                oldest.land(outcomes, &mut failures).await;
            }
            let subject = match super::guarded("subject", || subject(message))
                .and_then(|subject| check_subject(&subject).map(|()| subject))
            {
                Ok(subject) => subject,
                Err(refused) => {
                    failures.push((index, refused));
                    continue;
                }
            };
            let headers = match headers(message, detail) {
                Ok(headers) => headers,
                Err(refused) => {
                    failures.push((index, refused));
                    continue;
                }
            };
            let publish = PublishMessage::build()
                .payload(message.payload.clone())
                .headers(headers);
            let due = Instant::now() + ack_timeout;
            match jetstream.send_publish(subject, publish).await {
                Ok(ack) => in_flight.push_back(InFlight { index, ack, due }),
                Err(error) => failures.push((index, classify(&error))),
            }
        }
        while let Some(oldest) = in_flight.pop_front() {
            oldest.land(outcomes, &mut failures).await;
        }
        if !failures.is_empty() && client.connection_state() != State::Connected {
            return Err(SendError::transient(format!(
                "the connection to {} was lost during the batch",
                self.describe()
            )));
        }
        for (index, error) in failures {
            outcomes.failed(index, error);
        }
        Ok(())
    }
}

/// A published message awaiting its stream ack, due by `due` (its publish + the ack timeout).
struct InFlight {
    index: usize,
    ack: PublishAckFuture,
    due: Instant,
}

impl InFlight {
    /// Its ack: a delivery is reported at once, a failure kept for the end of the batch.
    async fn land(self, outcomes: &mut Outcomes, failures: &mut Vec<(usize, SendError)>) {
        let result = match tokio::time::timeout_at(self.due, acked(self.ack)).await {
            Ok(result) => result,
            Err(_) => Err(SendError::transient(
                "no stream ack within the ack timeout of its publish",
            )),
        };
        match result {
            Ok(()) => outcomes.delivered(self.index),
            Err(error) => failures.push((self.index, error)),
        }
    }
}

/// One stream ack as a message's result. A duplicate ack (`duplicate: true`: the stream already
/// holds this id) is delivered.
async fn acked(ack: PublishAckFuture) -> Result<(), SendError> {
    ack.await.map(drop).map_err(|error| classify(&error))
}

mod names {
    use crate::wire::nats as wire;
    use async_nats::HeaderName;

    // Built once: a name made from a `&str` per message is an allocation and a check each.
    pub(super) const MSG_ID: HeaderName = HeaderName::from_static(wire::MSG_ID);
    pub(super) const POSITION: HeaderName = HeaderName::from_static(wire::POSITION);
    pub(super) const LANE: HeaderName = HeaderName::from_static(wire::LANE);
    pub(super) const SOURCE: HeaderName = HeaderName::from_static(wire::SOURCE);
    pub(super) const EVENT_TYPE: HeaderName = HeaderName::from_static(wire::EVENT_TYPE);
    pub(super) const KEY: HeaderName = HeaderName::from_static(wire::KEY);
    pub(super) const TRACEPARENT: HeaderName = HeaderName::from_static(crate::wire::TRACEPARENT);
    pub(super) const HEADERS: HeaderName = HeaderName::from_static(wire::HEADERS);
    pub(super) const SEQUENCE: HeaderName = HeaderName::from_static(wire::SEQUENCE);
    pub(super) const RECORDED_AT: HeaderName = HeaderName::from_static(wire::RECORDED_AT);
    pub(super) const CONTENT_TYPE: HeaderName = HeaderName::from_static(wire::CONTENT_TYPE);
}

/// `Nats-Msg-Id` for JetStream's dedup, and what a consumer wants without parsing the body;
/// with `detail`, the [detail headers](NatsSinkBuilder::detail_headers) too.
/// A message with a header value NATS cannot carry (a line break) is refused as its permanent
/// failure before anything is sent.
fn headers(message: &Message, detail: bool) -> Result<HeaderMap, SendError> {
    let mut headers = HeaderMap::new();
    let mut id = uuid::Uuid::encode_buffer();
    headers.insert(
        names::MSG_ID,
        &*message.id.hyphenated().encode_lower(&mut id),
    );
    headers.insert(names::POSITION, message.position.to_string());
    headers.insert(names::LANE, message.lane.as_str());
    // Text the event's writer chose (plain SQL can put a line break in it): checked, since the
    // client panics on a header value it cannot carry.
    let chosen = [
        (names::SOURCE, message.source.as_deref()),
        (names::EVENT_TYPE, message.event_type.as_deref()),
        (names::KEY, message.key.as_deref()),
        (names::TRACEPARENT, message.traceparent()),
    ];
    for (name, value) in chosen {
        if let Some(value) = value {
            let value = header_value(&name, value)?;
            headers.insert(name, value);
        }
    }
    if let Some(json) = message.headers_json() {
        headers.insert(names::HEADERS, json);
    }
    if detail {
        headers.insert(names::SEQUENCE, message.sequence.get().to_string());
        headers.insert(names::RECORDED_AT, message.recorded_at.to_rfc3339());
        headers.insert(names::CONTENT_TYPE, "application/json");
    }
    Ok(headers)
}

fn header_value(name: &async_nats::HeaderName, value: &str) -> Result<HeaderValue, SendError> {
    value.parse::<HeaderValue>().map_err(|_| {
        SendError::permanent(format!(
            "header {name} {} holds a line break, which a NATS header cannot carry",
            super::quoted(value)
        ))
    })
}

/// The longest subject published: the server refuses a control line (`HPUB`, the subject, the
/// reply inbox, two lengths) past 4,096 bytes by dropping the connection, which would look
/// like an outage; this leaves room for the rest of the line.
const MAX_SUBJECT: usize = 4_000;

/// A subject a message can be published on: dot-separated non-empty tokens, no whitespace,
/// no wildcard. Checked here so that a bad mapping is a permanent error naming the subject.
fn check_subject(subject: &str) -> Result<(), SendError> {
    if subject.len() > MAX_SUBJECT {
        return Err(SendError::permanent(format!(
            "the subject is {} bytes long, past the {MAX_SUBJECT} a NATS server takes",
            subject.len()
        )));
    }
    let valid = !subject.is_empty()
        && subject.split('.').all(|token| {
            !token.is_empty()
                && token != "*"
                && token != ">"
                && !token.chars().any(char::is_whitespace)
        });
    if valid {
        Ok(())
    } else {
        Err(SendError::permanent(format!(
            "{} is not a NATS subject a message can be published on",
            super::quoted(subject)
        )))
    }
}

/// How long a message waits after *no responders* (about: jittered by ±50%), or the relay's
/// outage backoff when that is longer.
const NO_STREAM_PAUSE: Duration = Duration::from_secs(1);

fn classify(error: &PublishError) -> SendError {
    use std::error::Error as _;
    let too_large = error
        .source()
        .and_then(|source| source.downcast_ref::<async_nats::jetstream::Error>())
        .is_some_and(|api| {
            api.error_code() == async_nats::jetstream::ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM
        });
    match error.kind() {
        PublishErrorKind::MaxPayloadExceeded => SendError::permanent(error.to_string()),
        PublishErrorKind::Other if too_large => SendError::permanent(error.to_string()),
        // The subject's destination is missing, not the message bad: an outage of that
        // subject (see the module docs), never an attempt, even in a batch that delivered
        // messages of other subjects (or of this one, once its stream is back).
        PublishErrorKind::StreamNotFound => SendError::Unavailable {
            message: format!(
                "no responders: no JetStream stream is bound to the subject ({error})"
            ),
            retry_after: NO_STREAM_PAUSE.mul_f64(0.5 + fastrand::f64()),
        },
        _ => SendError::transient(error.to_string()),
    }
}

impl Sink for NatsSink {
    async fn send(&mut self, batch: &[Message], outcomes: &mut Outcomes) -> Result<(), SendError> {
        if std::mem::replace(&mut self.dirty, true) {
            self.connection = None;
        }
        let sent = self.publish_all(batch, outcomes).await;
        if sent.is_err() {
            self.connection = None;
        }
        self.dirty = false;
        sent
    }

    async fn reset(&mut self) -> Result<(), SendError> {
        // Dropping the client closes its connection without waiting on the server.
        self.connection = None;
        self.dirty = false;
        self.connect().await.map(drop)
    }

    fn describe(&self) -> String {
        format!("nats {}", crate::wire::redact_url(&self.url))
    }

    /// Fits the ack timeout to the deadline, then checks the stream's duplicate window (see
    /// [Duplicate window](self#duplicate-window)).
    async fn prepare(&mut self, timing: &SinkTiming) -> Result<()> {
        self.fit_to_deadline(timing.batch_deadline)?;
        self.check_duplicate_window(timing).await
    }

    fn fit_to_deadline(&mut self, batch_deadline: Duration) -> Result<()> {
        let timeout = super::fitted_timeout(
            self.configured_ack_timeout,
            DEFAULT_ACK_TIMEOUT,
            batch_deadline,
            "nats ack_timeout/batch_deadline",
        )?;
        if timeout != self.ack_timeout {
            // The JetStream context carries the timeout: the next send builds it anew.
            self.ack_timeout = timeout;
            self.connection = None;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{check_subject, headers};
    use crate::relay::Message;

    #[test]
    fn what_nats_cannot_carry_is_refused_before_it_is_sent() {
        assert!(check_subject("orders.placed").is_ok());
        let long = format!("orders.{}", "x".repeat(4_000));
        assert!(check_subject(&long).is_err_and(|error| error.is_permanent()));
        let message = Message::new(&b"{}"[..]).with_key(Some("customer\n42"));
        assert!(headers(&message, false).is_err_and(|error| error.is_permanent()));
        let fine = Message::new(&b"{}"[..]).with_key(Some("customer-42"));
        assert!(headers(&fine, true).is_ok());
    }
}
