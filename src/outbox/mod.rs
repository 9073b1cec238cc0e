//! [`Outbox`]: the handle an application holds, and the hub that starts every part.
//!
//! Its methods are spread by concept: publishing here (the work is in `write/`), listener
//! streams in `read.rs`, read-your-writes in `wait.rs`, commits that lost their answer in
//! `in_doubt.rs`, subscriptions and relays in `consumers.rs`. Each part starts itself
//! (`insert_lane::spawn`, `write::spawn`, `ops::spawn`, `commit_lane::spawn`,
//! `subscription::spawn`); what is left here ties them together: construction (of the first
//! generation of lanes, and of each one after a rewind, whose lifecycle is
//! `commit_lane::rewind`'s), and the ordered shutdown.

mod consumers;
mod in_doubt;
mod latest;
mod read;
mod wait;

use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{PgPool, Postgres, Transaction};

use crate::commit_lane::rewind::{Generation, Generations};
use crate::commit_lane::{self, rewind};
use crate::config::{MIN_POOL_CONNECTIONS, OnRewind, OutboxConfig};
use crate::consumer::{CurrentLanes, LaneSet, Runners};
use crate::error::{Error, Result};
use crate::insert_lane;
use crate::latest::LatestHub;
use crate::listen::Listen;
use crate::pooler::{self, Sessions, Statements};
use crate::position::EventSequence;
use crate::task::Tasks;
use crate::write::publish_in::publish_in;
use crate::write::transaction::OutboxTransaction;

/// An outbox of events of type `P` on one database.
///
/// Cheap to clone: clones share the background tasks (the insert lane's frontier task, the
/// wake-up listener and notifier, the sequencer) and the subscription runners. They stop when
/// [`shutdown`](Self::shutdown) is called or the last clone is dropped. If the database goes
/// back in time under it (a failover that lost transactions), it starts its lanes again from
/// what the server holds ([`OutboxConfig::on_rewind`]).
///
/// ```no_run
/// # #[derive(serde::Serialize, serde::Deserialize)] struct OrderPlaced { id: u64 }
/// # async fn run(pool: sqlx::PgPool) -> ordo::Result<()> {
/// use futures::StreamExt;
/// use ordo::{Outbox, OutboxConfig, Start};
///
/// ordo::migrate(&pool).await?;
/// let outbox = Outbox::<OrderPlaced>::new(pool, OutboxConfig::default()).await?;
/// let mut events = outbox.listen_inserted(Start::Now);
///
/// let mut tx = outbox.begin().await?;
/// sqlx::query("INSERT INTO orders (id) VALUES (42)").execute(&mut *tx).await?;
/// tx.publish(OrderPlaced { id: 42 })?;
/// tx.commit().await?;
///
/// let event = events.next().await.expect("the outbox is running")?;
/// assert_eq!(event.payload.id, 42);
/// # Ok(()) }
/// ```
pub struct Outbox<P> {
    inner: Arc<Inner<P>>,
}

struct Inner<P> {
    /// The publishing pool: `begin`.
    pool: PgPool,
    /// The background parts' pool: [`OutboxConfig::background_pool`], else `pool`.
    direct: PgPool,
    config: OutboxConfig,
    /// How publishing statements are sent (unnamed through a transaction-mode pooler).
    statements: Statements,
    /// The lanes and the tasks that run them: the running generation, replaced when the outbox
    /// starts again after the database went back in time under it; closed by
    /// [`Outbox::shutdown`] (or a rewind under [`OnRewind::Stop`]), after which no generation
    /// starts.
    generations: Generations<P>,
    /// The lanes of the running generation, as subscription runners take them at each claim.
    /// A cell of its own, replaced with the generation (its hand-over): runners outlive a
    /// dropped outbox until they see their stop, and holding the generation would keep its
    /// tasks (and its LISTEN connection) from the stop that dropping it sends.
    current: Arc<CurrentLanes<P>>,
    /// Subscription runners: stopped before the lanes they read.
    runners: Runners,
}

/// Reads the lanes' positions from the server and spawns the tasks that run them: one
/// generation of the outbox's lanes.
async fn start_generation<P>(
    direct: &PgPool,
    config: &OutboxConfig,
    statements: Statements,
) -> Result<Generation<P>>
where
    P: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    let tasks = Tasks::new();
    let listen = Listen::new(direct);
    let (lane, handoff) = insert_lane::spawn(&tasks, &listen, direct, config).await?;
    let sink = crate::write::spawn(&tasks, direct, config, &lane, handoff, statements);
    crate::ops::spawn(&tasks, direct, config);
    let commit = commit_lane::spawn(&tasks, direct, config, &lane).await?;
    Ok(Generation {
        latest: LatestHub::new(direct.clone()),
        listen,
        lane,
        commit,
        sink,
        tasks,
    })
}

/// The lanes of `generation` as a runner reads them.
fn lanes_of<P>(generation: &Generation<P>) -> LaneSet<P> {
    LaneSet {
        lane: Arc::clone(&generation.lane),
        commit: Arc::clone(&generation.commit),
        stop: generation.tasks.signal(),
    }
}

impl<P> Inner<P> {
    /// Stops the subscription runners, then the lanes they read and every other task.
    async fn stop(&self) {
        self.generations.close();
        self.runners.shutdown().await;
        self.generations.running().stop().await;
    }
}

/// The outbox as the rewind lifecycle sees it: the wiring stays here.
impl<P> rewind::Hub<P> for Inner<P>
where
    P: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    fn generations(&self) -> &Generations<P> {
        &self.generations
    }

    fn background_pool(&self) -> &PgPool {
        &self.direct
    }

    fn on_rewind(&self) -> OnRewind {
        self.config.on_rewind
    }

    async fn start(&self) -> Result<Generation<P>> {
        start_generation(&self.direct, &self.config, self.statements).await
    }

    fn hand_over(&self, next: &Generation<P>) {
        self.current.replace(lanes_of(next));
    }

    async fn stop(&self) {
        Inner::stop(self).await;
    }
}

impl<P> Clone for Outbox<P> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<P> Outbox<P>
where
    P: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// Starts an outbox on `pool`: finds the insert lane's frontier in the table, then spawns
    /// the background tasks. The schema must exist ([`migrate`](crate::migrate)).
    ///
    /// The pool must allow at least [`MIN_POOL_CONNECTIONS`] connections. It does everything,
    /// unless [`OutboxConfig::background_pool`] gives the background parts a pool of their own;
    /// then `pool` serves [`begin`](Self::begin) and [`publish_in`](Self::publish_in) only, and
    /// may go through a transaction-mode pooler (its statements are then sent unnamed).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a contradictory `config`, or a pool whose `max_connections`
    /// is below [`MIN_POOL_CONNECTIONS`]; [`Error::TransactionPooler`] if the pool that runs
    /// the background parts goes through a transaction-mode pooler; [`Error::NotMigrated`] if
    /// the schema does not exist; [`Error::SchemaTooNew`] if a newer ordo migrated it;
    /// [`Error::Database`] if the table cannot be read.
    pub async fn new(pool: PgPool, config: OutboxConfig) -> Result<Self> {
        config.validate()?;
        check_pool(&pool)?;
        let statements = match &config.background_pool {
            None => {
                pooler::require_sessions(
                    &pool,
                    "the pool given to Outbox::new",
                    "give ordo's background parts a direct or session-mode pool with \
                     OutboxConfig::background_pool, or connect to the server itself",
                )
                .await?;
                Statements::Named
            }
            Some(background) => {
                check_pool(background)?;
                pooler::require_sessions(
                    background,
                    "OutboxConfig::background_pool",
                    "connect it to the server itself or to a session-mode pool",
                )
                .await?;
                match pooler::probe(&pool).await? {
                    Sessions::Kept => Statements::Named,
                    Sessions::PerTransaction => Statements::Unnamed,
                }
            }
        };
        let direct = config
            .background_pool
            .clone()
            .unwrap_or_else(|| pool.clone());
        crate::migrate::check_schema_version(&direct).await?;
        crate::metrics::describe();
        let generation = start_generation(&direct, &config, statements).await?;
        let inner = Arc::new(Inner {
            current: Arc::new(CurrentLanes::new(lanes_of(&generation))),
            generations: Generations::new(generation),
            pool,
            direct,
            config,
            statements,
            runners: Runners::new(),
        });
        // Its lanes stop on a rewind, and then, per `OutboxConfig::on_rewind`, new lanes start
        // from what the server holds or the outbox stops.
        rewind::spawn(&inner);
        Ok(Self { inner })
    }

    /// The pool this outbox publishes with ([`begin`](Self::begin)): the one given to
    /// [`new`](Self::new). The background parts use it too, unless
    /// [`OutboxConfig::background_pool`] gave them another.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The configuration this outbox runs with.
    pub fn config(&self) -> &OutboxConfig {
        &self.inner.config
    }

    /// Opens a transaction to write domain rows and publish events in.
    ///
    /// # Errors
    /// [`Error::Database`] if no connection can be had; [`Error::Shutdown`] after
    /// [`shutdown`](Self::shutdown); [`Error::ServerRewound`] while the outbox starts again
    /// after the database went back in time under it (try again shortly), or for good under
    /// [`OnRewind::Stop`].
    pub async fn begin(&self) -> Result<OutboxTransaction<P>> {
        let generation = self.inner.generations.running();
        if let Some(error) = generation.lane.rewind.error() {
            return Err(error);
        }
        if generation.tasks.signal().is_stopped() || self.inner.generations.is_closed() {
            return Err(Error::Shutdown);
        }
        let tx = self.inner.pool.begin().await?;
        Ok(OutboxTransaction::new(tx, Arc::clone(&generation.sink)))
    }

    /// Inserts `events` into `ordo.events` now, inside a transaction the caller owns and will
    /// commit (or roll back) itself. Returns their sequences.
    ///
    /// Because ordo does not see that commit, this process's listeners find the events through
    /// the table (the lane polls quickly, having been told their sequences), and other
    /// processes on their next wake-up or resync. Every event is serialised before the first
    /// insert (an encoding error inserts nothing); a large batch is then inserted in bounded
    /// chunks, so memory stays near the batch's JSON size.
    ///
    /// **Causal order caveat.** The commit lane orders transactions by their lowest sequence,
    /// which is causal only if a transaction inserts its events *after* every read it makes.
    /// Call `publish_in` last, right before committing, as [`OutboxTransaction::commit`] does.
    ///
    /// **If your commit fails without an answer** (the connection broke during `COMMIT`), the
    /// transaction may have committed. Take its id and its events' ids before committing, in
    /// the same transaction, after `publish_in`:
    /// `SELECT pg_current_xact_id()::text::bigint, array_agg(id) FROM ordo.events WHERE
    /// sequence = ANY($1)`, binding the sequences it returned as `$1`. On such a failure
    /// ask [`commit_status`](Self::commit_status) with both until it says committed (do not
    /// retry) or aborted (retry); the xid alone is not proof after a failover. See
    /// [`Error::CommitInDoubt`] for the procedure `OutboxTransaction::commit` follows.
    ///
    /// # Errors
    /// [`Error::Encode`] if an event does not serialise; [`Error::Database`] if the insert
    /// fails (the caller's transaction is then aborted, as with any failed statement);
    /// [`Error::ServerRewound`] as [`begin`](Self::begin) returns it.
    pub async fn publish_in(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        events: impl IntoIterator<Item = P>,
    ) -> Result<Vec<EventSequence>> {
        let generation = self.inner.generations.running();
        if let Some(error) = generation.lane.rewind.error() {
            return Err(error);
        }
        publish_in(&generation.sink, tx, events).await
    }

    /// The outbox's state as the database shows it: positions, lag of each lane and each
    /// subscription, and stalls with the transaction holding them. Same as
    /// [`status`](crate::admin::status) on this outbox's pool; made for health endpoints.
    ///
    /// # Errors
    /// [`Error::Database`] if a query fails.
    pub async fn status(&self) -> Result<crate::OutboxStatus> {
        crate::admin::status(&self.inner.direct).await
    }

    /// Shuts the outbox down, in this order:
    ///
    /// 1. **Subscriptions**, all at once: each runner finishes the unit in hand (its handler's
    ///    transaction commits with the checkpoint), waiting at most the subscription's
    ///    [lease](crate::JobConfig::lease); a handler still running then is aborted, which rolls its
    ///    transaction back. Every lease this process holds is released before the next step,
    ///    so a standby elsewhere takes over at its next claim rather than when the lease
    ///    expires.
    /// 2. **Lanes and operations**: the frontier task, wake-ups, sequencer (or watcher),
    ///    maintainer and latest-value listener stop after the step in hand (each waited for
    ///    up to 10 s, then aborted), and every listener stream (latest values included) ends.
    ///    [`begin`](Self::begin) returns [`Error::Shutdown`] from here on.
    ///
    /// Subscriptions go first because they read the lanes: a runner must not find its lane
    /// gone mid-unit.
    ///
    /// Idempotent: a second call, or a concurrent one, returns once the first is done.
    /// Dropping the last clone of the outbox asks every task and runner to stop, without
    /// waiting.
    pub async fn shutdown(&self) {
        self.inner.stop().await;
    }
}

/// Refuses a pool too small to run an outbox.
fn check_pool(pool: &PgPool) -> Result<()> {
    let connections = pool.options().get_max_connections();
    if connections < MIN_POOL_CONNECTIONS {
        return Err(Error::InvalidConfig {
            setting: "pool max_connections",
            reason: format!(
                "the pool allows {connections} connection(s); an Outbox needs at least \
                 {MIN_POOL_CONNECTIONS}: one for the application's transactions and one for its \
                 background work. Build the pool with PgPoolOptions::new().max_connections({MIN_POOL_CONNECTIONS}) or more"
            ),
        });
    }
    Ok(())
}
