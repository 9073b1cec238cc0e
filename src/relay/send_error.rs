//! Why a message (or a whole batch) was not delivered, and whose fault it is: what a
//! [`Sink`](super::Sink) reports.

use std::fmt;
use std::time::Duration;

/// Why a message (or a whole batch) was not delivered, and whose fault it is.
///
/// A sink says whether a failure is **the message's** (the receiver refused it or did not
/// answer it: [`Transient`](SendError::Transient), [`Permanent`](SendError::Permanent)) or
/// **the sink's** (it, or the message's destination, cannot take anything now:
/// [`Unavailable`](SendError::Unavailable), or `Err` from [`Sink::send`](super::Sink::send)). A
/// message's failure counts an attempt, even when nothing else is in flight: the relay retries a
/// transient one later (no sooner than `retry_after` when the receiver asked for a pause) and
/// parks the event after its maximum attempts; a permanent one parks it at once, because sending
/// the same bytes again cannot succeed (a request the receiver rejects as malformed, a message
/// larger than the broker takes). The sink's failure counts nothing and parks nothing
/// (`docs/relays.md`, "The failure model").
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendError {
    /// That message failed, and trying it again may succeed: the receiver answered it with an
    /// error (an HTTP 5xx, a broker nack or error ack), dropped its connection after it was
    /// sent, or did not answer it in time. Counts an attempt. When a batch delivered nothing
    /// and its failures could be the sink's (every message timed out), the relay asks
    /// [`Sink::probe`](super::Sink::probe) first: a sink that does not answer its probe is down,
    /// and nothing is counted.
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
    /// The message's destination cannot take anything now, by what it says about itself: a
    /// connection refused, a name that does not resolve, a failed TLS handshake, no stream
    /// bound to the subject, a missing exchange, a destination that does not answer its
    /// probe. Not the message's fault: no attempt is counted; the message is tried again
    /// after `retry_after`. A sink with many destinations (webhook URLs by route) reports this
    /// so that one dead destination holds only its own messages, in an outage of its own; a
    /// batch whose every message is unavailable shows the whole sink as down.
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
