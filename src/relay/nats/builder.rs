//! [`NatsSinkBuilder`]: the settings of a [`NatsSink`], checked when it is built.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{DEFAULT_ACK_TIMEOUT, Message, NatsSink, Probe, SubjectFn};
use crate::error::{Error, Result};
#[cfg(doc)]
use crate::relay::{Sink, SinkTiming};

/// The settings of a [`NatsSink`]: start with [`NatsSink::builder`].
#[must_use]
pub struct NatsSinkBuilder {
    pub(super) url: String,
    pub(super) subject_prefix: String,
    pub(super) subject: Option<SubjectFn>,
    pub(super) ack_timeout: Option<Duration>,
    pub(super) connect_timeout: Duration,
    pub(super) max_in_flight: usize,
    pub(super) detail_headers: bool,
    pub(super) stream: Option<String>,
    pub(super) require_duplicate_window: bool,
}

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
    /// fails `Transient` (an attempt, unless JetStream does not answer the sink's probe either,
    /// which also waits at most this long: see [Errors](super#errors-whose-fault)). Not zero. Default: derived by the relay that runs the
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
    /// every message (see [Headers](super#headers)). Default off.
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
    /// checks when it starts (see [Duplicate window](super#duplicate-window)). Default: the
    /// stream bound to `"{prefix}.>"` with the default subject; none with a custom
    /// [`subject`](Self::subject) (then the window is not checked unless named here).
    pub fn stream(mut self, name: impl Into<String>) -> Self {
        self.stream = Some(name.into());
        self
    }

    /// Refuse to start a relay whose stream's `duplicate_window` is shorter than the span over
    /// which the relay may send one message again ([`SinkTiming::resend_span`]), or whose
    /// window cannot be read, instead of logging a warning. Default off (see
    /// [Duplicate window](super#duplicate-window) for why).
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
            Arc::new(move |message: &Message| match &message.destination {
                Some(destination) => destination.clone(),
                None => format!("{prefix}.{}", message.type_or_untyped()),
            })
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
            framing: crate::relay::format::Framing::default(),
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
