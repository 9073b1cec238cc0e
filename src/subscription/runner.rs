//! The subscription runner: claim the lease, read the lane from the stored position, handle
//! each unit (an event, a batch or a group) in a transaction that also checkpoints, retry,
//! and apply the exhaustion policy.
//!
//! ```text
//!            claim ok, active                 lease lost / reset / commit unknown
//!  Starting ───────────────────▶ Running ──────────────────────────────┐
//!     ▲  claim refused ▲    │ exhausted + Halt          pause          │
//!     │   ▼            │    ▼                             ▼            │
//!     │ Standby        │  Halted ── resume ──▶ Running   Paused ─ resume ─▶ Running
//!     └────────────────┴───────────────────────────────────────────────┘
//!  any state ── shutdown ──▶ Stopped (lease released)
//! ```

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use serde::de::DeserializeOwned;
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;
use uuid::Uuid;

use super::config::{Batch, JobConfig, OnExhaustion};
use super::delivery::Delivery;
use super::handle::{Position, SubscriptionState, SubscriptionStatus};
use super::source::{Item, Source};
use super::sql;
use super::subscriber::Subscriber;
use crate::commit_lane::CommitShared;
use crate::envelope::Envelope;
use crate::insert_lane::LaneShared;
use crate::insert_lane::rows::{to_i64, to_u64};
use crate::ops::metrics as m;
use crate::task::StopSignal;

/// After a database error outside a handler, wait this long before trying again.
const ERROR_BACKOFF: Duration = Duration::from_millis(200);

/// The stored row, as a claim or renewal returns it.
struct Row_ {
    position: u64,
    status: String,
    attempts: u32,
    last_error: Option<String>,
}

impl Row_ {
    fn read(row: &PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            position: to_u64(row.try_get("position")?),
            status: row.try_get("status")?,
            attempts: u32::try_from(row.try_get::<i32, _>("attempts")?).unwrap_or(0),
            last_error: row.try_get("last_error")?,
        })
    }
}

/// Why processing from a position ended.
enum Flow {
    /// Claim again: the lease was lost, the row changed under us, or a commit's outcome is
    /// unknown. The stored row is the truth.
    Reclaim,
    Stop,
}

/// How one unit ended.
enum Outcome {
    Committed(u64),
    Flow(Flow),
}

/// A failed attempt.
struct Failure {
    message: String,
    /// Decoding failures are not retried: they fail the same way every time.
    retryable: bool,
}

pub(crate) struct Runner<P, S> {
    pub(crate) pool: PgPool,
    pub(crate) lane: Arc<LaneShared<P>>,
    pub(crate) commit: Arc<CommitShared>,
    pub(crate) config: JobConfig,
    pub(crate) subscriber: Arc<S>,
    pub(crate) owner: Uuid,
    pub(crate) stop: StopSignal,
    pub(crate) status: watch::Sender<SubscriptionStatus>,
}

impl<P, S> Runner<P, S>
where
    P: DeserializeOwned + Send + Sync + 'static,
    S: Subscriber<P>,
{
    fn lease_ms(&self) -> f64 {
        self.config.lease.as_secs_f64() * 1000.0
    }

    fn renew_every(&self) -> Duration {
        self.config.lease / 3
    }

    fn set_state(&self, state: SubscriptionState, row: Option<&Row_>) {
        let ordering = self.config.ordering;
        self.status.send_modify(|status| {
            status.state = state;
            if let Some(row) = row {
                status.position = Position::new(ordering, row.position);
                status.attempts = row.attempts;
                status.last_error = row.last_error.clone();
            }
        });
    }

    pub(crate) async fn run(mut self) {
        loop {
            if self.stop.is_stopped() {
                break;
            }
            let flow = match self.claim().await {
                Ok(Some(row)) if row.status == "active" => {
                    self.set_state(SubscriptionState::Running, Some(&row));
                    self.process_from(row.position, row.attempts).await
                }
                Ok(Some(row)) => {
                    let state = if row.status == "halted" {
                        SubscriptionState::Halted
                    } else {
                        SubscriptionState::Paused
                    };
                    self.set_state(state, Some(&row));
                    self.pause(self.renew_every()).await
                }
                Ok(None) => {
                    self.set_state(SubscriptionState::Standby, None);
                    self.pause(self.renew_every()).await
                }
                Err(error) => {
                    tracing::warn!(%error, subscription = %self.config.name, "claiming failed");
                    self.pause(ERROR_BACKOFF).await
                }
            };
            if matches!(flow, Flow::Stop) {
                break;
            }
        }
        if let Err(error) = sqlx::query(sql::RELEASE)
            .bind(&self.config.name)
            .bind(self.owner)
            .execute(&self.pool)
            .await
        {
            tracing::warn!(%error, subscription = %self.config.name, "releasing the lease failed; it expires by itself");
        }
        self.set_state(SubscriptionState::Stopped, None);
    }

    async fn pause(&mut self, wait: Duration) -> Flow {
        tokio::select! {
            biased;
            _ = self.stop.stopped() => Flow::Stop,
            _ = tokio::time::sleep(wait) => Flow::Reclaim,
        }
    }

    /// Takes the lease if free, expired or ours; the row, or `None` if another runner holds it.
    async fn claim(&self) -> Result<Option<Row_>, sqlx::Error> {
        self.lease_statement(sql::CLAIM).await
    }

    /// Extends a lease we hold; the row, or `None` if we lost it.
    async fn renew(&self) -> Result<Option<Row_>, sqlx::Error> {
        self.lease_statement(sql::RENEW).await
    }

    async fn lease_statement(&self, statement: &'static str) -> Result<Option<Row_>, sqlx::Error> {
        let row = sqlx::query(statement)
            .bind(&self.config.name)
            .bind(self.owner)
            .bind(self.lease_ms())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(Row_::read).transpose()
    }

    /// Handles units from `position` on until the lease is lost, the row changes, or a stop.
    /// `failed` attempts at the next unit are already stored (by an earlier runner): they count.
    async fn process_from(&mut self, mut position: u64, mut failed: u32) -> Flow {
        let mut source = Source::new(
            self.config.ordering,
            &self.lane,
            &self.commit,
            self.stop.clone(),
            position,
            self.config.types.clone(),
        );
        let mut renew_at = Instant::now() + self.renew_every();
        // Operators' dead-letter retries are looked for on claiming and every third of a lease.
        let mut retries_at = Instant::now();
        // Handles taken once, not a registry lookup (and a name clone) per unit.
        let name = self.config.name.clone();
        let handled = metrics::counter!(m::SUBSCRIPTION_EVENTS, "subscription" => name.clone());
        let lag = metrics::gauge!(m::SUBSCRIPTION_LAG, "subscription" => name);
        loop {
            if Instant::now() >= retries_at {
                retries_at = Instant::now() + self.renew_every();
                match super::dead_letters::redeliver(
                    &self.pool,
                    &self.config,
                    self.owner,
                    &*self.subscriber,
                )
                .await
                {
                    Ok(true) => {}
                    Ok(false) => return Flow::Reclaim,
                    Err(error) => {
                        tracing::warn!(%error, subscription = %self.config.name, "retrying dead letters failed");
                    }
                }
            }
            if !source.has_buffered() {
                tokio::select! {
                    biased;
                    _ = self.stop.stopped() => return Flow::Stop,
                    filled = source.fill() => match filled {
                        None => return Flow::Stop,
                        Some(Ok(())) => {}
                        Some(Err(error @ crate::Error::BelowRetentionFloor { .. })) => {
                            // Nothing will ever make these events readable again: halt, visibly.
                            let message = error.to_string();
                            tracing::error!(subscription = %self.config.name, %message, "subscription halted");
                            let _ = sqlx::query(sql::HALT)
                                .bind(&self.config.name)
                                .bind(self.owner)
                                .bind(0)
                                .bind(&message)
                                .bind(to_i64(position))
                                .execute(&self.pool)
                                .await;
                            return Flow::Reclaim;
                        }
                        Some(Err(error)) => {
                            tracing::warn!(%error, subscription = %self.config.name, "reading the lane failed");
                            return self.pause(ERROR_BACKOFF).await;
                        }
                    },
                    _ = tokio::time::sleep_until(renew_at) => {
                        match self.renew().await {
                            Ok(Some(row)) if row.status == "active" && row.position == position => {
                                renew_at = Instant::now() + self.renew_every();
                                continue;
                            }
                            // Lost, paused, halted or reset by an operator.
                            Ok(_) => return Flow::Reclaim,
                            Err(error) => {
                                tracing::warn!(%error, subscription = %self.config.name, "renewing the lease failed");
                                return self.pause(ERROR_BACKOFF).await;
                            }
                        }
                    }
                }
            }
            let Some(unit) = self.take_unit(&mut source).await else {
                return Flow::Stop;
            };
            match self
                .handle_unit(&unit, position, std::mem::take(&mut failed))
                .await
            {
                Outcome::Committed(next) => {
                    handled.increment(unit.iter().filter(|item| !item.skipped).count() as u64);
                    let head = match self.config.ordering {
                        super::config::Ordering::Insert => self.lane.frontier(),
                        super::config::Ordering::Commit => self.commit.head(),
                    };
                    lag.set(head.saturating_sub(next) as f64);
                    position = next;
                    renew_at = Instant::now() + self.renew_every();
                    self.status.send_modify(|status| {
                        status.position = Position::new(self.config.ordering, next);
                        status.attempts = 0;
                        status.last_error = None;
                        status.state = SubscriptionState::Running;
                    });
                }
                Outcome::Flow(flow) => return flow,
            }
        }
    }

    /// The next unit per the batch mode: one event, up to N ready events, or a whole group.
    async fn take_unit(&self, source: &mut Source<P>) -> Option<Vec<Item<P>>> {
        let mut unit = Vec::new();
        match self.config.batch {
            // Skipped events ride along with the next handled one (one checkpoint covers
            // them), or form a unit of their own when nothing handled is ready.
            Batch::PerEvent | Batch::UpTo(_) => {
                let limit = match self.config.batch {
                    Batch::UpTo(limit) => limit,
                    _ => 1,
                };
                let mut handled = 0;
                while handled < limit {
                    match source.pop() {
                        Some(item) => {
                            handled += usize::from(!item.skipped);
                            unit.push(item);
                        }
                        None => break,
                    }
                }
            }
            Batch::Groups => loop {
                if !source.has_buffered() {
                    // The rest of a group is already in the log: groups are appended whole.
                    match source.fill().await? {
                        Ok(()) => {}
                        Err(error) => {
                            tracing::warn!(%error, "reading the rest of a group failed");
                            return None;
                        }
                    }
                }
                let Some(item) = source.pop() else { continue };
                let boundary = item.boundary;
                unit.push(item);
                if boundary {
                    break;
                }
            },
        }
        debug_assert!(!unit.is_empty() || source.peek().is_none());
        Some(unit)
    }

    /// Handles a unit with retries, after `failed` attempts already made; a failed batch of
    /// several events is retried one by one.
    async fn handle_unit(&mut self, unit: &[Item<P>], position: u64, failed: u32) -> Outcome {
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
            tracing::warn!(
                subscription = %self.config.name, attempt, error = %failure.message,
                "handler failed"
            );
            let exhausted = !failure.retryable || attempt >= self.config.retry.max_attempts;
            if exhausted {
                return self
                    .exhaust(unit, position, attempt, &failure.message)
                    .await;
            }
            metrics::counter!(m::SUBSCRIPTION_RETRIES, "subscription" => self.config.name.clone())
                .increment(1);
            if let Some(flow) = self.record_failure(attempt, &failure.message).await {
                return Outcome::Flow(flow);
            }
            let wait = self.config.retry.backoff(attempt);
            if let Flow::Stop = self.pause(wait).await {
                return Outcome::Flow(Flow::Stop);
            }
        }
    }

    async fn one_by_one(&mut self, unit: &[Item<P>], mut position: u64) -> Outcome {
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
        position: u64,
        attempt: u32,
    ) -> Result<Outcome, Failure> {
        let mut events: Vec<Delivery<P>> = Vec::with_capacity(unit.len());
        for item in unit.iter().filter(|item| !item.skipped) {
            match &item.event {
                Ok(event) => events.push(
                    Delivery::new(Arc::clone(event))
                        .with_position(Position::new(self.config.ordering, item.position))
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
        let Some(next) = unit.last().map(|item| item.position) else {
            return Ok(Outcome::Committed(position));
        };
        let retryable = |error: sqlx::Error| Failure {
            message: error.to_string(),
            retryable: true,
        };
        let mut tx = self
            .pool
            .begin_with(sql::begin_bounded(self.config.lease))
            .await
            .map_err(retryable)?;
        let handled = AssertUnwindSafe(async {
            if let (Batch::Groups, Some(first)) = (self.config.batch, events.first()) {
                let span = self.handler_span(first, "ordo.handle_group");
                self.subscriber
                    .handle_group(&mut tx, &events)
                    .instrument(span)
                    .await
            } else {
                for event in &events {
                    let span = self.handler_span(event, "ordo.handle");
                    self.subscriber
                        .handle(&mut tx, event)
                        .instrument(span)
                        .await?;
                }
                Ok(())
            }
        })
        .catch_unwind()
        .await;
        match handled {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                return Err(Failure {
                    message: error.to_string(),
                    retryable: true,
                });
            }
            Err(_) => {
                return Err(Failure {
                    message: "the handler panicked".to_owned(),
                    retryable: true,
                });
            }
        }
        let fenced = self
            .checkpoint(&mut tx, position, next)
            .await
            .map_err(retryable)?;
        if !fenced {
            // Lost the lease, or an operator moved the subscription: the handler's writes go.
            let _ = tx.rollback().await;
            return Ok(Outcome::Flow(Flow::Reclaim));
        }
        match tx.commit().await {
            Ok(()) => Ok(Outcome::Committed(next)),
            // The outcome is unknown (e.g. the connection dropped during COMMIT): the stored
            // position says what happened.
            Err(_) => Ok(Outcome::Flow(Flow::Reclaim)),
        }
    }

    /// The span a handler call runs in; its parent is the publisher's trace context, when the
    /// event carries one (see `ops::trace`).
    fn handler_span(&self, event: &Envelope<P>, name: &'static str) -> tracing::Span {
        let span = if name == "ordo.handle_group" {
            tracing::info_span!("ordo.handle_group", subscription = %self.config.name, sequence = event.sequence.get())
        } else {
            tracing::info_span!("ordo.handle", subscription = %self.config.name, sequence = event.sequence.get())
        };
        crate::ops::trace::adopt(&span, &event.headers);
        span
    }

    /// Moves the position from `from` to `to` in `tx`; false when the fence refuses.
    async fn checkpoint(
        &self,
        tx: &mut sqlx::PgConnection,
        from: u64,
        to: u64,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(sql::CHECKPOINT)
            .bind(&self.config.name)
            .bind(self.owner)
            .bind(to_i64(to))
            .bind(to_i64(from))
            .bind(self.lease_ms())
            .execute(&mut *tx)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn record_failure(&self, attempt: u32, message: &str) -> Option<Flow> {
        self.status.send_modify(|status| {
            status.attempts = attempt;
            status.last_error = Some(message.to_owned());
        });
        let recorded = sqlx::query(sql::FAILED)
            .bind(&self.config.name)
            .bind(self.owner)
            .bind(i32::try_from(attempt).unwrap_or(i32::MAX))
            .bind(message)
            .bind(self.lease_ms())
            .execute(&self.pool)
            .await;
        match recorded {
            Ok(done) if done.rows_affected() == 1 => None,
            Ok(_) => Some(Flow::Reclaim),
            Err(error) => {
                tracing::warn!(%error, "recording a failed attempt failed");
                None
            }
        }
    }

    async fn exhaust(
        &mut self,
        unit: &[Item<P>],
        position: u64,
        attempts: u32,
        message: &str,
    ) -> Outcome {
        match self.config.on_exhaustion {
            OnExhaustion::Halt => {
                let halted = sqlx::query(sql::HALT)
                    .bind(&self.config.name)
                    .bind(self.owner)
                    .bind(i32::try_from(attempts).unwrap_or(i32::MAX))
                    .bind(message)
                    .bind(to_i64(position))
                    .execute(&self.pool)
                    .await;
                if let Err(error) = halted {
                    tracing::warn!(%error, "halting the subscription failed");
                }
                tracing::error!(subscription = %self.config.name, position, %message, "subscription halted");
                metrics::counter!(m::SUBSCRIPTION_HALTS, "subscription" => self.config.name.clone())
                    .increment(1);
                Outcome::Flow(Flow::Reclaim)
            }
            OnExhaustion::DeadLetter => {
                match self.dead_letter(unit, position, attempts, message).await {
                    Ok(outcome) => outcome,
                    Err(error) => {
                        tracing::warn!(%error, "dead-lettering failed; will try again");
                        Outcome::Flow(self.pause(ERROR_BACKOFF).await)
                    }
                }
            }
        }
    }

    async fn dead_letter(
        &self,
        unit: &[Item<P>],
        position: u64,
        attempts: u32,
        message: &str,
    ) -> Result<Outcome, sqlx::Error> {
        let Some(next) = unit.last().map(|item| item.position) else {
            return Ok(Outcome::Committed(position));
        };
        let mut tx = self
            .pool
            .begin_with(sql::begin_bounded(self.config.lease))
            .await?;
        for item in unit.iter().filter(|item| !item.skipped) {
            sqlx::query(sql::DEAD_LETTER)
                .bind(&self.config.name)
                .bind(self.config.ordering.as_str())
                .bind(to_i64(item.position))
                .bind(to_i64(item.sequence))
                .bind(message)
                .bind(i32::try_from(attempts).unwrap_or(i32::MAX))
                .execute(&mut *tx)
                .await?;
        }
        if !self.checkpoint(&mut tx, position, next).await? {
            tx.rollback().await?;
            return Ok(Outcome::Flow(Flow::Reclaim));
        }
        match tx.commit().await {
            Ok(()) => {
                tracing::warn!(subscription = %self.config.name, position = next, "dead-lettered");
                let dead = unit.iter().filter(|item| !item.skipped).count();
                metrics::counter!(m::DEAD_LETTERS, "subscription" => self.config.name.clone())
                    .increment(dead as u64);
                Ok(Outcome::Committed(next))
            }
            Err(_) => Ok(Outcome::Flow(Flow::Reclaim)),
        }
    }
}
