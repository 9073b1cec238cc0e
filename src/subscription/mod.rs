//! Durable subscriptions ("jobs"): a named consumer whose handler's database writes and whose
//! position commit together, run by one process at a time under a lease, resuming where it
//! stopped.

pub(crate) mod admin;
pub(crate) mod config;
pub(crate) mod dead_letters;
mod delivery;
pub(crate) mod handle;
mod runner;
mod source;
pub(crate) mod sql;
pub(crate) mod subscriber;

use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;
use sqlx::PgPool;
use tokio::sync::watch;
use uuid::Uuid;

use crate::commit_lane::CommitShared;
use crate::error::{Error, Result};
use crate::insert_lane::LaneShared;
use crate::insert_lane::rows::to_i64;
use crate::task::StopSignal;
pub use admin::{
    SubscriptionRow, delete_subscription, list_subscriptions, pause_subscription,
    reset_subscription, resume_subscription,
};
pub use config::{Batch, JobConfig, OnExhaustion, Ordering, RetryPolicy, StartFrom};
pub use dead_letters::{
    DeadLetter, list_dead_letters, purge_dead_letters, retry_dead_letter, retry_dead_letters,
};
pub use delivery::Delivery;
pub use handle::{Position, SubscriptionHandle, SubscriptionState, SubscriptionStatus};
pub use subscriber::{HandlerError, Subscriber};

use handle::Heads;
use runner::Runner;

/// Creates the subscription's row if it is new, refuses a lane mismatch, and starts its runner.
pub(crate) async fn start<P, S>(
    pool: PgPool,
    lane: Arc<LaneShared<P>>,
    commit: Arc<CommitShared>,
    mut outbox_stop: StopSignal,
    config: JobConfig,
    subscriber: S,
) -> Result<SubscriptionHandle>
where
    P: DeserializeOwned + Send + Sync + 'static,
    S: Subscriber<P>,
{
    config.validate()?;
    let start_at = match (config.start, config.ordering) {
        (StartFrom::Beginning, _) => 0,
        (StartFrom::Now, Ordering::Insert) => lane.frontier(),
        (StartFrom::Now, Ordering::Commit) => commit.head(),
    };
    sqlx::query(sql::CREATE)
        .bind(&config.name)
        .bind(config.ordering.as_str())
        .bind(to_i64(start_at))
        .execute(&pool)
        .await?;
    let stored: String = sqlx::query_scalar(sql::LANE)
        .bind(&config.name)
        .fetch_one(&pool)
        .await?;
    match Ordering::parse(&stored) {
        Some(stored) if stored == config.ordering => {}
        // The table's CHECK admits only the two lanes: the stored one is the other.
        stored => {
            return Err(Error::LaneMismatch {
                subscription: config.name.clone(),
                stored: stored.unwrap_or(Ordering::Insert),
                requested: config.ordering,
            });
        }
    }

    let (stop, stop_rx) = watch::channel(false);
    // The outbox's shutdown stops its subscriptions too.
    let forward = stop.clone();
    let mut own_stop = StopSignal::new(stop_rx.clone());
    tokio::spawn(async move {
        tokio::select! {
            _ = outbox_stop.stopped() => { forward.send_replace(true); }
            _ = own_stop.stopped() => {}
        }
    });
    let initial = SubscriptionStatus {
        name: config.name.clone(),
        ordering: config.ordering,
        position: Position::new(config.ordering, start_at),
        state: SubscriptionState::Starting,
        attempts: 0,
        last_error: None,
        lag: 0,
    };
    let (status, status_rx) = watch::channel(initial);
    let heads = Heads {
        insert: lane.frontier.subscribe(),
        commit: Arc::clone(&commit),
    };
    let span = tracing::info_span!("ordo", task = "subscription", subscription = %config.name);
    let runner = Runner {
        pool,
        lane,
        commit,
        config,
        subscriber: Arc::new(subscriber),
        owner: Uuid::new_v4(),
        stop: StopSignal::new(stop_rx),
        status,
    };
    let task = tokio::spawn(tracing::Instrument::instrument(runner.run(), span));
    Ok(SubscriptionHandle {
        stop,
        task: Mutex::new(Some(task)),
        status: status_rx,
        heads,
        detached: false,
    })
}
