//! [`Outbox`]: the handle an application holds, and the hub that starts every part.
//!
//! Its methods are spread by concept: publishing here (the work is in `write/`), listener
//! streams in `read.rs`, read-your-writes in `wait.rs`. Each part starts itself
//! (`insert_lane::spawn`, `write::spawn`, `ops::spawn`, `commit_lane::spawn`,
//! `subscription::spawn`); what is left here ties them together: construction, and the
//! ordered shutdown.

mod latest;
mod read;
mod wait;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{PgPool, Postgres, Transaction};
use tokio::sync::watch;
use uuid::Uuid;

use crate::commit_lane::{self, CommitShared};
use crate::config::{MIN_POOL_CONNECTIONS, OnRewind, OutboxConfig};
use crate::consumer::{CurrentLanes, LaneSet, Runners, Shared, SubscriptionHandle};
use crate::error::{Error, Result};
use crate::insert_lane::{self, LaneShared};
use crate::latest::LatestHub;
use crate::listen::Listen;
use crate::pooler::{self, Sessions, Statements};
use crate::position::EventSequence;
use crate::subscription::{self, JobConfig, Subscriber};
use crate::task::Tasks;
use crate::write::in_doubt::{self, CommitStatus};
use crate::write::publish_in::publish_in;
use crate::write::sink::CommitSink;
use crate::write::transaction::OutboxTransaction;

/// How long [`Outbox::shutdown`] waits for each lane task.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The first and the longest wait between two attempts to start the lanes again after a
/// rewind, while the server does not answer.
const REWIND_RETRY_FIRST: Duration = Duration::from_millis(100);
const REWIND_RETRY_MAX: Duration = Duration::from_secs(5);

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
    /// The lanes and the tasks that run them: replaced when the outbox starts again after the
    /// database went back in time under it.
    generation: RwLock<Arc<Generation<P>>>,
    /// The lanes of `generation`, as subscription runners take them at each claim. A cell of
    /// its own, replaced with `generation` (in [`Inner::install`]): runners outlive a dropped
    /// outbox until they see their stop, and holding the generation would keep its tasks (and
    /// its LISTEN connection) from the stop that dropping it sends.
    current: Arc<CurrentLanes<P>>,
    /// Subscription runners: stopped before the lanes they read.
    runners: Runners,
    /// Set by [`Outbox::shutdown`] (or a rewind under [`OnRewind::Stop`]): no generation
    /// starts after it.
    closed: watch::Sender<bool>,
}

/// What an outbox runs on one stretch of the server's history: its lanes, built from what the
/// server holds when it starts, and the tasks that run them. A rewind ends one; the next one
/// starts from what the server holds then, as a new `Outbox` would.
struct Generation<P> {
    lane: Arc<LaneShared<P>>,
    commit: Arc<CommitShared>,
    sink: Arc<CommitSink<P>>,
    /// Latest values: its tasks start with the first latest stream, under `tasks`.
    latest: LatestHub,
    /// The one LISTEN connection, for the wake-ups and the latest values.
    listen: Listen,
    /// The lanes' and operations' tasks.
    tasks: Tasks,
}

impl<P> Generation<P>
where
    P: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// Reads the lanes' positions from the server and spawns the tasks that run them.
    async fn start(direct: &PgPool, config: &OutboxConfig, statements: Statements) -> Result<Self> {
        let tasks = Tasks::new();
        let listen = Listen::new(direct);
        let (lane, handoff) = insert_lane::spawn(&tasks, &listen, direct, config).await?;
        let sink = crate::write::spawn(&tasks, direct, config, &lane, handoff, statements);
        crate::ops::spawn(&tasks, direct, config);
        let commit = commit_lane::spawn(&tasks, direct, config, &lane).await?;
        Ok(Self {
            latest: LatestHub::new(direct.clone()),
            listen,
            lane,
            commit,
            sink,
            tasks,
        })
    }
}

impl<P> Generation<P> {
    fn lanes(&self) -> LaneSet<P> {
        LaneSet {
            lane: Arc::clone(&self.lane),
            commit: Arc::clone(&self.commit),
            stop: self.tasks.signal(),
        }
    }
}

impl<P> Inner<P> {
    /// The lanes running now.
    fn generation(&self) -> Arc<Generation<P>> {
        match self.generation.read() {
            Ok(generation) => Arc::clone(&generation),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Makes `next` the running generation, unless the outbox was shut down meanwhile (then
    /// stops it and returns false).
    fn install(&self, next: Generation<P>) -> bool {
        let mut slot = match self.generation.write() {
            Ok(slot) => slot,
            Err(poisoned) => poisoned.into_inner(),
        };
        // Read under the lock `stop` reads the generation under, after setting `closed`: a
        // generation installed here is the one it stops.
        if *self.closed.borrow() {
            next.tasks.request_stop();
            return false;
        }
        self.current.replace(next.lanes());
        *slot = Arc::new(next);
        true
    }

    /// Stops the subscription runners, then the lanes they read and every other task.
    async fn stop(&self) {
        self.closed.send_replace(true);
        self.runners.shutdown().await;
        self.generation().tasks.stop(SHUTDOWN_GRACE).await;
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
        let generation = Generation::start(&direct, &config, statements).await?;
        let outbox = Self {
            inner: Arc::new(Inner {
                current: Arc::new(CurrentLanes::new(generation.lanes())),
                generation: RwLock::new(Arc::new(generation)),
                pool,
                direct,
                config,
                statements,
                runners: Runners::new(),
                closed: watch::Sender::new(false),
            }),
        };
        outbox.watch_for_rewinds();
        Ok(outbox)
    }

    /// Watches for the database going back in time under the outbox ([`Error::ServerRewound`]):
    /// its lanes hold events the server no longer has, and going on with them would deliver
    /// positions the server gives again to other events as if they had been delivered. The
    /// lanes stop (every listener ends with the error), and then, per
    /// [`OutboxConfig::on_rewind`], either new lanes start from what the server holds (the
    /// runners claim again onto them) or the outbox stops. A task of its own, which ends with
    /// the outbox; it holds the outbox only while it acts.
    fn watch_for_rewinds(&self) {
        let outbox = Arc::downgrade(&self.inner);
        let mut closed = self.inner.closed.subscribe();
        tokio::spawn(async move {
            loop {
                let (rewind, mut stopped) = match outbox.upgrade() {
                    Some(inner) => {
                        let generation = inner.generation();
                        (
                            Arc::clone(&generation.lane.rewind),
                            generation.tasks.signal(),
                        )
                    }
                    None => return,
                };
                tokio::select! {
                    _ = closed.wait_for(|closed| *closed) => return,
                    // Stopped without a rewind: the outbox was dropped.
                    _ = stopped.stopped() => if !rewind.is_reported() { return },
                    _ = rewind.reported() => {}
                }
                if !resume_after_rewind(&outbox, &rewind, &mut closed).await {
                    return;
                }
            }
        });
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
        let generation = self.inner.generation();
        if let Some(error) = generation.lane.rewind.error() {
            return Err(error);
        }
        if generation.tasks.signal().is_stopped() || *self.inner.closed.borrow() {
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
        let generation = self.inner.generation();
        if let Some(error) = generation.lane.rewind.error() {
            return Err(error);
        }
        publish_in(&generation.sink, tx, events).await
    }

    /// Whether transaction `xid`, which published the events `event_ids`, committed: the
    /// question to ask after [`Error::CommitInDoubt`] (pass its `xid` and `event_ids`), or after
    /// a caller-owned transaction that used [`publish_in`](Self::publish_in) lost its
    /// `COMMIT`'s answer. `xid` is the 64-bit id in `ordo.events.commit_xid` and
    /// [`Envelope::commit_xid`](crate::Envelope).
    ///
    /// The stored events are the proof, so that the answer holds across a failover:
    /// `Committed` only if the server holds them under `xid`; `Aborted` if it rolled back, if
    /// the server has no record of `xid` (a promoted standby that never received the
    /// transaction), or if `xid` committed without them (a promoted standby gives a lost
    /// transaction's id to a transaction of its own, whose fate the id alone would report);
    /// `InProgress` while it can still commit: ask again later, and do not publish its events
    /// again meanwhile.
    ///
    /// With no `event_ids` (a transaction that published nothing) there is no proof: the answer
    /// is the server's word on `xid` alone, which a failover in between can make another
    /// transaction's. Retention drops events, not transaction ids: ask within the retention
    /// period, or a committed transaction whose events were dropped reads as `Aborted`.
    ///
    /// ```no_run
    /// # async fn run(outbox: ordo::Outbox<String>) -> ordo::Result<()> {
    /// let mut tx = outbox.begin().await?;
    /// tx.publish("order 17 placed".to_owned())?;
    /// match tx.commit().await {
    ///     Err(ordo::Error::CommitInDoubt { xid, event_ids, .. }) => {
    ///         match outbox.commit_status(xid, &event_ids).await? {
    ///             ordo::CommitStatus::Committed => {}        // done: do not publish again
    ///             ordo::CommitStatus::Aborted => {}          // retry the whole transaction
    ///             _ => {}                                    // ask again later
    ///         }
    ///     }
    ///     other => { other?; }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Database`] if the server cannot be asked: ask again later. With no
    /// `event_ids`, also if `xid` is not a transaction id of this server yet ("in the future").
    pub async fn commit_status(&self, xid: i64, event_ids: &[Uuid]) -> Result<CommitStatus> {
        in_doubt::status(&self.inner.direct, xid, event_ids).await
    }

    /// Which of `ids` are stored in `ordo.events` as committed events. For a caller that lost
    /// the transaction id of an in-doubt commit but kept its event ids
    /// ([`OutboxTransaction::event_ids`]): an id found was published; an id not found was not
    /// published *yet*, which is final only once the transaction that wrote it can no longer
    /// be in progress (its connection is gone and the server has noticed). Prefer
    /// [`commit_status`](Self::commit_status) when you have the xid.
    ///
    /// # Errors
    /// [`Error::Database`] if the query fails.
    pub async fn published(&self, ids: &[Uuid]) -> Result<Vec<Uuid>> {
        in_doubt::published(&self.inner.direct, ids).await
    }

    /// Starts a durable subscription: `subscriber` handles every event of the configured lane,
    /// from the stored position (or the configured start for a new subscription), each in a
    /// transaction that also checkpoints the position. One process runs a given subscription at
    /// a time; others with the same name wait on standby and take over when its lease expires.
    ///
    /// When `P` is a tagged serde enum, the subscription takes only `P`'s own event types
    /// unless `config` chooses ([`JobConfig::event_types`], [`JobConfig::all_types`]): a row of
    /// another type (another service's, a plain-SQL insert) is skipped, never handed to the
    /// handler to fail on.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a contradictory `config`; [`Error::LaneMismatch`] when the
    /// stored subscription follows the other lane; [`Error::Database`] if its row cannot be
    /// read or created; [`Error::ServerRewound`] as [`begin`](Self::begin) returns it.
    pub async fn subscribe<S>(&self, config: JobConfig, subscriber: S) -> Result<SubscriptionHandle>
    where
        S: Subscriber<P>,
    {
        self.refuse_while_rewound()?;
        subscription::spawn(
            self.shared(),
            &self.inner.runners,
            config.resolve_types::<P>(),
            subscriber,
        )
        .await
    }

    /// Starts a relay: every event of the configured lane is delivered to `sink` at least once,
    /// with its id as the message id so that the receiver deduplicates, in order per key
    /// (`keys` gives an event's keys, as [`Subscriber::keys`] does for a keyed subscription;
    /// events with no key in common are sent in the same batches, in no particular order).
    /// No sink I/O happens inside a database transaction: a batch is sent under one deadline,
    /// then its results are stored, fenced by the relay's lease. See [`crate::relay`] and
    /// `docs/relays.md`.
    ///
    /// **The relay forwards bytes.** Each message carries the payload's stored JSON text
    /// unchanged (fields `P` does not know, `1.10` as written), whatever `P` is; `P` is only
    /// decoded to run `keys`. A payload that does not decode as `P` is still sent, ordered
    /// with every event (its keys cannot be known), and logged. When `P` is a tagged serde
    /// enum the relay sends only `P`'s own event types unless `config` chooses
    /// ([`RelayConfig::event_types`](crate::relay::RelayConfig::event_types),
    /// [`all_types`](crate::relay::RelayConfig::all_types)).
    ///
    /// The relay has a row in `ordo.subscriptions` (its watermark and lease) under its name:
    /// `ordo subscriptions` lists it, and a parked event's keys are its stalled keys
    /// ([`list_stalled_keys`](crate::admin::list_stalled_keys),
    /// [`retry_stalled_keys`](crate::admin::retry_stalled_keys) requeues them).
    ///
    /// ```no_run
    /// # #[cfg(feature = "nats")]
    /// # async fn example(outbox: ordo::Outbox<serde_json::Value>) -> ordo::Result<()> {
    /// use ordo::relay::{RelayConfig, nats::NatsSink};
    ///
    /// let sink = NatsSink::builder("nats://127.0.0.1:4222").subject_prefix("billing").build()?;
    /// let relay = outbox
    ///     .relay(RelayConfig::new("billing-to-nats"), sink, |event| {
    ///         // Per customer: one customer's events leave in order.
    ///         ordo::Keys::one(event.payload["customer"].to_string())
    ///     })
    ///     .await?;
    /// # relay.detach();
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for settings that cannot hold (naming them: `batch_size ×
    /// per_event_budget ≤ batch_deadline < lease`); [`Error::LaneMismatch`] when a row of the
    /// same name follows the other lane; [`Error::Database`] if its row cannot be read or
    /// created; [`Error::ServerRewound`] as [`begin`](Self::begin) returns it.
    pub async fn relay<K, F>(
        &self,
        config: crate::relay::RelayConfig,
        sink: K,
        keys: F,
    ) -> Result<SubscriptionHandle>
    where
        K: crate::relay::Sink,
        F: Fn(&crate::Envelope<P>) -> crate::Keys + Send + Sync + 'static,
    {
        self.relay_with_sinks(config, vec![sink], keys).await
    }

    /// [`relay`](Self::relay) with one batch in flight per sink: a slow receiver (one
    /// recipient's endpoint taking seconds) holds the batch it is in, while the other sinks
    /// carry the events of every key it does not hold. The sinks should deliver to the same
    /// place (e.g. `n` sinks built from one builder's settings); one key's events still leave
    /// one at a time, in order.
    ///
    /// # Errors
    /// As [`relay`](Self::relay); [`Error::InvalidConfig`] for an empty `sinks`.
    pub async fn relay_with_sinks<K, F>(
        &self,
        config: crate::relay::RelayConfig,
        sinks: Vec<K>,
        keys: F,
    ) -> Result<SubscriptionHandle>
    where
        K: crate::relay::Sink,
        F: Fn(&crate::Envelope<P>) -> crate::Keys + Send + Sync + 'static,
    {
        self.refuse_while_rewound()?;
        let config = config.resolve_types::<P>();
        crate::relay::start::spawn(
            self.shared(),
            &self.inner.runners,
            config,
            sinks,
            Arc::new(keys),
        )
        .await
    }

    /// [`Error::ServerRewound`] while the lanes are stopped on a rewind: a consumer started now
    /// would take its start (`StartFrom::Now`) from lanes the server went back under.
    fn refuse_while_rewound(&self) -> Result<()> {
        match self.inner.generation().lane.rewind.error() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// What a runner reads from.
    fn shared(&self) -> Shared<P> {
        Shared {
            pool: self.inner.direct.clone(),
            lanes: Arc::clone(&self.inner.current),
        }
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
    ///    [lease](JobConfig::lease); a handler still running then is aborted, which rolls its
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

/// One rewind under the outbox `outbox` (reported on `rewind`): stops the lanes it ended, then
/// starts new ones from what the server holds, retrying while the server does not answer, or
/// stops the outbox under [`OnRewind::Stop`]. Returns whether the outbox goes on.
async fn resume_after_rewind<P>(
    outbox: &std::sync::Weak<Inner<P>>,
    rewind: &insert_lane::Rewind,
    closed: &mut watch::Receiver<bool>,
) -> bool
where
    P: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    let Some(inner) = outbox.upgrade() else {
        return false;
    };
    let error = rewind
        .error()
        .map(|error| error.to_string())
        .unwrap_or_default();
    metrics::gauge!(crate::telemetry::metrics::SERVER_REWOUND).set(1.0);
    metrics::counter!(crate::telemetry::metrics::SERVER_REWINDS).increment(1);
    let resume = inner.config.on_rewind == OnRewind::Resume;
    tracing::error!(
        %error,
        resume,
        "ordo outbox: the database went back in time; every listener ends here, and {}",
        if resume {
            "the outbox starts again from what the server holds"
        } else {
            "the outbox stops (OnRewind::Stop)"
        }
    );
    // Its listeners end with the error; the runners' reads end, and they claim again.
    let ended = inner.generation();
    ended.tasks.stop(SHUTDOWN_GRACE).await;
    if !resume {
        // Other processes may go on: the positions given again still get a history of their own.
        let _ = commit_lane::new_history::begin_after_rewind(&inner.direct, &ended.commit, rewind)
            .await;
        inner.stop().await;
        return false;
    }
    drop(inner);
    let mut backoff = REWIND_RETRY_FIRST;
    let mut history_begun = false;
    loop {
        let Some(inner) = outbox.upgrade() else {
            return false;
        };
        if *closed.borrow() {
            return false;
        }
        // Before the new lanes append anything: what they append at positions given again
        // must belong to the new history.
        if !history_begun {
            match commit_lane::new_history::begin_after_rewind(&inner.direct, &ended.commit, rewind)
                .await
            {
                Ok(_) => history_begun = true,
                Err(error) => {
                    tracing::warn!(%error, retry_in = ?backoff, "ordo outbox: beginning a new server history after the rewind failed; trying again");
                    drop(inner);
                    tokio::select! {
                        _ = closed.wait_for(|closed| *closed) => return false,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(REWIND_RETRY_MAX);
                    continue;
                }
            }
        }
        match Generation::start(&inner.direct, &inner.config, inner.statements).await {
            Ok(next) => {
                let (frontier, head) = (next.lane.frontier(), next.commit.head());
                if !inner.install(next) {
                    return false;
                }
                metrics::gauge!(crate::telemetry::metrics::SERVER_REWOUND).set(0.0);
                tracing::warn!(
                    insert_frontier = frontier,
                    commit_head = head,
                    "ordo outbox started again after the rewind, from what the server holds: \
                     listen again to follow it; subscriptions and relays go on from their \
                     positions stored there"
                );
                return true;
            }
            Err(error) => {
                tracing::warn!(%error, retry_in = ?backoff, "ordo outbox: starting again after the rewind failed; trying again");
            }
        }
        drop(inner);
        tokio::select! {
            _ = closed.wait_for(|closed| *closed) => return false,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(REWIND_RETRY_MAX);
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
