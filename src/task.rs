//! The one supervised way ordo spawns background work: every task has a name, a tracing span,
//! panic capture, and an owner that stops it: [`Tasks`] for an outbox's lanes, stopped together
//! in order, [`Supervised`] for a task stopped on its own as well (a subscription's runner),
//! and [`spawn_owned`] for a task whose spawner holds its handle (awaits it or aborts it).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Mutex;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{Instrument, Span};

/// A signal every background task of one outbox watches; set once, never cleared. A
/// subscription's reads watch two ([`or`](Self::or)): the runner's own and its lanes'.
#[derive(Clone, Debug)]
pub(crate) struct StopSignal {
    own: watch::Receiver<bool>,
    also: Option<watch::Receiver<bool>>,
}

impl StopSignal {
    fn of(stop: &watch::Sender<bool>) -> Self {
        Self {
            own: stop.subscribe(),
            also: None,
        }
    }

    /// Resolves once a stop is requested. Cancel safe.
    pub(crate) async fn stopped(&mut self) {
        // An error means the owner is gone, which is a stop as well.
        match &mut self.also {
            None => {
                let _ = self.own.wait_for(|stop| *stop).await;
            }
            Some(also) => {
                tokio::select! {
                    _ = self.own.wait_for(|stop| *stop) => {}
                    _ = also.wait_for(|stop| *stop) => {}
                }
            }
        }
    }

    pub(crate) fn is_stopped(&self) -> bool {
        *self.own.borrow() || self.also.as_ref().is_some_and(|also| *also.borrow())
    }

    /// A signal set when this one or `other` is: a runner's reads end when the runner is told
    /// to stop, and when the lanes they read stop under it (an outbox starting again after a
    /// rewind).
    pub(crate) fn or(self, other: &StopSignal) -> StopSignal {
        StopSignal {
            own: self.own,
            also: Some(other.own.clone()),
        }
    }
}

/// The owner of an outbox's background tasks.
#[derive(Debug)]
pub(crate) struct Tasks {
    stop: watch::Sender<bool>,
    handles: Mutex<Vec<(&'static str, JoinHandle<()>)>>,
}

impl Tasks {
    pub(crate) fn new() -> Self {
        Self {
            stop: watch::Sender::new(false),
            handles: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn signal(&self) -> StopSignal {
        StopSignal::of(&self.stop)
    }

    /// Spawns `work` under the span `ordo.<name>` (see [`supervise`]).
    pub(crate) fn spawn<F>(&self, name: &'static str, work: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let handle = supervise(name, tracing::info_span!("ordo", task = name), work);
        if let Ok(mut handles) = self.handles.lock() {
            handles.push((name, handle));
        }
    }

    /// Asks every task to stop, without waiting. Idempotent.
    pub(crate) fn request_stop(&self) {
        self.stop.send_replace(true);
    }

    /// Asks every task to stop and waits for each, in spawn order, up to `grace` each; a task
    /// still running after that is aborted and named in the log. Idempotent.
    pub(crate) async fn stop(&self, grace: Duration) {
        self.request_stop();
        let handles = match self.handles.lock() {
            Ok(mut handles) => std::mem::take(&mut *handles),
            Err(_) => return,
        };
        for (name, mut handle) in handles {
            if tokio::time::timeout(grace, &mut handle).await.is_err() {
                tracing::warn!(task = name, "ordo task did not stop in time; aborting it");
                handle.abort();
            }
        }
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        // Tasks watch the signal and finish the step in hand; nothing is aborted here.
        self.request_stop();
    }
}

/// Runs `work` in `span` on the runtime; a panic is logged with the task's name instead of
/// vanishing with the task. Every background task of ordo starts here.
fn supervise<F>(name: &'static str, span: Span, work: F) -> JoinHandle<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let supervised = async move {
        if let Err(panic) = AssertUnwindSafe(work).catch_unwind().await {
            let message = panic_message(&*panic);
            tracing::error!(task = name, %message, "ordo background task panicked");
        }
    }
    .instrument(span);
    tokio::spawn(supervised)
}

/// Spawns `work`, a short task that ends by itself and needs no stop (a write that must
/// finish whatever its spawner does next), supervised like every other (see [`supervise`]), in
/// the span of its spawner, under the task name `name`.
pub(crate) fn spawn_detached<F>(name: &'static str, work: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let span = tracing::info_span!(parent: &Span::current(), "ordo", task = name);
    drop(supervise(name, span, work));
}

/// Spawns `work`, a task its spawner owns through the handle returned (it awaits the output,
/// or aborts the task, and dropping the handle lets the task finish alone), in the span of its
/// spawner under the task name `name`. A panic is logged with that name like every other task's
/// (see [`supervise`]), then carried on to the handle, where `JoinError::is_panic` still shows it.
pub(crate) fn spawn_owned<F>(name: &'static str, work: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let span = tracing::info_span!(parent: &Span::current(), "ordo", task = name);
    let watched = async move {
        match AssertUnwindSafe(work).catch_unwind().await {
            Ok(output) => output,
            Err(panic) => {
                let message = panic_message(&*panic);
                tracing::error!(task = name, %message, "ordo background task panicked");
                std::panic::resume_unwind(panic)
            }
        }
    }
    .instrument(span);
    tokio::spawn(watched)
}

/// The text a panic was raised with (`panic!("...")`), for logs and errors.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic".to_owned())
}

/// One supervised task with a stop signal of its own: stopped alone (its handle's shutdown) or
/// with its outbox, whichever comes first.
#[derive(Debug)]
pub(crate) struct Supervised {
    name: &'static str,
    span: Span,
    stop: watch::Sender<bool>,
    handle: Mutex<Option<JoinHandle<()>>>,
}

impl Supervised {
    /// Spawns the future `work` makes from the task's stop signal, in `span` (see
    /// [`supervise`]).
    pub(crate) fn spawn<F>(
        name: &'static str,
        span: Span,
        work: impl FnOnce(StopSignal) -> F,
    ) -> Self
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let stop = watch::Sender::new(false);
        let handle = supervise(name, span.clone(), work(StopSignal::of(&stop)));
        Self {
            name,
            span,
            stop,
            handle: Mutex::new(Some(handle)),
        }
    }

    /// Asks the task to stop, without waiting. Idempotent.
    pub(crate) fn request_stop(&self) {
        self.stop.send_replace(true);
    }

    /// Whether the task has ended, or a [`stop`](Self::stop) has taken it over (and returns
    /// only once it has ended).
    pub(crate) fn is_finished(&self) -> bool {
        match self.handle.lock() {
            Ok(handle) => handle.as_ref().is_none_or(JoinHandle::is_finished),
            Err(_) => true,
        }
    }

    /// Asks the task to stop and waits for it up to `grace`; a task still running then is
    /// aborted (its future is dropped where it waits, so whatever it holds, a transaction
    /// included, is dropped and rolled back) and named in the log. Returns once the task has
    /// ended. Idempotent: a later call returns at once.
    pub(crate) async fn stop(&self, grace: Duration) {
        self.request_stop();
        let handle = self.handle.lock().ok().and_then(|mut handle| handle.take());
        let Some(mut handle) = handle else { return };
        if tokio::time::timeout(grace, &mut handle).await.is_err() {
            self.span.in_scope(|| {
                tracing::warn!(
                    task = self.name,
                    ?grace,
                    "ordo task did not stop in time; aborting it"
                );
            });
            handle.abort();
            // Resolves as soon as the abort has dropped the task's future.
            let _ = handle.await;
        }
    }
}
