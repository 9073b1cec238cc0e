//! The one supervised way ordo spawns background work: every task has a name, a tracing span,
//! panic capture, and an owner ([`Tasks`]) that stops it in order.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Mutex;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;

/// A signal every background task of one outbox watches; set once, never cleared.
#[derive(Clone, Debug)]
pub(crate) struct StopSignal(watch::Receiver<bool>);

impl StopSignal {
    pub(crate) fn new(receiver: watch::Receiver<bool>) -> Self {
        Self(receiver)
    }

    /// Resolves once a stop is requested. Cancel safe.
    pub(crate) async fn stopped(&mut self) {
        // An error means the owner is gone, which is a stop as well.
        let _ = self.0.wait_for(|stop| *stop).await;
    }

    pub(crate) fn is_stopped(&self) -> bool {
        *self.0.borrow()
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
        StopSignal(self.stop.subscribe())
    }

    /// Spawns `work` under the span `ordo.<name>`; a panic is logged with the task's name
    /// instead of vanishing with the task.
    pub(crate) fn spawn<F>(&self, name: &'static str, work: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let span = tracing::info_span!("ordo", task = name);
        let supervised = async move {
            if let Err(panic) = AssertUnwindSafe(work).catch_unwind().await {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic".to_owned());
                tracing::error!(task = name, %message, "ordo background task panicked");
            }
        }
        .instrument(span);
        let handle = tokio::spawn(supervised);
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
