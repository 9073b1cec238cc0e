//! Publishing a batch: opening the connection, the pipelined publishes and their stream acks,
//! and how a publish error is classified.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::context::{PublishAckFuture, PublishError, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::{Client, connection::State};

use tokio::time::Instant;

use super::headers::{check_subject, headers};
use super::{Connection, Message, NatsSink, Outcomes, SendError, Sink};
use crate::error::Result;

impl NatsSink {
    pub(super) async fn connect(&mut self) -> Result<&Connection, SendError> {
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

    pub(super) fn lost(&self, client: &Client) -> Option<SendError> {
        (client.connection_state() == State::Disconnected)
            .then(|| SendError::transient(format!("the connection to {} is lost", self.describe())))
    }

    /// Publishes `batch`, pipelined, reporting each ack as it comes. Failures are reported
    /// at the end, once it is known whether the connection still stands: a failure on a lost
    /// connection is the batch's (`Err`, nobody blamed), on a live one the message's.
    pub(super) async fn publish_all(
        &mut self,
        batch: &[Message],
        outcomes: &mut Outcomes,
    ) -> Result<(), SendError> {
        let subject = Arc::clone(&self.subject);
        let (detail, ack_timeout) = (self.detail_headers, self.ack_timeout);
        let framing = self.framing.clone();
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
            let subject = match crate::relay::guarded("subject", || subject(message))
                .and_then(|subject| check_subject(&subject).map(|()| subject))
            {
                Ok(subject) => subject,
                Err(refused) => {
                    failures.push((index, refused));
                    continue;
                }
            };
            let framed = headers(message, detail, &framing)
                .and_then(|headers| Ok((headers, framing.body(message)?)));
            let (headers, body) = match framed {
                Ok(framed) => framed,
                Err(refused) => {
                    failures.push((index, refused));
                    continue;
                }
            };
            let publish = PublishMessage::build().payload(body).headers(headers);
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

/// How long a message waits after *no responders* (about: jittered by ±50%), or the relay's
/// outage backoff when that is longer.
const NO_STREAM_PAUSE: Duration = Duration::from_secs(1);

/// Whose fault a failed publish is (see the module docs' table): the message's (`Permanent`,
/// `Transient`: the stream refused that message, or its ack did not come in time), or the
/// stream's (`Unavailable`: no stream listens, or the stream takes nothing now).
fn classify(error: &PublishError) -> SendError {
    use std::error::Error as _;
    let refusal = error
        .source()
        .and_then(|source| source.downcast_ref::<async_nats::jetstream::Error>());
    match (error.kind(), refusal) {
        (PublishErrorKind::MaxPayloadExceeded, _) => SendError::permanent(error.to_string()),
        // The subject's destination is missing, not the message bad: an outage of that
        // subject (see the module docs), never an attempt, even in a batch that delivered
        // messages of other subjects (or of this one, once its stream is back).
        (PublishErrorKind::StreamNotFound, _) => SendError::Unavailable {
            message: format!(
                "no responders: no JetStream stream is bound to the subject ({error})"
            ),
            retry_after: NO_STREAM_PAUSE.mul_f64(0.5 + fastrand::f64()),
        },
        (PublishErrorKind::Other, Some(refusal)) => refused(refusal, error),
        _ => SendError::transient(error.to_string()),
    }
}

/// The stream's refusal of one message: its own for the message (too large: permanent; a
/// subject over its per-subject limit, anything else: transient, an attempt), or the stream's
/// state for every message (out of room or resources, JetStream off: unavailable).
fn refused(refusal: &async_nats::jetstream::Error, error: &PublishError) -> SendError {
    use async_nats::jetstream::ErrorCode;
    let code = refusal.error_code();
    let said = refusal.to_string();
    // A stream with `discard: new` at its `max_msgs` or `max_bytes` refuses everything
    // ("maximum messages exceeded", "maximum bytes exceeded"; not "... per subject exceeded",
    // which is about the message's subject).
    let full = code == ErrorCode::STREAM_STORE_FAILED
        && (said.contains("maximum messages exceeded") || said.contains("maximum bytes exceeded"));
    let stream_state = full
        || [
            ErrorCode::INSUFFICIENT_RESOURCES,
            ErrorCode::STORAGE_RESOURCES_EXCEEDED,
            ErrorCode::ACCOUNT_RESOURCES_EXCEEDED,
            ErrorCode::JETSTREAM_NOT_ENABLED,
            ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT,
        ]
        .contains(&code);
    if code == ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM {
        SendError::permanent(error.to_string())
    } else if stream_state {
        SendError::Unavailable {
            message: format!("the stream takes no message now: {said}"),
            retry_after: NO_STREAM_PAUSE.mul_f64(0.5 + fastrand::f64()),
        }
    } else {
        SendError::transient(format!("the stream refused the message: {said}"))
    }
}
