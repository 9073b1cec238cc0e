//! The keyed driver: one loop for every keyed consumer (a keyed subscription's handler tasks, a
//! relay's batches in flight), so that reading the lane into the window, moving stuck keys
//! aside and taking them back, starting ready work, waiting for what finishes, and the timers
//! are written once.
//!
//! Each turn: stop if asked; admit what the reader has ready while the window has room; the
//! executor's check before it starts work (a relay covers the server histories of what it
//! admitted); the backlogs' work (`Schedule::tend`); start what may run; publish the status;
//! then wait for the first of a stop, one of the executor's own completions, the next read
//! (while the window has room), or the next timer. An executor says what each of those does
//! ([`KeyedWork`]); what is due when is the schedule's (`schedule.rs`).

use std::future::Future;

use tokio::time::Instant;

use super::Flow;
use super::source::{Item, ReadAhead};
use crate::task::StopSignal;

/// What a keyed executor does at each step of the driver's turn.
pub(crate) trait KeyedWork {
    type Payload: serde::de::DeserializeOwned + Send + Sync + 'static;
    /// One of the executor's own completions (a handler task joined, a batch landed, its marks
    /// written).
    type Done;

    /// The consumer's stop signal.
    fn stop_signal(&self) -> StopSignal;

    /// The consumer core (its name and kind label the metrics).
    fn core(&self) -> &super::Consumer;

    /// Whether the window may take another event.
    fn window_open(&self) -> bool;

    /// A read event into the schedule.
    fn admit(&mut self, item: Item<Self::Payload>);

    /// A failed read of the lane.
    fn read_failed(&mut self, error: crate::Error) -> impl Future<Output = Flow> + Send;

    /// Before ready work starts, after admitting (a relay: the histories of what it admitted).
    fn before_start(&mut self) -> impl Future<Output = Option<Flow>> + Send {
        async { None }
    }

    /// Whether the backlogs have work ([`Schedule::needs_tending`](super::Schedule::needs_tending)).
    fn needs_tending(&self) -> bool;

    /// The backlogs' work ([`Schedule::tend`](super::Schedule::tend)).
    fn tend(&mut self) -> impl Future<Output = Option<Flow>> + Send;

    /// Starts what may run now.
    fn start_ready(&mut self) -> impl Future<Output = Option<Flow>> + Send;

    /// Publishes the status to the handle.
    fn publish_status(&mut self);

    /// When the next timer is due.
    fn wake(&self) -> Instant;

    /// The next of the executor's own completions; pending for ever while none can come.
    /// Cancel safe: the driver drops it whenever another branch wins.
    fn next_done(&mut self) -> impl Future<Output = Self::Done> + Send;

    /// What a completion does; a flow when processing must end.
    fn on_done(&mut self, done: Self::Done) -> impl Future<Output = Option<Flow>> + Send;

    /// The timers are due.
    fn on_timers(&mut self) -> impl Future<Output = Option<Flow>> + Send;
}

/// Runs `work` over `source` until processing must end; the flow says what next.
pub(crate) async fn drive<W: KeyedWork + Send>(
    work: &mut W,
    source: &mut ReadAhead<W::Payload>,
) -> Flow {
    let mut stop = work.stop_signal();
    let full = metrics::gauge!(
        crate::telemetry::metrics::WINDOW_FULL,
        "subscription" => work.core().name.clone(),
        "kind" => work.core().kind.as_str()
    );
    let mut was_full = None;
    loop {
        if stop.is_stopped() {
            return Flow::Stop;
        }
        while work.window_open() {
            match source.try_next() {
                Some(Ok(item)) => work.admit(item),
                Some(Err(error)) => return work.read_failed(error).await,
                None => break,
            }
        }
        if let Some(flow) = work.before_start().await {
            return flow;
        }
        if work.needs_tending()
            && let Some(flow) = work.tend().await
        {
            return flow;
        }
        if let Some(flow) = work.start_ready().await {
            return flow;
        }
        work.publish_status();
        let wake = work.wake();
        let may_read = work.window_open();
        if was_full != Some(!may_read) {
            was_full = Some(!may_read);
            full.set(f64::from(u8::from(!may_read)));
        }
        enum Next<D, P> {
            Stop,
            Done(D),
            Read(Option<crate::Result<Item<P>>>),
            Timers,
        }
        let next = tokio::select! {
            biased;
            _ = stop.stopped() => Next::Stop,
            done = work.next_done() => Next::Done(done),
            read = source.next(), if may_read => Next::Read(read),
            _ = tokio::time::sleep_until(wake) => Next::Timers,
        };
        let flow = match next {
            Next::Stop => return Flow::Stop,
            Next::Done(done) => work.on_done(done).await,
            // The reader ends on a stop; ended otherwise (it panicked), claim again.
            Next::Read(None) if stop.is_stopped() => Some(Flow::Stop),
            Next::Read(None) => Some(Flow::Reclaim),
            Next::Read(Some(Ok(item))) => {
                work.admit(item);
                None
            }
            Next::Read(Some(Err(error))) => Some(work.read_failed(error).await),
            Next::Timers => work.on_timers().await,
        };
        if let Some(flow) = flow {
            return flow;
        }
    }
}
