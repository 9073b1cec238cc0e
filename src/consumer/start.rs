//! Starting a consumer: its row in `ordo.subscriptions` created or checked (kind, role, lane),
//! its status channel, and its runner supervised in the care of the outbox's [`Runners`]
//! (stopped, and its lease released, on shutdown).

use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::de::DeserializeOwned;
use sqlx::PgPool;
use tokio::sync::watch;
use uuid::Uuid;

use super::claim::Consumer;
use super::handle::{Heads, SubscriptionHandle};
use super::shutdown::{MarkStopped, Runners, Running};
use super::sql;
use super::status::SubscriptionStatus;
use super::tenure::Tenure;
use super::{Kind, StartFrom};
use crate::commit_lane::CommitShared;
use crate::error::{Error, Result};
use crate::insert_lane::LaneShared;
use crate::position::{Ordering, Position};
use crate::task::{StopSignal, Supervised};

/// What the core needs of a consumer's configuration (a subscription's `JobConfig`, a relay's
/// `RelayConfig`): the row's name and lane, where a new row starts, and the lease.
#[derive(Debug, Clone)]
pub(crate) struct Registration {
    pub(crate) name: String,
    pub(crate) ordering: Ordering,
    pub(crate) start: StartFrom,
    pub(crate) lease: Duration,
    pub(crate) kind: Kind,
}

/// What every runner reads from: the pool and both lanes, as the outbox runs them now.
pub(crate) struct Shared<P> {
    pub(crate) pool: PgPool,
    pub(crate) lanes: Arc<CurrentLanes<P>>,
}

/// The lanes a runner reads and the signal that stops them: one outbox's, until it starts
/// them again after a rewind.
pub(crate) struct LaneSet<P> {
    pub(crate) lane: Arc<LaneShared<P>>,
    pub(crate) commit: Arc<CommitShared>,
    /// Set when these lanes stop (the outbox shuts down, or starts new lanes after a rewind):
    /// a runner's reads end with it, and its next claim reads the lanes current then.
    pub(crate) stop: StopSignal,
}

impl<P> Clone for LaneSet<P> {
    fn clone(&self) -> Self {
        Self {
            lane: Arc::clone(&self.lane),
            commit: Arc::clone(&self.commit),
            stop: self.stop.clone(),
        }
    }
}

/// The lanes an outbox runs now. Replaced when the outbox starts again after the database went
/// back in time under it ([`Error::ServerRewound`]): runners take the lanes from here at each
/// claim, so they go on with the new lanes from the position stored on the server.
pub(crate) struct CurrentLanes<P> {
    lanes: RwLock<LaneSet<P>>,
}

impl<P> CurrentLanes<P> {
    pub(crate) fn new(lanes: LaneSet<P>) -> Self {
        Self {
            lanes: RwLock::new(lanes),
        }
    }

    /// The lanes current now.
    pub(crate) fn get(&self) -> LaneSet<P> {
        match self.lanes.read() {
            Ok(lanes) => lanes.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Makes `lanes` the current ones.
    pub(crate) fn replace(&self, lanes: LaneSet<P>) {
        match self.lanes.write() {
            Ok(mut current) => *current = lanes,
            Err(poisoned) => *poisoned.into_inner() = lanes,
        }
    }
}

/// Where each lane's head is now, for a handle's lag (which does not know the payload type).
pub(crate) trait LaneHeads: Send + Sync {
    /// A watch of the insert lane's frontier.
    fn insert(&self) -> watch::Receiver<u64>;
    /// The commit lane.
    fn commit(&self) -> Arc<CommitShared>;
}

impl<P: Send + Sync> LaneHeads for CurrentLanes<P> {
    fn insert(&self) -> watch::Receiver<u64> {
        self.get().lane.frontier_watch()
    }

    fn commit(&self) -> Arc<CommitShared> {
        self.get().commit
    }
}

/// Where a new consumer starts, per its configuration.
fn start_position<P>(shared: &Shared<P>, config: &Registration) -> Position {
    let lanes = shared.lanes.get();
    let start_at = match (config.start, config.ordering) {
        (StartFrom::Beginning, _) => 0,
        (StartFrom::Now, Ordering::Insert) => lanes.lane.frontier(),
        (StartFrom::Now, Ordering::Commit) => lanes.commit.head(),
    };
    Position::new(config.ordering, start_at)
}

/// Creates the row of `config` if it is new (refusing a lane mismatch) and spawns the runner
/// `make` builds, in the care of `runners`: the machinery subscriptions and relays share
/// (status, supervision, shutdown bounded by the lease).
pub(crate) async fn start<P, F, Fut>(
    shared: Shared<P>,
    runners: &Runners,
    config: &Registration,
    make: F,
) -> Result<SubscriptionHandle>
where
    P: DeserializeOwned + Send + Sync + 'static,
    F: FnOnce(Consumer) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let start_at = start_position(&shared, config);
    let kind = config.kind.as_str();
    let role = ensure_row(&shared.pool, config, start_at, kind).await?;
    let initial = SubscriptionStatus::starting(config.name.clone(), start_at, kind, role);
    let (status, status_rx) = watch::channel(initial);
    let heads = Heads {
        current: Arc::clone(&shared.lanes) as Arc<dyn LaneHeads>,
    };
    // Every line the runner logs carries this span: the name is the application's or an
    // operator's text, shown so that it cannot drive a terminal or forge a line.
    let span = tracing::info_span!(
        "ordo",
        task = kind,
        subscription = %crate::telemetry::printable(&config.name)
    );
    let owner = Uuid::new_v4();
    let pool = shared.pool.clone();
    let registration = config.clone();
    let task = Supervised::spawn(kind, span, |stop| {
        let stopped = MarkStopped(status.clone());
        let work = make(Consumer {
            pool: shared.pool,
            name: registration.name,
            ordering: registration.ordering,
            lease: registration.lease,
            kind: registration.kind,
            owner,
            stop,
            status,
            tenure: Tenure::default(),
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
/// of the other lane, or a row an older ordo wrote (no role) unless this role bypasses row
/// security. Returns the role the row is run by (`None`: such an old row, run by the owner).
async fn ensure_row(
    pool: &PgPool,
    config: &Registration,
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
        let Some(owner) = stored.role else {
            return Err(Error::Unadopted {
                name: config.name.clone(),
                table: "ordo.subscriptions",
                adopt: format!(
                    "ordo subscriptions adopt {} --role {}",
                    crate::telemetry::printable(&config.name),
                    crate::telemetry::printable(&stored.connected)
                ),
                connected: stored.connected,
            });
        };
        return Err(Error::NotOwnRow {
            subscription: config.name.clone(),
            owner,
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
