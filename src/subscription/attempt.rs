//! One unit's attempts: the handler and the checkpoint in one transaction, retries with capped
//! backoff (each failure recorded on the row for operators), and, once the attempts are
//! exhausted, the job's policy: halt at the unit, or dead-letter it and move on.
//!
//! A failed batch of several events is retried one event at a time, so retries and exhaustion
//! apply per event. An event that does not decode is not retried: it fails the same way every
//! time, so it goes straight to the exhaustion policy.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use serde::de::DeserializeOwned;
use sqlx::PgConnection;
use tracing::Instrument;

use super::config::{Batch, OnExhaustion};
use super::delivery::Delivery;
use super::runner::Runner;
use super::subscriber::Subscriber;
use crate::consumer::source::Item;
use crate::consumer::sql as row;
use crate::consumer::{ERROR_BACKOFF, Flow};
use crate::envelope::Envelope;
use crate::position::Position;
use crate::subscription::sql;
use crate::telemetry::metrics as m;

/// How one unit ended.
pub(super) enum Outcome {
    Committed(Position),
    Flow(Flow),
}

/// A failed attempt.
struct Failure {
    message: String,
    /// Decoding failures are not retried: they fail the same way every time.
    retryable: bool,
}

impl Failure {
    fn retryable(error: &(dyn std::error::Error + 'static)) -> Self {
        Self {
            message: crate::error::failure_text(error),
            retryable: true,
        }
    }

    /// The handler panicked: tried again, like an error.
    fn panicked() -> Self {
        Self {
            message: "the handler panicked".to_owned(),
            retryable: true,
        }
    }
}

impl<P, S> Runner<P, S>
where
    P: DeserializeOwned + Send + Sync + 'static,
    S: Subscriber<P>,
{
    /// Handles a unit with retries, after `failed` attempts already made; a failed batch of
    /// several events is retried one by one.
    pub(super) async fn handle_unit(
        &mut self,
        unit: &[Item<P>],
        position: Position,
        failed: u32,
    ) -> Outcome {
        let mut attempt = failed;
        loop {
            attempt += 1;
            let failure = match self.attempt(unit, position, attempt).await {
                Ok(outcome) => return outcome,
                Err(failure) => failure,
            };
            if unit.len() > 1 && matches!(self.config.batch, Batch::UpTo(_)) {
                return self.one_by_one(unit, position).await;
            }
            // An event that does not decode fails the same way every time: not retried, and
            // sent where `on_undecodable` says. No handler ran, so none is blamed.
            if !failure.retryable {
                tracing::warn!(
                    subscription = %self.config.name, error = %failure.message,
                    "an event does not decode as the subscription's payload type; no handler ran"
                );
                let policy = self.config.on_undecodable;
                return self
                    .exhaust(policy, unit, position, attempt, &failure.message)
                    .await;
            }
            tracing::warn!(
                subscription = %self.config.name, attempt, error = %failure.message,
                "handler failed"
            );
            if attempt >= self.config.retry.max_attempts {
                let policy = self.config.on_exhaustion;
                return self
                    .exhaust(policy, unit, position, attempt, &failure.message)
                    .await;
            }
            metrics::counter!(m::SUBSCRIPTION_RETRIES, "subscription" => self.config.name.clone())
                .increment(1);
            if let Some(flow) = self.record_failure(attempt, &failure.message).await {
                return Outcome::Flow(flow);
            }
            let wait = self.config.retry.backoff(attempt);
            if let Flow::Stop = self.core.pause(wait).await {
                return Outcome::Flow(Flow::Stop);
            }
        }
    }

    async fn one_by_one(&mut self, unit: &[Item<P>], mut position: Position) -> Outcome {
        for item in unit {
            match Box::pin(self.handle_unit(std::slice::from_ref(item), position, 0)).await {
                Outcome::Committed(next) => position = next,
                flow => return flow,
            }
        }
        Outcome::Committed(position)
    }

    /// One try (number `attempt`): the handler and the checkpoint in one transaction.
    async fn attempt(
        &self,
        unit: &[Item<P>],
        position: Position,
        attempt: u32,
    ) -> Result<Outcome, Failure> {
        let events = self.deliveries(unit, attempt)?;
        let Some(next) = unit.last().map(|item| item.position) else {
            return Ok(Outcome::Committed(position));
        };
        let mut tx = self
            .core
            .pool
            .begin_with(sql::begin_bounded(self.config.lease))
            .await
            .map_err(|error| Failure::retryable(&error))?;
        if let Err(failure) = self.call_handler(&mut tx, &events).await {
            sql::roll_back(tx).await;
            return Err(failure);
        }
        let fenced = match self.checkpoint(&mut tx, position, next).await {
            Ok(fenced) => fenced,
            Err(error) => {
                sql::roll_back(tx).await;
                return Err(Failure::retryable(&error));
            }
        };
        if !fenced {
            // Lost the lease, or an operator moved the subscription: the handler's writes go.
            sql::roll_back(tx).await;
            return Ok(Outcome::Flow(Flow::Reclaim));
        }
        match tx.commit().await {
            Ok(()) => Ok(Outcome::Committed(next)),
            // The outcome is unknown (e.g. the connection dropped during COMMIT): the stored
            // position says what happened.
            Err(_) => Ok(Outcome::Flow(Flow::Reclaim)),
        }
    }

    /// The unit's handled (not skipped) events as attempt `attempt`; an undecodable one fails
    /// the attempt, for good.
    fn deliveries(&self, unit: &[Item<P>], attempt: u32) -> Result<Vec<Delivery<P>>, Failure> {
        let mut events = Vec::with_capacity(unit.len());
        for item in unit.iter().filter(|item| !item.skipped) {
            match &item.event {
                Ok(event) => events.push(
                    Delivery::new(Arc::clone(event))
                        .with_position(item.position)
                        .with_ends_group(item.boundary)
                        .with_attempt(attempt),
                ),
                Err(row) => {
                    return Err(Failure {
                        message: format!(
                            "the payload of ordo.events sequence {} does not decode: {}",
                            item.sequence, row.error
                        ),
                        retryable: false,
                    });
                }
            }
        }
        Ok(events)
    }

    /// The subscriber on `events` inside `tx`; its error or panic fails the attempt.
    async fn call_handler(
        &self,
        tx: &mut PgConnection,
        events: &[Delivery<P>],
    ) -> Result<(), Failure> {
        let handled = AssertUnwindSafe(async {
            if let (Batch::Groups, Some(first)) = (self.config.batch, events.first()) {
                let span = self.handler_span(first, "ordo.handle_group");
                self.subscriber
                    .handle_group(tx, events)
                    .instrument(span)
                    .await
            } else {
                for event in events {
                    let span = self.handler_span(event, "ordo.handle");
                    self.subscriber.handle(tx, event).instrument(span).await?;
                }
                Ok(())
            }
        })
        .catch_unwind()
        .await;
        match handled {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(Failure::retryable(&*error)),
            Err(_) => Err(Failure::panicked()),
        }
    }

    fn handler_span(&self, event: &Envelope<P>, name: &'static str) -> tracing::Span {
        handler_span(&self.config.name, event, name)
    }

    /// Moves the position from `from` to `to` in `tx`; false when the fence refuses.
    async fn checkpoint(
        &self,
        tx: &mut PgConnection,
        from: Position,
        to: Position,
    ) -> Result<bool, sqlx::Error> {
        let config = &self.config;
        sql::checkpoint(tx, &config.name, self.core.owner, from, to, config.lease).await
    }

    async fn record_failure(&self, attempt: u32, message: &str) -> Option<Flow> {
        self.core.status.send_modify(|status| {
            status.attempts = attempt;
            status.last_error = Some(message.to_owned());
        });
        let config = &self.config;
        let recorded = sql::record_failure(
            &self.core.pool,
            &config.name,
            self.core.owner,
            attempt,
            message,
            config.lease,
        )
        .await;
        match recorded {
            Ok(true) => None,
            Ok(false) => Some(Flow::Reclaim),
            Err(error) => {
                tracing::warn!(%error, "recording a failed attempt failed");
                None
            }
        }
    }

    async fn exhaust(
        &mut self,
        policy: OnExhaustion,
        unit: &[Item<P>],
        position: Position,
        attempts: u32,
        message: &str,
    ) -> Outcome {
        match policy {
            OnExhaustion::Halt => {
                let name = &self.config.name;
                let halted = row::halt(
                    &self.core.pool,
                    name,
                    self.core.owner,
                    attempts,
                    message,
                    position,
                )
                .await;
                match halted {
                    Ok(true) => {
                        tracing::error!(subscription = %name, position = position.get(), %message, "subscription halted");
                        metrics::counter!(m::SUBSCRIPTION_HALTS, "subscription" => name.clone())
                            .increment(1);
                    }
                    Ok(false) => {
                        tracing::warn!(subscription = %name, position = position.get(), "the subscription's row changed (lease or position) before it could halt; claiming again");
                    }
                    Err(error) => tracing::warn!(%error, "halting the subscription failed"),
                }
                Outcome::Flow(Flow::Reclaim)
            }
            OnExhaustion::DeadLetter => {
                match self.dead_letter(unit, position, attempts, message).await {
                    Ok(outcome) => outcome,
                    Err(error) => {
                        tracing::warn!(%error, "dead-lettering failed; will try again");
                        Outcome::Flow(self.core.pause(ERROR_BACKOFF).await)
                    }
                }
            }
        }
    }

    /// Copies the unit's handled events into `ordo.dead_letters` and checkpoints past them, in
    /// one transaction.
    async fn dead_letter(
        &self,
        unit: &[Item<P>],
        position: Position,
        attempts: u32,
        message: &str,
    ) -> Result<Outcome, sqlx::Error> {
        let Some(next) = unit.last().map(|item| item.position) else {
            return Ok(Outcome::Committed(position));
        };
        let name = &self.config.name;
        let mut tx = self
            .core
            .pool
            .begin_with(sql::begin_bounded(self.config.lease))
            .await?;
        for item in unit.iter().filter(|item| !item.skipped) {
            sql::dead_letter(
                &mut tx,
                name,
                item.position,
                item.sequence,
                message,
                attempts,
            )
            .await?;
        }
        if !self.checkpoint(&mut tx, position, next).await? {
            tx.rollback().await?;
            return Ok(Outcome::Flow(Flow::Reclaim));
        }
        match tx.commit().await {
            Ok(()) => {
                tracing::warn!(subscription = %name, position = next.get(), "dead-lettered");
                let dead = unit.iter().filter(|item| !item.skipped).count();
                metrics::counter!(m::DEAD_LETTERS, "subscription" => name.clone())
                    .increment(dead as u64);
                Ok(Outcome::Committed(next))
            }
            Err(_) => Ok(Outcome::Flow(Flow::Reclaim)),
        }
    }
}

/// The span a handler call runs in; its parent is the publisher's trace context, when the
/// event carries one (see `telemetry::trace`).
pub(super) fn handler_span<P>(
    subscription: &str,
    event: &Envelope<P>,
    name: &'static str,
) -> tracing::Span {
    let span = if name == "ordo.handle_group" {
        tracing::info_span!("ordo.handle_group", subscription = %subscription, sequence = event.sequence.get())
    } else {
        tracing::info_span!("ordo.handle", subscription = %subscription, sequence = event.sequence.get())
    };
    crate::telemetry::trace::adopt(&span, &event.headers);
    span
}
