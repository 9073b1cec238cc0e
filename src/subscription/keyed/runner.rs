//! The keyed runner: reads the lane from the low watermark, hands events whose lanes are free
//! to handler tasks (at most the configured concurrency), and records what happened.
//!
//! Each handler task runs one event in its own transaction, which also writes the event's
//! completion (`progress::COMPLETE`). The runner keeps the core's schedule; it moves the
//! stored watermark past finished events every `FLUSH_EVERY` (one statement that also prunes
//! their completion rows and extends the lease), never per event. Failures are recorded per
//! event on the runner's own connection (attempts survive a restart); exhaustion stalls the
//! event's keys (`Halt`) or dead-letters it (`DeadLetter`).
//!
//! On a lost lease, a pause, an operator's reset or a commit whose outcome is unknown, the
//! runner drops its tasks (their transactions roll back) and claims again: the stored
//! watermark and completions are the truth, so nothing finished runs twice and nothing
//! unfinished is skipped. Operators' retries of dead letters run beside the handler tasks
//! (`dead_letters.rs`).

use std::sync::Arc;

use serde::de::DeserializeOwned;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::dead_letters::Redelivery;
use super::task::{Attempt, Context, Outcome};
use super::turn::Turn;
use crate::consumer::driver::drive;
use crate::consumer::lanes::{Lanes, Slot};
use crate::consumer::source::{Item, ReadAhead, Source};
use crate::consumer::sql::Stored;
use crate::consumer::{ERROR_BACKOFF, Flow, ReadFailed, Schedule, progress};
use crate::envelope::Envelope;
use crate::position::Position;
use crate::subscription::config::{Keyed, OnExhaustion};
use crate::subscription::runner::Runner;
use crate::subscription::sql;
use crate::subscription::subscriber::Subscriber;

/// One claim's worth of keyed work: the core's schedule, the handler tasks running, and the
/// dead-letter retries (dropped with the claim, as the tasks are).
pub(super) struct Work<P> {
    pub(super) schedule: Schedule<P>,
    pub(super) tasks: JoinSet<(Slot, Outcome)>,
    pub(super) redelivery: Redelivery,
}

impl<P, S> Runner<P, S>
where
    P: DeserializeOwned + Send + Sync + 'static,
    S: Subscriber<P>,
{
    /// Runs a keyed subscription from the claimed `row` until the lease is lost, the row
    /// changes, or a stop.
    pub(in crate::subscription) async fn process_keyed(
        &mut self,
        row: &Stored,
        keyed: Keyed,
    ) -> Flow {
        let (known, backlogs) = match self.core.progress_above(row.position).await {
            Ok(loaded) => loaded,
            Err(flow) => return flow,
        };
        let source = Source::new(
            &self.lane,
            &self.commit,
            self.core.stop.clone().or(&self.lanes_stop),
            row.position,
            self.config.types.clone(),
        );
        // Up to a page read ahead, beside the runner (see `ReadAhead`).
        let mut source = ReadAhead::spawn(source, self.lane.page_size);
        let lanes = Lanes::new(row.position.get());
        let mut work = Work {
            schedule: Schedule::new(
                lanes,
                known,
                row.position,
                self.core.renew_every(),
                backlogs,
            ),
            tasks: JoinSet::new(),
            redelivery: Redelivery::new(),
        };
        let context = Arc::new(Context::new(self));
        let mut turn = Turn::new(self, &mut work, &context, keyed);
        let flow = drive(&mut turn, &mut source).await;
        if matches!(flow, Flow::Stop) {
            // Shutdown waits for the handlers in hand (bounded by the outbox's shutdown), then
            // stores how far they got.
            while let Some(joined) = work.tasks.join_next().await {
                if let Ok((slot, Outcome::Committed)) = joined {
                    work.schedule.lanes.complete(slot);
                }
            }
            // A retry in hand ends too; the requests it has not reached wait for a runner.
            while let Some(ended) = work.redelivery.finished().await {
                let _ = self.redelivered(ended);
            }
            let _ = self.flush(&mut work).await;
        }
        flow
    }

    /// A failed read of the lane: events below the retention floor halt the subscription
    /// (see [`Consumer::read_failed`](crate::consumer::Consumer::read_failed)); anything else
    /// is retried.
    pub(super) async fn read_failed(&mut self, error: crate::Error, at: Position) -> Flow {
        match self.core.read_failed(&error, at).await {
            ReadFailed::Halted => Flow::Reclaim,
            ReadFailed::Retry => self.core.pause(ERROR_BACKOFF).await,
        }
    }

    /// Takes the next event of the lane into the schedule, with what the stored progress knows.
    pub(super) fn admit(&self, work: &mut Work<P>, item: Item<P>) {
        let subscriber = &self.subscriber;
        work.schedule.admit(
            item,
            |event: &Arc<Envelope<P>>| Some(subscriber.keys(event)),
            0,
        );
    }

    /// Starts every event that may run, up to `concurrency` at once. An event whose payload
    /// does not decode fails for good without a handler.
    pub(super) async fn start_ready(
        &mut self,
        work: &mut Work<P>,
        context: &Arc<Context<S>>,
        concurrency: usize,
    ) -> Option<Flow> {
        while work.tasks.len() < concurrency && work.schedule.lanes.has_ready() {
            let (slot, entry) = work.schedule.lanes.take_ready()?;
            let Some(item) = entry.item.as_ref() else {
                continue;
            };
            match Attempt::new(item, entry.attempts + 1) {
                Ok(attempt) => {
                    let context = Arc::clone(context);
                    work.tasks
                        .spawn(async move { (slot, context.run(attempt).await) });
                }
                Err(message) => {
                    let attempts = entry.attempts + 1;
                    let policy = self.config.on_undecodable;
                    let flow = self
                        .exhaust_keyed(policy, work, slot, attempts, message)
                        .await;
                    if flow.is_some() {
                        return flow;
                    }
                }
            }
        }
        None
    }

    /// What a handler task's outcome does to the schedule; a flow when processing must end.
    pub(super) async fn finished(
        &mut self,
        work: &mut Work<P>,
        slot: Slot,
        outcome: Outcome,
    ) -> Option<Flow> {
        match outcome {
            Outcome::Committed => {
                work.schedule.lanes.complete(slot);
                self.handled(work);
                None
            }
            Outcome::Fenced | Outcome::Unknown => Some(Flow::Reclaim),
            Outcome::Failed { message, retryable } => {
                let attempts = work
                    .schedule
                    .lanes
                    .entry(slot)
                    .map_or(1, |entry| entry.attempts + 1);
                tracing::warn!(subscription = %self.config.name, attempt = attempts, error = %message, "handler failed");
                if !retryable {
                    let policy = self.config.on_undecodable;
                    return self
                        .exhaust_keyed(policy, work, slot, attempts, message)
                        .await;
                }
                if attempts >= self.config.retry.max_attempts {
                    let policy = self.config.on_exhaustion;
                    return self
                        .exhaust_keyed(policy, work, slot, attempts, message)
                        .await;
                }
                metrics::counter!(crate::telemetry::metrics::SUBSCRIPTION_RETRIES, "subscription" => self.config.name.clone())
                    .increment(1);
                if let Some(flow) = self.record(work, slot, attempts, &message, false).await {
                    return Some(flow);
                }
                let at = Instant::now() + self.config.retry.backoff(attempts);
                work.schedule.lanes.back_off(slot, attempts, message, at);
                None
            }
        }
    }

    /// Applies the exhaustion policy to the event at `slot`.
    async fn exhaust_keyed(
        &mut self,
        policy: OnExhaustion,
        work: &mut Work<P>,
        slot: Slot,
        attempts: u32,
        message: String,
    ) -> Option<Flow> {
        match policy {
            OnExhaustion::Halt => {
                if let Some(flow) = self.record(work, slot, attempts, &message, true).await {
                    return Some(flow);
                }
                let position = work
                    .schedule
                    .lanes
                    .entry(slot)
                    .map_or(0, |entry| entry.position);
                tracing::error!(subscription = %self.config.name, position, error = %message, "event stalled: its keys wait for an operator's retry");
                metrics::counter!(crate::telemetry::metrics::SUBSCRIPTION_HALTS, "subscription" => self.config.name.clone())
                    .increment(1);
                work.schedule.stall(slot, attempts, message);
                None
            }
            OnExhaustion::DeadLetter => {
                match self.dead_letter_one(work, slot, attempts, &message).await {
                    Ok(true) => {
                        work.schedule.lanes.complete(slot);
                        metrics::counter!(crate::telemetry::metrics::DEAD_LETTERS, "subscription" => self.config.name.clone())
                        .increment(1);
                        None
                    }
                    Ok(false) => Some(Flow::Reclaim),
                    Err(error) => {
                        tracing::warn!(%error, "dead-lettering failed; will claim again");
                        Some(self.core.pause(ERROR_BACKOFF).await)
                    }
                }
            }
        }
    }

    /// Stores a failed attempt (`stalled`: the last one, under `Halt`); a flow if the lease is
    /// lost.
    async fn record(
        &mut self,
        work: &Work<P>,
        slot: Slot,
        attempts: u32,
        message: &str,
        stalled: bool,
    ) -> Option<Flow> {
        let entry = work.schedule.lanes.entry(slot)?;
        let position = entry.item.as_ref().map(|item| item.position)?;
        let failed = progress::Failed {
            at: position,
            stalled,
            attempts,
            keys: entry.keys.iter().map(str::to_owned).collect(),
            error: message,
            aside: entry.aside,
        };
        self.core.status.send_modify(|status| {
            status.attempts = attempts;
            status.last_error = Some(message.to_owned());
        });
        match progress::failed(&self.core.pool, &self.config.name, self.core.owner, failed).await {
            Ok(true) => None,
            Ok(false) => Some(Flow::Reclaim),
            Err(error) => {
                tracing::warn!(%error, "recording a failed attempt failed");
                Some(self.core.pause(ERROR_BACKOFF).await)
            }
        }
    }

    /// The event into `ordo.dead_letters` and marked done, in one transaction; false if the
    /// fence refused.
    async fn dead_letter_one(
        &self,
        work: &Work<P>,
        slot: Slot,
        attempts: u32,
        message: &str,
    ) -> Result<bool, sqlx::Error> {
        let Some(item) = work
            .schedule
            .lanes
            .entry(slot)
            .and_then(|entry| entry.item.as_ref())
        else {
            return Ok(true);
        };
        let aside = item.aside;
        let name = &self.config.name;
        let mut tx = self
            .core
            .pool
            .begin_with(sql::begin_bounded(self.config.lease))
            .await?;
        sql::dead_letter(
            &mut tx,
            name,
            item.position,
            item.sequence,
            message,
            attempts,
        )
        .await?;
        let done = if aside {
            let at = [i64::try_from(item.position.get()).unwrap_or(i64::MAX)];
            crate::consumer::backlog::taken(&mut tx, name, self.core.owner, &at).await?
        } else {
            progress::complete(&mut tx, name, self.core.owner, item.position).await?
        };
        if !done {
            tx.rollback().await?;
            return Ok(false);
        }
        tx.commit().await?;
        tracing::warn!(subscription = %name, position = item.position.get(), "dead-lettered");
        Ok(true)
    }
}
