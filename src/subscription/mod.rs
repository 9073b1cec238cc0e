//! Durable subscriptions ("jobs"): a named consumer whose handler's database writes and whose
//! position commit together, run by one process at a time under a lease, resuming where it
//! stopped.

pub(crate) mod admin;
mod attempt;
pub(crate) mod config;
pub(crate) mod dead_letters;
mod delivery;
pub(crate) mod handle;
pub(crate) mod keyed;
mod lease;
pub(crate) mod runner;
pub(crate) mod shutdown;
pub(crate) mod source;
pub(crate) mod sql;
pub(crate) mod status;
pub(crate) mod subscriber;
pub(crate) mod wait;

use std::sync::Arc;

use serde::de::DeserializeOwned;
use sqlx::PgPool;
use tokio::sync::watch;
use uuid::Uuid;

use crate::commit_lane::CommitShared;
use crate::error::{Error, Result};
use crate::insert_lane::LaneShared;
pub use crate::position::Position;
use crate::task::Supervised;
pub use admin::{delete_subscription, pause_subscription, reset_subscription, resume_subscription};
pub use config::{
    Batch, DEFAULT_KEYED_WINDOW, JobConfig, MAX_CONCURRENCY, MAX_LEASE, MIN_LEASE, OnExhaustion,
    Ordering, RetryPolicy, StartFrom,
};
pub use dead_letters::{
    DeadLetter, list_dead_letters, purge_dead_letters, retry_dead_letter, retry_dead_letters,
};
pub use delivery::Delivery;
pub use handle::SubscriptionHandle;
pub use keyed::{Keys, SERIAL_KEY, list_stalled_keys, retry_stalled_keys};
pub use status::{
    DeadLetterCount, RunStatus, SinkDown, StalledKey, SubscriptionState, SubscriptionStatus,
};
pub use subscriber::{HandlerError, Subscriber};

use handle::Heads;
use runner::Runner;
use shutdown::{MarkStopped, Runners, Running};

/// Creates the subscription's row if it is new, refuses a lane mismatch, and spawns its runner
/// in the care of `runners` (the outbox's, which stops it on shutdown).
pub(crate) async fn spawn<P, S>(
    pool: PgPool,
    lane: Arc<LaneShared<P>>,
    commit: Arc<CommitShared>,
    runners: &Runners,
    config: JobConfig,
    subscriber: S,
) -> Result<SubscriptionHandle>
where
    P: DeserializeOwned + Send + Sync + 'static,
    S: Subscriber<P>,
{
    config.validate()?;
    let shared = Shared {
        pool: pool.clone(),
        lane: Arc::clone(&lane),
        commit: Arc::clone(&commit),
    };
    // A subscription not created yet has no progress.
    if config.keyed.is_none() && keyed::progress::has_progress(&pool, &config.name).await? {
        return Error::invalid_config(
            "keyed",
            "this subscription ran keyed and has events finished above its position: a serial runner would handle them again; run it keyed (JobConfig::keyed) until an operator resets it",
        );
    }
    let job = config.clone();
    start(shared, runners, &job, "subscription", move |run| {
        let runner = Runner {
            pool: run.pool,
            lane,
            commit,
            config,
            subscriber: Arc::new(subscriber),
            owner: run.owner,
            stop: run.stop,
            status: run.status,
        };
        runner.run()
    })
    .await
}

/// What every runner reads from: the pool and both lanes.
pub(crate) struct Shared<P> {
    pub(crate) pool: PgPool,
    pub(crate) lane: Arc<LaneShared<P>>,
    pub(crate) commit: Arc<CommitShared>,
}

/// What a runner is started with.
pub(crate) struct Run {
    pub(crate) pool: PgPool,
    pub(crate) owner: Uuid,
    pub(crate) stop: crate::task::StopSignal,
    pub(crate) status: watch::Sender<SubscriptionStatus>,
}

/// Where a new subscription starts, per its configuration.
fn start_position<P>(shared: &Shared<P>, config: &JobConfig) -> Position {
    let start_at = match (config.start, config.ordering) {
        (StartFrom::Beginning, _) => 0,
        (StartFrom::Now, Ordering::Insert) => shared.lane.frontier(),
        (StartFrom::Now, Ordering::Commit) => shared.commit.head(),
    };
    Position::new(config.ordering, start_at)
}

/// Creates the row of `config` if it is new (refusing a lane mismatch) and spawns the runner
/// `make` builds, in the care of `runners`: the machinery subscriptions and relays share
/// (status, supervision, shutdown bounded by the lease).
pub(crate) async fn start<P, F, Fut>(
    shared: Shared<P>,
    runners: &Runners,
    config: &JobConfig,
    kind: &'static str,
    make: F,
) -> Result<SubscriptionHandle>
where
    P: DeserializeOwned + Send + Sync + 'static,
    F: FnOnce(Run) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let start_at = start_position(&shared, config);
    let role = ensure_row(&shared.pool, config, start_at, kind).await?;
    let initial = SubscriptionStatus {
        name: config.name.clone(),
        lane: config.ordering,
        position: start_at,
        lag: 0,
        state: SubscriptionState::Starting,
        status: RunStatus::Active,
        attempts: 0,
        last_error: None,
        lease_owner: None,
        lease_expires_at: None,
        oldest_unprocessed_seconds: None,
        stalled: Vec::new(),
        sink_down: None,
        dead_letters: None,
        kind: Some(kind.to_owned()),
        role,
    };
    let (status, status_rx) = watch::channel(initial);
    let heads = Heads {
        insert: shared.lane.frontier.subscribe(),
        commit: Arc::clone(&shared.commit),
    };
    let span = tracing::info_span!("ordo", task = kind, subscription = %config.name);
    let owner = Uuid::new_v4();
    let pool = shared.pool.clone();
    let task = Supervised::spawn(kind, span, |stop| {
        let stopped = MarkStopped(status.clone());
        let work = make(Run {
            pool: shared.pool,
            owner,
            stop,
            status,
        });
        async move {
            let _stopped = stopped;
            work.await;
        }
    });
    let running = Arc::new(Running {
        task,
        pool,
        name: config.name.clone(),
        owner,
        grace: config.lease,
        stopped: tokio::sync::Mutex::new(false),
    });
    runners.add(&running);
    Ok(SubscriptionHandle {
        running,
        status: status_rx,
        heads,
        detached: false,
    })
}

/// Creates the row at `start_at` if it is new, as a `kind` (`subscription` or `relay`) run by
/// the connected role; refuses a row of the other kind, of a role this one does not act as, or
/// of the other lane. Returns the role the row is run by (`None`: a row an older ordo wrote,
/// which its first claim adopts).
async fn ensure_row(
    pool: &PgPool,
    config: &JobConfig,
    start_at: Position,
    kind: &'static str,
) -> Result<Option<String>> {
    sql::create(pool, &config.name, start_at, kind).await?;
    let stored = sql::identity(pool, &config.name).await?;
    if let Some(stored_kind) = stored.kind.filter(|stored| stored != kind) {
        return Err(Error::KindMismatch {
            subscription: config.name.clone(),
            stored: stored_kind,
            requested: kind,
        });
    }
    if !stored.writable {
        return Err(Error::NotOwnRow {
            subscription: config.name.clone(),
            owner: stored.role.unwrap_or_default(),
            connected: stored.connected,
        });
    }
    match Ordering::parse(&stored.lane) {
        Some(lane) if lane == config.ordering => Ok(stored.role),
        // The table's CHECK admits only the two lanes: the stored one is the other.
        stored => Err(Error::LaneMismatch {
            subscription: config.name.clone(),
            stored: stored.unwrap_or(Ordering::Insert),
            requested: config.ordering,
        }),
    }
}
