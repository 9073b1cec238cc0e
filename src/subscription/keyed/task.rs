//! One keyed handler task: an event's handler and its completion in one transaction.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use serde::de::DeserializeOwned;
use sqlx::PgPool;
use tracing::Instrument;
use uuid::Uuid;

use crate::consumer::progress;
use crate::consumer::source::Item;
use crate::position::Position;
use crate::subscription::attempt::handler_span;
use crate::subscription::delivery::Delivery;
use crate::subscription::runner::Runner;
use crate::subscription::sql;
use crate::subscription::subscriber::Subscriber;

/// What the tasks share with the runner.
pub(super) struct Context<S> {
    pool: PgPool,
    subscriber: Arc<S>,
    name: String,
    owner: Uuid,
    lease: Duration,
}

/// One try at one event.
pub(super) struct Attempt<P> {
    delivery: Delivery<P>,
    position: Position,
    /// Taken back from a stuck key's backlog: its copy leaves the backlog on success.
    aside: bool,
}

/// How a task ended.
pub(super) enum Outcome {
    /// Handled, and its completion committed with the handler's writes.
    Committed,
    /// The fence refused the completion (lease lost, paused, moved): rolled back.
    Fenced,
    /// The COMMIT's outcome is unknown (e.g. the connection dropped): the stored progress says.
    Unknown,
    /// The handler (or its transaction) failed: rolled back.
    Failed { message: String, retryable: bool },
}

impl<P> Attempt<P> {
    /// Attempt number `attempt` at `item`; the error to record if its payload does not decode.
    pub(super) fn new(item: &Item<P>, attempt: u32) -> Result<Self, String> {
        match &item.event {
            Ok(event) => Ok(Self {
                delivery: Delivery::new(Arc::clone(event))
                    .with_position(item.position)
                    .with_ends_group(item.boundary)
                    .with_attempt(attempt),
                position: item.position,
                aside: item.aside,
            }),
            Err(row) => Err(format!(
                "the payload of ordo.events sequence {} does not decode: {}",
                item.sequence, row.error
            )),
        }
    }
}

impl<S> Context<S> {
    pub(super) fn new<P>(runner: &Runner<P, S>) -> Self
    where
        P: DeserializeOwned + Send + Sync + 'static,
        S: Subscriber<P>,
    {
        Self {
            pool: runner.core.pool.clone(),
            subscriber: Arc::clone(&runner.subscriber),
            name: runner.config.name.clone(),
            owner: runner.core.owner,
            lease: runner.config.lease,
        }
    }

    /// The handler and the completion, in one transaction bounded by the lease.
    pub(super) async fn run<P>(&self, attempt: Attempt<P>) -> Outcome
    where
        P: DeserializeOwned + Send + Sync + 'static,
        S: Subscriber<P>,
    {
        let failed = |error: &(dyn std::error::Error + 'static)| Outcome::Failed {
            message: crate::error::failure_text(error),
            retryable: true,
        };
        let mut tx = match self.pool.begin_with(sql::begin_bounded(self.lease)).await {
            Ok(tx) => tx,
            Err(error) => return failed(&error),
        };
        let span = handler_span(&self.name, &attempt.delivery, "ordo.handle");
        let handled = AssertUnwindSafe(self.subscriber.handle(&mut tx, &attempt.delivery))
            .catch_unwind()
            .instrument(span)
            .await;
        // Every failure ends its transaction before it is reported: the runner may start the
        // retry at once, on another connection (see `sql::roll_back`).
        let failure = match handled {
            Ok(Ok(())) => None,
            Ok(Err(error)) => Some(failed(&*error)),
            Err(_) => Some(Outcome::Failed {
                message: "the handler panicked".to_owned(),
                retryable: true,
            }),
        };
        if let Some(failure) = failure {
            sql::roll_back(tx).await;
            return failure;
        }
        let completed = if attempt.aside {
            let at = [i64::try_from(attempt.position.get()).unwrap_or(i64::MAX)];
            crate::consumer::backlog::taken(&mut tx, &self.name, self.owner, &at).await
        } else {
            progress::complete(&mut tx, &self.name, self.owner, attempt.position).await
        };
        let outcome = match completed {
            Ok(true) => None,
            Ok(false) => Some(Outcome::Fenced),
            Err(error) => Some(failed(&error)),
        };
        if let Some(outcome) = outcome {
            sql::roll_back(tx).await;
            return outcome;
        }
        match tx.commit().await {
            Ok(()) => Outcome::Committed,
            Err(_) => Outcome::Unknown,
        }
    }
}
