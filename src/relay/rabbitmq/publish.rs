//! Publishing a batch: opening the connection and its confirm-mode channel, the pipelined
//! publishes and their publisher confirms.

use std::collections::VecDeque;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::ShortString;
use lapin::{Channel, Confirmation, Connection, ConnectionProperties};

use tokio::time::Instant;

use super::health::{Closed, closed};
use super::properties::properties;
use super::{Message, Open, Outcomes, RabbitSink, SHORT_STRING_MAX, SendError, Sink};
use crate::error::Result;

impl RabbitSink {
    pub(super) async fn channel(&mut self) -> Result<Channel, SendError> {
        if let Some(open) = &self.connection {
            if open.channel.status().connected() {
                return Ok(open.channel.clone());
            }
            self.connection = None;
        }
        let opened = tokio::time::timeout(self.connect_timeout, open(&self.uri)).await;
        let open = match opened {
            Ok(Ok(open)) => open,
            Ok(Err(error)) => {
                return Err(SendError::transient(format!(
                    "connecting to {}: {error}",
                    self.describe()
                )));
            }
            Err(_) => {
                return Err(SendError::transient(format!(
                    "connecting to {}: no answer within {:?}",
                    self.describe(),
                    self.connect_timeout
                )));
            }
        };
        let channel = open.channel.clone();
        self.connection = Some(open);
        Ok(channel)
    }

    /// Publishes `batch` pipelined on one confirm-mode channel, reporting each confirm as it
    /// comes; `Err` when the connection failed (the unconfirmed messages blamed on nobody).
    pub(super) async fn publish_all(
        &mut self,
        batch: &[Message],
        outcomes: &mut Outcomes,
    ) -> Result<(), SendError> {
        let channel = self.channel().await?;
        let mut in_flight: VecDeque<Pending> = VecDeque::new();
        for (index, message) in batch.iter().enumerate() {
            if in_flight.len() >= self.pipeline_depth
                && let Some(oldest) = in_flight.pop_front()
            {
                self.land(oldest, outcomes).await?;
            }
            let (exchange, routing_key) = match self.destination(message) {
                Ok(destination) => destination,
                Err(refused) => {
                    outcomes.failed(index, refused);
                    continue;
                }
            };
            let body = match self.framing.body(message) {
                Ok(body) => body,
                Err(refused) => {
                    outcomes.failed(index, refused);
                    continue;
                }
            };
            let due = Instant::now() + self.confirm_timeout;
            let published = channel
                .basic_publish(
                    exchange.clone(),
                    routing_key,
                    // No `mandatory`: see the module docs.
                    BasicPublishOptions::default(),
                    &body,
                    properties(message, &self.framing),
                )
                .await;
            match published {
                Ok(confirm) => in_flight.push_back(Pending {
                    index,
                    confirm,
                    due,
                    exchange,
                }),
                // The broker closed the channel over an earlier message: this one was not
                // sent, and is not to blame (no outcome: released without an attempt).
                Err(_) if self.connection_alive() => {}
                Err(error) => return Err(self.lost(&error)),
            }
        }
        while let Some(oldest) = in_flight.pop_front() {
            self.land(oldest, outcomes).await?;
        }
        Ok(())
    }

    /// The exchange and routing key of `message`, or why it can never be published.
    fn destination(&self, message: &Message) -> Result<(ShortString, ShortString), SendError> {
        let (exchange, routing_key) = crate::relay::guarded("route", || (self.route)(message))?;
        if exchange.len() > SHORT_STRING_MAX || routing_key.len() > SHORT_STRING_MAX {
            return Err(SendError::permanent(format!(
                "exchange {} or routing key {} is longer than 255 bytes",
                crate::relay::quoted(&exchange),
                crate::relay::quoted(&routing_key)
            )));
        }
        Ok((ShortString::from(exchange), ShortString::from(routing_key)))
    }

    /// Awaits one publish's confirm, until it is due, and reports it (if it says anything of
    /// the message).
    async fn land(&self, pending: Pending, outcomes: &mut Outcomes) -> Result<(), SendError> {
        let outcome = match tokio::time::timeout_at(pending.due, pending.confirm).await {
            Ok(confirm) => self.confirmed(confirm, pending.exchange.as_str())?,
            Err(_) => Some(Err(SendError::transient(
                "no publisher confirm within the confirm timeout of its publish",
            ))),
        };
        if let Some(outcome) = outcome {
            outcomes.report(pending.index, outcome);
        }
        Ok(())
    }

    /// One confirm as a message's result (`None`: it says nothing of the message), or the
    /// batch's error when the connection failed.
    fn confirmed(
        &self,
        confirm: lapin::Result<Confirmation>,
        exchange: &str,
    ) -> Result<Option<Result<(), SendError>>, SendError> {
        let failed = |why: String| Ok(Some(Err(SendError::transient(why))));
        match confirm {
            Ok(Confirmation::Ack(None)) => Ok(Some(Ok(()))),
            // Only a `mandatory` publish comes back; this sink never sets it (module docs), so
            // a returned message means the flag crept in: fail loudly rather than lose it.
            Ok(Confirmation::Ack(Some(returned))) => failed(format!(
                "the broker returned the message as unroutable ({})",
                returned.reply_text
            )),
            // The broker's answer about this message: an attempt.
            Ok(Confirmation::Nack(_)) => {
                failed("the broker nacked the message (it could not store it)".to_owned())
            }
            Ok(Confirmation::NotRequested) => {
                failed("the channel was not in confirm mode".to_owned())
            }
            // A channel-level error: the broker refused something on this channel (a missing
            // exchange, an oversized message) and dropped every unconfirmed message with it;
            // the connection is fine. Whose fault, `health.rs` says.
            Err(error) if error.is_amqp_soft_error() && self.connection_alive() => {
                Ok(match closed(&error, exchange) {
                    Closed::Unavailable(unavailable) => Some(Err(unavailable)),
                    Closed::Unknown => None,
                })
            }
            Err(error) => Err(self.lost(&error)),
        }
    }

    /// Whether the connection still stands: a failure on a live connection is the channel's
    /// (blamed on the messages), on a dead one the batch's (no message blamed).
    fn connection_alive(&self) -> bool {
        self.connection
            .as_ref()
            .is_some_and(|open| open.connection.status().connected())
    }

    pub(super) fn lost(&self, error: &lapin::Error) -> SendError {
        SendError::transient(format!(
            "the connection to {} failed: {error}",
            self.describe()
        ))
    }
}

async fn open(uri: &str) -> lapin::Result<Open> {
    let connection = Connection::connect(uri, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok(Open {
        connection,
        channel,
    })
}

/// A published message awaiting its confirm, due by `due` (its publish + the confirm timeout).
struct Pending {
    index: usize,
    confirm: lapin::PublisherConfirm,
    due: Instant,
    exchange: ShortString,
}
