//! What an inbox receives ([`InboxMessage`]) and what it answers ([`Receipt`]).

use serde::de::DeserializeOwned;

use super::config::{MAX_NAME, MAX_ROUTE};
use crate::envelope::Headers;
use crate::error::{Error, Result};

/// One message as a transport delivered it: an id that is the same on every redelivery, the
/// payload as JSON text, headers, and for watermark mode the sending ordo's name and the
/// message's dense position there.
///
/// ```
/// use ordo::inbox::InboxMessage;
///
/// let message = InboxMessage::new("0190c3a4-7d1e-7c42-9f7a-2b1c1e0d5a11", r#"{"order_id":7}"#)
///     .with_source("orders-db", 42);
/// assert_eq!(message.position, Some(42));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct InboxMessage {
    /// The message's id (an ordo event id, a broker's message id, an idempotency key), 1 to
    /// 200 bytes. Deduplication is by this id within one consumer.
    pub id: String,
    /// The payload as the transport carried it (JSON text; not parsed by the inbox).
    pub payload: String,
    /// Headers (trace context, metadata), kept with a message that fails.
    pub headers: Headers,
    /// The sending ordo (watermark mode), 1 to 200 bytes.
    pub source: Option<String>,
    /// The message's dense position at `source` (watermark mode): 1, 2, 3, …
    pub position: Option<u64>,
    /// The sender's server history the position belongs to (`Ordo-History` and
    /// `Ordo-History-Start`: the id of the stretch of an ordo's commit log the position is in,
    /// and where it began). A watermark inbox that sees a newer history begin at or below its
    /// mark knows the sender lost the events it had there (a failover to a standby that lacked
    /// them, a restore, a crash) and gave the positions to new events: it reports the rewind
    /// and takes them instead of dropping them as duplicates. `None`: a sender that sends
    /// none, whose positions are taken as one history.
    pub history: Option<crate::ServerHistory>,
    /// The sender's route the message took (`Ordo-Route`: the destination an ordo relay sent
    /// it to, such as a subject): a watermark inbox keeps one mark per source and route, each
    /// route a chain of its own. `None`: the source's one route.
    pub route: Option<String>,
    /// The position of the message sent before this one on its route (`Ordo-Previous`; `0`:
    /// none before it). With it, a watermark inbox takes a position after positions the sender
    /// never sent on this route (events of other types, other routes, skipped by an operator)
    /// and still refuses one whose predecessor was sent and has not arrived. `None`: a sender
    /// whose positions on the route are dense (1, 2, 3, …).
    pub previous: Option<u64>,
}

impl InboxMessage {
    /// A message with no headers, source or position.
    pub fn new(id: impl Into<String>, payload: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            payload: payload.into(),
            headers: Headers::new(),
            source: None,
            position: None,
            history: None,
            route: None,
            previous: None,
        }
    }

    /// Sets the headers.
    pub fn with_headers(mut self, headers: Headers) -> Self {
        self.headers = headers;
        self
    }

    /// Sets where the message comes from and its dense position there (watermark mode).
    pub fn with_source(mut self, source: impl Into<String>, position: u64) -> Self {
        self.source = Some(source.into());
        self.position = Some(position);
        self
    }

    /// Sets the server history of the position ([`history`](Self::history)).
    pub fn with_history(mut self, history: crate::ServerHistory) -> Self {
        self.history = Some(history);
        self
    }

    /// Sets the route the message took at its source ([`route`](Self::route)).
    pub fn with_route(mut self, route: impl Into<String>) -> Self {
        self.route = Some(route.into());
        self
    }

    /// Sets the position of the message sent before it on its route
    /// ([`previous`](Self::previous)).
    ///
    /// ```
    /// use ordo::inbox::InboxMessage;
    ///
    /// // Position 12 of "orders-db", whose route sent position 9 before it (10 and 11 went
    /// // elsewhere, or were never sent): a mark at 9 takes it.
    /// let message = InboxMessage::new("e-12", "{}")
    ///     .with_source("orders-db", 12)
    ///     .with_previous(9);
    /// assert_eq!(message.previous, Some(9));
    /// ```
    pub fn with_previous(mut self, previous: u64) -> Self {
        self.previous = Some(previous);
        self
    }

    /// The payload decoded as `T`.
    ///
    /// # Errors
    /// What serde says when the payload is not a `T`: returned from a handler, it counts as a
    /// failed attempt.
    pub fn payload_as<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(&self.payload)
    }

    /// Refuses what cannot be stored or deduplicated: an empty or over-long id or source, a
    /// position out of range, NUL characters.
    pub(crate) fn check(&self, consumer: &str) -> Result<()> {
        let refuse = |reason: &str| {
            Err(Error::InvalidInboxMessage {
                consumer: consumer.to_owned(),
                id: self.id.chars().take(MAX_NAME).collect(),
                reason: reason.to_owned(),
            })
        };
        if self.id.is_empty() || self.id.len() > MAX_NAME {
            return refuse("the message id must be 1 to 200 bytes");
        }
        if let Some(source) = &self.source
            && (source.is_empty() || source.len() > MAX_NAME)
        {
            return refuse("the source must be 1 to 200 bytes");
        }
        if let Some(route) = &self.route
            && (route.is_empty() || route.len() > MAX_ROUTE)
        {
            return refuse("the route must be 1 to 1000 bytes");
        }
        if let (Some(previous), Some(position)) = (self.previous, self.position)
            && previous >= position
        {
            return refuse("the previous position on the route must be below the position");
        }
        // PostgreSQL's text cannot hold NUL; refused now rather than when a failure is stored.
        let nul = |text: &str| text.contains('\0');
        if nul(&self.id)
            || nul(&self.payload)
            || self.source.as_deref().is_some_and(nul)
            || self.route.as_deref().is_some_and(nul)
        {
            return refuse("the id, payload, source and route must not contain NUL characters");
        }
        if self.position.is_some_and(|p| p == 0 || p > i64::MAX as u64) {
            return refuse("a position is 1 or more (dense, from 1), at most i64::MAX");
        }
        Ok(())
    }
}

/// What the inbox did with a message, and so what the transport should do with it:
/// [`settled`](Self::settled) says whether to acknowledge it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Receipt {
    /// The handler ran and its transaction committed with the inbox's record. Acknowledge.
    Handled,
    /// Already handled (completed, or at or below the watermark): the handler did not run.
    /// Acknowledge.
    Duplicate,
    /// Another receiver is handling this message (row-per-message mode) or this source
    /// (watermark mode) right now; nothing was done. Do not acknowledge: have it redelivered
    /// later (a delayed nack), when it will be a duplicate or run if that attempt failed.
    Busy,
    /// The handler failed (its transaction rolled back); the attempt and error are recorded.
    /// Do not acknowledge: a redelivery tries again.
    Retry {
        /// Attempts made so far.
        attempts: u32,
        /// The handler's error.
        error: String,
    },
    /// The message has failed the maximum number of attempts: it is stored in `ordo.inbox` as
    /// `failed`, with its payload and error, and will not run again until an operator replays
    /// it ([`replay`](crate::inbox::replay)). Acknowledge: the inbox keeps it.
    Failed {
        /// Attempts made.
        attempts: u32,
        /// The last error.
        error: String,
    },
    /// Watermark mode: an earlier message of the source's route is missing (the message's
    /// [`previous`](InboxMessage::previous) position, or with none, the next dense one). Nothing
    /// was done. Do not acknowledge: have the transport redeliver (and the sender fill the
    /// gap) so that it arrives in order.
    Gap {
        /// The position that must arrive first.
        expected: u64,
    },
}

impl Receipt {
    /// Whether the inbox holds the message's outcome durably ([`Handled`](Self::Handled),
    /// [`Duplicate`](Self::Duplicate), [`Failed`](Self::Failed)), so the transport may
    /// acknowledge it and forget it. The others want a redelivery.
    pub fn settled(&self) -> bool {
        matches!(self, Self::Handled | Self::Duplicate | Self::Failed { .. })
    }

    /// The receipt's name, as the `receipt` label of `ordo_inbox_receipts_total` carries it:
    /// `handled`, `duplicate`, `busy`, `retry`, `failed` or `gap`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Handled => "handled",
            Self::Duplicate => "duplicate",
            Self::Busy => "busy",
            Self::Retry { .. } => "retry",
            Self::Failed { .. } => "failed",
            Self::Gap { .. } => "gap",
        }
    }
}
