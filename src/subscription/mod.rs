//! Durable subscriptions ("jobs"): a named consumer whose handler's database writes and whose
//! position commit together, run by one process at a time under a lease, resuming where it
//! stopped.

pub(crate) mod admin;
mod attempt;
pub(crate) mod config;
pub(crate) mod dead_letters;
mod delivery;
pub(crate) mod keyed;
pub(crate) mod runner;
pub(crate) mod sql;
pub(crate) mod subscriber;
pub(crate) mod wait;

use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::error::{Error, Result};
pub use crate::position::Position;
pub use admin::{delete_subscription, pause_subscription, reset_subscription, resume_subscription};
pub use config::{Batch, JobConfig, MAX_CONCURRENCY, OnExhaustion, Ordering, RetryPolicy};
pub use dead_letters::{
    DeadLetter, list_dead_letters, purge_dead_letters, retry_dead_letter, retry_dead_letters,
};
pub use delivery::Delivery;
pub use subscriber::Subscriber;

use crate::consumer::{Kind, Registration, Runners, Shared, SubscriptionHandle};
use runner::Runner;

/// Creates the subscription's row if it is new, refuses a lane mismatch, and spawns its runner
/// in the care of `runners` (the outbox's, which stops it on shutdown).
pub(crate) async fn spawn<P, S>(
    shared: Shared<P>,
    runners: &Runners,
    config: JobConfig,
    subscriber: S,
) -> Result<SubscriptionHandle>
where
    P: DeserializeOwned + Send + Sync + 'static,
    S: Subscriber<P>,
{
    config.validate()?;
    let pool = shared.pool.clone();
    // A subscription not created yet has no progress.
    if config.keyed.is_none()
        && crate::consumer::progress::has_progress(&pool, &config.name).await?
    {
        return Error::invalid_config(
            "keyed",
            "this subscription ran keyed and has events finished above its position, or stuck keys' events in a backlog: a serial runner would handle the first again and never the second; run it keyed (JobConfig::keyed) until an operator resets it",
        );
    }
    let registration = Registration {
        name: config.name.clone(),
        ordering: config.ordering,
        start: config.start,
        lease: config.lease,
        kind: Kind::Subscription,
    };
    let current = Arc::clone(&shared.lanes);
    let lanes = current.get();
    crate::consumer::start(shared, runners, &registration, move |core| {
        crate::consumer::run(Runner {
            core,
            current,
            lane: lanes.lane,
            commit: lanes.commit,
            lanes_stop: lanes.stop,
            config,
            subscriber: Arc::new(subscriber),
        })
    })
    .await
}
