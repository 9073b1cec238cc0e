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
//! relay's lane: `commit`, dense, or `insert`), on the commit lane `Ordo-History` and
//! `Ordo-History-Start` ([`Message::history`](super::Message::history)), `Ordo-Route` (the
//! subject) and `Ordo-Previous` ([`Message::previous`](super::Message::previous)), and when
//! present `Ordo-Source`
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
//! # Errors: whose fault
//!
//! A failure is the message's (`Transient`, `Permanent`: an attempt, even when nothing else is
//! in flight) when the stream answered about that message or did not answer it in time, and
//! the sink's (no attempt) when the server or the stream says it cannot take anything:
//!
//! | what happened | [`SendError`] |
//! | --- | --- |
//! | no connection, the connection was lost during the batch | outer `Transient` (the sink's: no message blamed) |
//! | *no responders*: no stream listens on the subject | `Unavailable` (see below) |
//! | the stream takes nothing now: `discard: new` at its `max_msgs` or `max_bytes`, out of storage or account resources, JetStream not enabled | `Unavailable` |
//! | no ack within [`ack_timeout`](NatsSinkBuilder::ack_timeout) of its publish | `Transient`, once the stream answered the sink's probe |
//! | the stream refused the message: over the per-subject limit with `discard_new_per_subject`, any other error ack | `Transient` |
//! | a message larger than the server's or the stream's maximum | `Permanent` |
//! | an invalid subject, one over 4,000 bytes, a key, type, source or `traceparent` holding a line break (refused before it is sent) | `Permanent` |
//! | the [`subject`](NatsSinkBuilder::subject) function panicked on the message | `Permanent` |
//!
//! **The probe.** When a batch delivered nothing and a message timed out, the relay asks the
//! sink ([`Sink::probe`]) before it counts anything: the sink asks JetStream for its stream's
//! information (the stream named with [`stream`](NatsSinkBuilder::stream), or the one bound to
//! `"{prefix}.>"`; the account's information with a custom subject and no stream named) on
//! the connection the batch used, within the ack timeout. Answered, the timeouts are the
//! messages' (each an attempt); not answered (a broker that stopped answering, a link that
//! black-holes or crawls), the batch is an outage.
//!
//! *No responders* is an outage of the subject, never the message's failure: the client cannot
//! tell "no stream is bound to this subject" from "the stream is being created, moved or
//! elected" (a server restart, a cluster leader election), and a missing stream is the sink's
//! state, not the event's. So no attempt is counted and nothing parks: the message is sent
//! again after about a second (or the relay's outage backoff, when every message of the batch
//! failed so), the relay's status says `sink down since T: ...no responders...` while every
//! message it sends fails so, and the events go out by themselves once the stream exists. (As a
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

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_nats::Client;

use super::{Message, Outcomes, SendError, Sink, SinkTiming};
use crate::error::{Error, Result};

mod builder;
mod headers;
mod health;
mod publish;

pub use builder::NatsSinkBuilder;

/// The NATS client this module is built on (`async-nats`, with JetStream and rustls on ring),
/// re-exported so that code naming its types (creating the stream the sink publishes to, as in
/// [Preparing the stream](self#preparing-the-stream), or reading it back) uses exactly the
/// version and features ordo was built with, and needs no `async-nats` dependency of its own:
/// `use ordo::relay::nats::async_nats;`. Present with the `nats` feature.
pub use async_nats;

/// Maps a message to its subject.
pub type SubjectFn = Arc<dyn Fn(&Message) -> String + Send + Sync>;

/// An ack's timeout when none is set and no relay derived one.
const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// The relay's envelope, learned in `prepare`.
    framing: crate::relay::format::Framing,
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
}

impl Sink for NatsSink {
    /// The subject.
    fn router(&self) -> Option<crate::relay::Router> {
        Some(Arc::clone(&self.subject))
    }

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

    /// The stream's information, asked on the last batch's connection (see
    /// [Errors](self#errors-whose-fault)).
    async fn probe(&mut self) -> Result<(), SendError> {
        self.health().await
    }

    fn describe(&self) -> String {
        format!("nats {}", crate::wire::redact_url(&self.url))
    }

    /// Fits the ack timeout to the deadline, then checks the stream's duplicate window (see
    /// [Duplicate window](self#duplicate-window)).
    async fn prepare(&mut self, timing: &SinkTiming) -> Result<()> {
        self.framing = crate::relay::format::Framing::of(timing);
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
mod tests;
