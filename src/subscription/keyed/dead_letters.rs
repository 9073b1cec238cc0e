//! A keyed subscription's side of operators' dead-letter retries (`ordo dead-letters retry`):
//! looked for on claiming and then every third of the lease, as the serial runner does, and
//! made by one task beside the handler tasks, so that a slow retried handler holds no key and
//! no watermark.
//!
//! Each retry is the serial runner's (`subscription/dead_letters.rs`): the handler and the
//! dead letter's deletion in one transaction fenced by the lease, so a crash, a lost lease or
//! an abandoned claim (the task is dropped with the claim's work) leaves the dead letter and
//! its request for the next runner, and a retry that committed is never made again.
//!
//! **Order.** A keyed subscription dead-letters an event and goes on with its keys' later
//! events; a retry runs it again after them, beside whatever of its keys runs now, outside the
//! keys' lanes. A handler that must not apply an older event over a newer one checks that
//! itself (a version column, say).

use std::sync::Arc;

use serde::de::DeserializeOwned;
use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;
use tracing::Instrument;

use crate::consumer::Flow;
use crate::subscription::dead_letters::redeliver;
use crate::subscription::runner::Runner;
use crate::subscription::subscriber::Subscriber;

/// When to look for requested retries next, and the look being made.
pub(super) struct Redelivery {
    at: Instant,
    /// One look at a time: at most one task, whose result is whether the lease held.
    running: JoinSet<Result<bool, sqlx::Error>>,
}

impl Redelivery {
    /// Looks at once: a request made while no runner ran is taken on claiming.
    pub(super) fn new() -> Self {
        Self {
            at: Instant::now(),
            running: JoinSet::new(),
        }
    }

    /// When the runner should wake for the next look; `None` while one is being made.
    pub(super) fn wake(&self) -> Option<Instant> {
        self.running.is_empty().then_some(self.at)
    }

    /// Whether a look is being made.
    pub(super) fn is_running(&self) -> bool {
        !self.running.is_empty()
    }

    /// The running look's end; pending for ever when none runs (a `select!` branch guards it).
    pub(super) async fn finished(
        &mut self,
    ) -> Option<Result<Result<bool, sqlx::Error>, JoinError>> {
        self.running.join_next().await
    }
}

impl<P, S> Runner<P, S>
where
    P: DeserializeOwned + Send + Sync + 'static,
    S: Subscriber<P>,
{
    /// Starts a look for requested retries if one is due and none runs.
    pub(super) fn start_redelivery(&self, redelivery: &mut Redelivery) {
        let now = Instant::now();
        if redelivery.is_running() || now < redelivery.at {
            return;
        }
        redelivery.at = now + self.core.renew_every();
        let pool = self.core.pool.clone();
        let config = self.config.clone();
        let owner = self.core.owner;
        let subscriber = Arc::clone(&self.subscriber);
        let span =
            tracing::info_span!("ordo.dead_letter_retries", subscription = %self.config.name);
        redelivery.running.spawn(
            async move { redeliver::<P, S>(&pool, &config, owner, &*subscriber).await }
                .instrument(span),
        );
    }

    /// What an ended look means for the claim: a flow when the lease was lost.
    pub(super) fn redelivered(
        &self,
        ended: Result<Result<bool, sqlx::Error>, JoinError>,
    ) -> Option<Flow> {
        match ended {
            Ok(Ok(true)) => None,
            Ok(Ok(false)) => Some(Flow::Reclaim),
            // The requests stay; the next look tries them again.
            Ok(Err(error)) => {
                tracing::warn!(%error, subscription = %self.config.name, "retrying dead letters failed");
                None
            }
            Err(error) => {
                tracing::error!(%error, subscription = %self.config.name, "the dead-letter retry task failed");
                None
            }
        }
    }
}
