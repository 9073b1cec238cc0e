//! What the broker adapters share: how a broker message becomes an [`InboxMessage`], and what
//! the adapter tells the broker once the inbox has answered.
//!
//! | the inbox answered | the adapter |
//! | --- | --- |
//! | `Handled`, `Duplicate`, `Failed` (the inbox holds the outcome) | acknowledges |
//! | `Busy` (another receiver has it) | has it redelivered after [`Redelivery::busy`] |
//! | `Gap` (watermark mode, an earlier position is missing) | has it redelivered after [`Redelivery::gap`] |
//! | `Retry` (the handler failed, attempts remain) | has it redelivered after the backoff for that attempt |
//! | a database error (nothing settled) | has it redelivered after [`Redelivery::busy`] |
//! | a message the inbox cannot store (no id, a payload that is not UTF-8 text, bad ordo headers) | rejects it for good: NATS `TERM`, RabbitMQ dead-letters it |

// Without a broker feature only `Redelivery` is reachable (it is public either way).
#![cfg_attr(
    not(any(feature = "kafka", feature = "nats", feature = "rabbitmq")),
    allow(dead_code)
)]

use std::time::Duration;

use super::message::{InboxMessage, Receipt};
use crate::envelope::Headers;
use crate::error::{Error, Result};
use crate::position::Ordering;
use crate::telemetry::clipped;

/// The longest delay [`Redelivery`] takes, each of its settings: 24 hours. Until its delay
/// is over a message holds its place at the broker (a RabbitMQ prefetch slot, a JetStream
/// ack-pending slot); a longer wait is a message parked by mistake, and JetStream takes the
/// delay in nanoseconds, which overflow past 292 years.
pub const MAX_REDELIVERY_DELAY: Duration = Duration::from_secs(24 * 3600);

/// When an adapter has a message it did not settle delivered again: by a delayed NATS `NAK`,
/// or a RabbitMQ `nack` with requeue after the delay.
///
/// ```
/// use std::time::Duration;
/// use ordo::inbox::Redelivery;
///
/// let redelivery = Redelivery::default()
///     .busy(Duration::from_millis(500))
///     .retry_backoff(Duration::from_secs(1), Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Redelivery {
    busy: Duration,
    gap: Duration,
    retry_initial: Duration,
    retry_max: Duration,
}

impl Default for Redelivery {
    /// Busy and gap 1 s; retries from 1 s doubling to 60 s.
    fn default() -> Self {
        Self {
            busy: Duration::from_secs(1),
            gap: Duration::from_secs(1),
            retry_initial: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
        }
    }
}

impl Redelivery {
    /// The delay for a message another receiver is handling now (and for one the inbox could
    /// not answer because the database failed). Default 1 s; more than zero, at most
    /// [`MAX_REDELIVERY_DELAY`] (24 hours), as every delay here.
    pub fn busy(mut self, delay: Duration) -> Self {
        self.busy = delay;
        self
    }

    /// The delay for a watermark-mode message that arrived before an earlier one. Default 1 s.
    pub fn gap(mut self, delay: Duration) -> Self {
        self.gap = delay;
        self
    }

    /// The delay after a failed attempt: `initial` after the first, doubling to `max`.
    /// Default 1 s to 60 s.
    pub fn retry_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.retry_initial = initial;
        self.retry_max = max;
        self
    }

    /// The delay after failed attempt number `attempts` (1 for the first).
    fn after_attempt(&self, attempts: u32) -> Duration {
        let doublings = attempts.saturating_sub(1).min(31);
        self.retry_initial
            .saturating_mul(1 << doublings)
            .min(self.retry_max)
    }

    pub(crate) fn validate(&self, adapter: &'static str) -> Result<()> {
        let zero = [
            ("busy", self.busy),
            ("gap", self.gap),
            ("retry_backoff", self.retry_initial),
        ]
        .into_iter()
        .find(|(_, delay)| delay.is_zero());
        if let Some((setting, _)) = zero {
            return Err(Error::InvalidConfig {
                setting: adapter,
                reason: format!(
                    "Redelivery::{setting} must be more than zero: a zero delay redelivers in a busy loop"
                ),
            });
        }
        let long = [
            ("busy", self.busy),
            ("gap", self.gap),
            ("retry_backoff", self.retry_max),
        ]
        .into_iter()
        .find(|(_, delay)| *delay > MAX_REDELIVERY_DELAY);
        if let Some((setting, _)) = long {
            return Err(Error::InvalidConfig {
                setting: adapter,
                reason: format!(
                    "Redelivery::{setting} must be at most 24 hours (MAX_REDELIVERY_DELAY): the message holds its place at the broker until then"
                ),
            });
        }
        if self.retry_initial > self.retry_max {
            return Err(Error::InvalidConfig {
                setting: adapter,
                reason: "Redelivery::retry_backoff: the initial delay must not exceed the maximum"
                    .to_owned(),
            });
        }
        Ok(())
    }
}

/// What the adapter tells the broker about one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Settle {
    /// The inbox holds the outcome: acknowledge.
    Ack,
    /// Deliver it again after this long.
    Redeliver(Duration),
    /// It can never be stored: reject it for good (dead-letter), for this reason.
    Reject(String),
}

/// The broker's answer for the inbox's `result`.
pub(crate) fn settle(result: &Result<Receipt>, redelivery: &Redelivery) -> Settle {
    match result {
        Ok(receipt) if receipt.settled() => Settle::Ack,
        Ok(Receipt::Retry { attempts, .. }) => {
            Settle::Redeliver(redelivery.after_attempt(*attempts))
        }
        Ok(Receipt::Gap { .. }) => Settle::Redeliver(redelivery.gap),
        Ok(_) => Settle::Redeliver(redelivery.busy),
        Err(Error::InvalidInboxMessage { reason, .. }) => Settle::Reject(reason.clone()),
        Err(_) => Settle::Redeliver(redelivery.busy),
    }
}

/// The most characters of a header value a refusal quotes: the values are a sender's, and a
/// refusal is logged.
const MAX_SHOWN: usize = 64;

/// The parts of a broker message the inbox reads, as the adapter found them.
#[derive(Debug, Default)]
pub(crate) struct Parts<'a> {
    /// The message id (`Nats-Msg-Id`, AMQP `message_id`).
    pub id: Option<&'a str>,
    pub payload: &'a [u8],
    /// `Ordo-Headers`: the stored header map as JSON.
    pub headers: Option<&'a str>,
    /// `Ordo-Source`.
    pub source: Option<&'a str>,
    /// `Ordo-Position`.
    pub position: Option<&'a str>,
    /// `Ordo-Lane`.
    pub lane: Option<&'a str>,
    /// `Ordo-History`.
    pub history: Option<&'a str>,
    /// `Ordo-History-Start`.
    pub history_start: Option<&'a str>,
    /// `Ordo-Route`.
    pub route: Option<&'a str>,
    /// `Ordo-Previous`.
    pub previous: Option<&'a str>,
}

impl Parts<'_> {
    /// The inbox message, or why the message cannot be one (it is rejected for good).
    ///
    /// The source and position are taken only from a commit-lane relay (or a sender that names
    /// no lane): an insert-lane position has gaps, which a watermark would wait on for ever.
    pub(crate) fn message(&self, id_header: &str) -> std::result::Result<InboxMessage, String> {
        let id = self.id.filter(|id| !id.is_empty()).ok_or_else(|| {
            format!("the message has no id ({id_header}): nothing to deduplicate on")
        })?;
        let payload = std::str::from_utf8(self.payload)
            .map_err(|_| "the payload is not UTF-8 text".to_owned())?;
        let mut message = InboxMessage::new(id, payload);
        if let Some(json) = self.headers {
            let headers: Headers = serde_json::from_str(json).map_err(|error| {
                format!(
                    "the Ordo-Headers header is not a JSON object: {}",
                    clipped(&error.to_string(), MAX_SHOWN)
                )
            })?;
            message = message.with_headers(headers);
        }
        let lane = match self.lane {
            None => None,
            Some(lane) if lane == Ordering::Commit.as_str() => Some(Ordering::Commit),
            Some(lane) if lane == Ordering::Insert.as_str() => Some(Ordering::Insert),
            Some(lane) => {
                return Err(format!(
                    "Ordo-Lane \"{}\" is neither commit nor insert",
                    clipped(lane, MAX_SHOWN)
                ));
            }
        };
        let position = match self.position {
            None => None,
            Some(text) => Some(text.parse::<u64>().map_err(|_| {
                format!(
                    "Ordo-Position \"{}\" is not a position",
                    clipped(text, MAX_SHOWN)
                )
            })?),
        };
        let number = |name: &str, text: &str| {
            text.parse::<u64>()
                .map_err(|_| format!("{name} \"{}\" is not a number", clipped(text, MAX_SHOWN)))
        };
        let history = match (self.history, self.history_start) {
            (None, None) => None,
            (Some(id), Some(start)) => {
                let id = number("Ordo-History", id)?;
                let first_position = number("Ordo-History-Start", start)?;
                Some(crate::ServerHistory { id, first_position })
            }
            _ => {
                return Err(
                    "Ordo-History and Ordo-History-Start come together or not at all".to_owned(),
                );
            }
        };
        let previous = match self.previous {
            None => None,
            Some(text) => Some(number("Ordo-Previous", text)?),
        };
        if let (Some(source), Some(position)) = (self.source, position)
            && lane != Some(Ordering::Insert)
        {
            message = message.with_source(source, position);
            if let Some(history) = history {
                message = message.with_history(history);
            }
            if let Some(route) = self.route {
                message = message.with_route(route);
            }
            if let Some(previous) = previous {
                message = message.with_previous(previous);
            }
        }
        Ok(message)
    }
}

#[cfg(test)]
mod tests;
