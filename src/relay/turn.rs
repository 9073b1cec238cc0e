//! A relay as the keyed driver's executor (`consumer/driver.rs`): what it admits, the batches
//! it starts, and what a landed batch or a written mark does.

use futures::StreamExt;
use tokio::task::JoinError;
use tokio::time::Instant;

use super::Sink;
use super::batch::Written;
use super::flight::{Landed, fly};
use super::runner::{RelayRunner, Work};
use crate::consumer::Flow;
use crate::consumer::driver::KeyedWork;
use crate::consumer::source::Item;
use crate::position::Ordering;
use crate::relay::RawPayload;
use crate::task::StopSignal;

/// One claim's turn of a relay: the runner and its keyed work.
pub(super) struct Turn<'a, K> {
    runner: &'a mut RelayRunner<K>,
    work: &'a mut Work,
}

impl<'a, K> Turn<'a, K> {
    pub(super) fn new(runner: &'a mut RelayRunner<K>, work: &'a mut Work) -> Self {
        Self { runner, work }
    }
}

/// A relay's own completions: a batch back from its flight, a write of marks done.
pub(super) enum Done<K> {
    Flight(Result<Landed<K>, JoinError>),
    Write(Result<Written, JoinError>),
}

impl<K: Sink> KeyedWork for Turn<'_, K> {
    type Payload = RawPayload;
    type Done = Done<K>;

    fn core(&self) -> &crate::consumer::Consumer {
        &self.runner.core
    }

    fn stop_signal(&self) -> StopSignal {
        self.runner.core.stop.clone()
    }

    fn window_open(&self) -> bool {
        self.runner.window_open(self.work)
    }

    fn admit(&mut self, item: Item<RawPayload>) {
        self.runner.admit(self.work, item);
    }

    async fn read_failed(&mut self, error: crate::Error) -> Flow {
        self.runner.read_failed(&error, self.work).await
    }

    /// On the commit lane, the server history of every position admitted is known before a
    /// batch holding one is built (`Message::history`).
    async fn before_start(&mut self) -> Option<Flow> {
        let (runner, work) = (&mut *self.runner, &mut *self.work);
        if runner.config.ordering != Ordering::Commit {
            return None;
        }
        match work.histories.cover(&runner.core.pool, work.admitted).await {
            Ok(()) => None,
            Err(error) => Some(runner.read_failed(&error.into(), work).await),
        }
    }

    fn needs_tending(&self) -> bool {
        self.work.schedule.needs_tending()
    }

    async fn tend(&mut self) -> Option<Flow> {
        self.runner.tend(self.work).await
    }

    /// A batch per idle sink while events are ready, each started only if it ends while this
    /// owner certainly holds the lease.
    async fn start_ready(&mut self) -> Option<Flow> {
        let (runner, work) = (&mut *self.runner, &mut *self.work);
        while !runner.idle.is_empty() && (work.held.is_some() || work.schedule.lanes.has_ready()) {
            let starts = match runner.may_fly(work).await {
                Ok(Some(starts)) => starts,
                Ok(None) => break,
                Err(flow) => return Some(flow),
            };
            let Some((slots, messages)) = runner.take_batch(work) else {
                break;
            };
            let Some(carrier) = runner.idle.pop() else {
                break;
            };
            let deadline = runner.config.batch_deadline;
            runner
                .flights
                .spawn(fly(carrier, slots, messages, deadline, starts + deadline));
        }
        None
    }

    fn publish_status(&mut self) {
        self.runner.publish_status(self.work);
    }

    fn wake(&self) -> Instant {
        self.work
            .schedule
            .wake(self.runner.core.tenure.wake(Instant::now()))
    }

    async fn next_done(&mut self) -> Done<K> {
        let runner = &mut *self.runner;
        tokio::select! {
            biased;
            Some(joined) = runner.flights.join_next(), if !runner.flights.is_empty() => {
                Done::Flight(joined)
            }
            Some(joined) = runner.writes.next(), if !runner.writes.is_empty() => Done::Write(joined),
            () = std::future::pending() => unreachable!("pending never ends"),
        }
    }

    async fn on_done(&mut self, done: Done<K>) -> Option<Flow> {
        match done {
            // A flight always brings its carrier back; a join error is an abort.
            Done::Flight(Ok(landed)) => {
                self.runner.landed(self.work, landed);
                None
            }
            Done::Flight(Err(_)) => Some(Flow::Reclaim),
            Done::Write(joined) => self.runner.written(self.work, joined),
        }
    }

    async fn on_timers(&mut self) -> Option<Flow> {
        self.runner.on_timers(self.work).await
    }
}
