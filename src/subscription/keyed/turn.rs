//! A keyed subscription as the keyed driver's executor (`consumer/driver.rs`): handler tasks
//! for the ready events, and what a finished task or an operator's dead-letter retry does.

use std::sync::Arc;

use serde::de::DeserializeOwned;
use tokio::task::JoinError;
use tokio::time::Instant;

use super::runner::Work;
use super::task::{Context, Outcome};
use crate::consumer::Flow;
use crate::consumer::driver::KeyedWork;
use crate::consumer::lanes::Slot;
use crate::consumer::source::Item;
use crate::subscription::config::Keyed;
use crate::subscription::runner::Runner;
use crate::subscription::subscriber::Subscriber;
use crate::task::StopSignal;

/// One claim's turn of a keyed subscription: the runner, its keyed work, what its handler
/// tasks share, and its settings.
pub(super) struct Turn<'a, P, S> {
    runner: &'a mut Runner<P, S>,
    work: &'a mut Work<P>,
    context: &'a Arc<Context<S>>,
    keyed: Keyed,
}

impl<'a, P, S> Turn<'a, P, S> {
    pub(super) fn new(
        runner: &'a mut Runner<P, S>,
        work: &'a mut Work<P>,
        context: &'a Arc<Context<S>>,
        keyed: Keyed,
    ) -> Self {
        Self {
            runner,
            work,
            context,
            keyed,
        }
    }
}

/// A keyed subscription's own completions: a handler task, an operator's dead-letter retry.
pub(super) enum Done {
    Task(Result<(Slot, Outcome), JoinError>),
    Redelivered(Result<Result<bool, sqlx::Error>, JoinError>),
}

impl<P, S> KeyedWork for Turn<'_, P, S>
where
    P: DeserializeOwned + Send + Sync + 'static,
    S: Subscriber<P>,
{
    type Payload = P;
    type Done = Done;

    fn core(&self) -> &crate::consumer::Consumer {
        &self.runner.core
    }

    fn stop_signal(&self) -> StopSignal {
        self.runner.core.stop.clone()
    }

    fn window_open(&self) -> bool {
        self.work.schedule.lanes.len() < self.keyed.window
    }

    fn admit(&mut self, item: Item<P>) {
        self.runner.admit(self.work, item);
    }

    async fn read_failed(&mut self, error: crate::Error) -> Flow {
        let at = self.work.schedule.stored;
        self.runner.read_failed(error, at).await
    }

    fn needs_tending(&self) -> bool {
        self.work.schedule.needs_tending()
    }

    async fn tend(&mut self) -> Option<Flow> {
        self.runner.tend(self.work).await
    }

    async fn start_ready(&mut self) -> Option<Flow> {
        let concurrency = self.keyed.concurrency;
        self.runner
            .start_ready(self.work, self.context, concurrency)
            .await
    }

    fn publish_status(&mut self) {
        self.runner.publish_status(self.work);
    }

    fn wake(&self) -> Instant {
        self.work.schedule.wake(self.work.redelivery.wake())
    }

    async fn next_done(&mut self) -> Done {
        let work = &mut *self.work;
        tokio::select! {
            biased;
            Some(joined) = work.tasks.join_next(), if !work.tasks.is_empty() => Done::Task(joined),
            Some(ended) = work.redelivery.finished(), if work.redelivery.is_running() => {
                Done::Redelivered(ended)
            }
            () = std::future::pending() => unreachable!("pending never ends"),
        }
    }

    async fn on_done(&mut self, done: Done) -> Option<Flow> {
        match done {
            Done::Task(Ok((slot, outcome))) => self.runner.finished(self.work, slot, outcome).await,
            Done::Task(Err(_)) => Some(Flow::Reclaim),
            Done::Redelivered(ended) => self.runner.redelivered(ended),
        }
    }

    async fn on_timers(&mut self) -> Option<Flow> {
        self.runner.on_timers(self.work).await
    }
}
