//! [`Outbox`]: the handle an application holds.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{PgPool, Postgres, Transaction};
use tokio::sync::{mpsc, watch};
use uuid::Uuid;

use super::in_doubt::{self, CommitStatus};
use super::insert::{self, Buffer};
use super::notifier;
use super::transaction::OutboxTransaction;
use crate::commit_lane::listener::{self as commit_listener, CommitReader, CommitStream};
use crate::commit_lane::sequencer::Sequencer;
use crate::commit_lane::{CommitShared, HEAD_SQL, watcher};
use crate::config::{MIN_POOL_CONNECTIONS, OutboxConfig};
use crate::envelope::Headers;
use crate::error::{Error, Result};
use crate::event_type::TypeFilter;
use crate::insert_lane::cache::Slot;
use crate::insert_lane::frontier::FrontierTask;
use crate::insert_lane::listener::{self, EventStream};
use crate::insert_lane::reader::LaneReader;
use crate::insert_lane::rows::{self, ReadMode};
use crate::insert_lane::{CommittedBatch, LaneShared, wakeup};
use crate::ops::metrics as m;
use crate::position::{CommitSequence, EventSequence, Start};
use crate::subscription::{self, JobConfig, Subscriber, SubscriptionHandle};
use crate::task::Tasks;

/// How long [`Outbox::shutdown`] waits for each background task.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// An outbox of events of type `P` on one database.
///
/// Cheap to clone: clones share the background tasks (the insert lane's frontier task, the
/// wake-up listener and notifier, the sequencer). The tasks stop when
/// [`shutdown`](Self::shutdown) is called or the last clone is dropped.
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
    pool: PgPool,
    config: OutboxConfig,
    lane: Arc<LaneShared<P>>,
    commit: Arc<CommitShared>,
    commits: mpsc::UnboundedSender<CommittedBatch<P>>,
    /// The highest sequence committed by this process, for the wake-up notifier.
    committed: watch::Sender<u64>,
    tasks: Tasks,
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
    /// The pool must allow at least [`MIN_POOL_CONNECTIONS`] connections.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a contradictory `config`, or a pool whose `max_connections`
    /// is below [`MIN_POOL_CONNECTIONS`]; [`Error::NotMigrated`] if the schema does not exist;
    /// [`Error::SchemaTooNew`] if a newer ordo migrated it; [`Error::Database`] if the table
    /// cannot be read.
    pub async fn new(pool: PgPool, config: OutboxConfig) -> Result<Self> {
        config.validate()?;
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
        crate::migrate::check_schema_version(&pool).await?;
        let frontier = rows::initial_frontier(&pool).await?;
        let lane = Arc::new(LaneShared::new(
            pool.clone(),
            frontier,
            config.cache_capacity,
            config.cache_bytes,
            config.page_size,
        ));
        let head: i64 = sqlx::query_scalar(HEAD_SQL).fetch_one(&pool).await?;
        let commit = Arc::new(CommitShared::new(rows::to_u64(head), config.cache_capacity));
        let tasks = Tasks::new();
        let (commits, commits_rx) = mpsc::unbounded_channel();
        let committed = watch::Sender::new(0);

        let frontier_task = FrontierTask::new(
            Arc::clone(&lane),
            commits_rx,
            tasks.signal(),
            config.clone(),
        );
        tasks.spawn("insert_lane.frontier", frontier_task.run());
        if config.cross_process_wakeups {
            tasks.spawn(
                "insert_lane.wakeup",
                wakeup::run(
                    pool.clone(),
                    config.notify_channel.clone(),
                    Arc::clone(&lane),
                    tasks.signal(),
                ),
            );
            tasks.spawn(
                "write.notifier",
                notifier::run(
                    pool.clone(),
                    config.notify_channel.clone(),
                    config.notify_debounce,
                    committed.subscribe(),
                    tasks.signal(),
                ),
            );
        }
        tasks.spawn(
            "ops.retention",
            crate::ops::retention::maintain(
                pool.clone(),
                config.retention.clone(),
                config.maintenance_interval,
                config.partition_maintenance,
                tasks.signal(),
            ),
        );
        if config.sequencer {
            let sequencer = Sequencer::new(
                pool.clone(),
                Arc::clone(&lane),
                Arc::clone(&commit),
                tasks.signal(),
                config.fold_batch,
                config.fold_interval,
            );
            tasks.spawn("commit_lane.sequencer", sequencer.run());
        } else {
            tasks.spawn(
                "commit_lane.watcher",
                watcher::run(
                    pool.clone(),
                    Arc::clone(&commit),
                    lane.frontier.subscribe(),
                    config.resync_interval,
                    tasks.signal(),
                ),
            );
        }
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                config,
                lane,
                commit,
                commits,
                committed,
                tasks,
            }),
        })
    }

    /// The pool this outbox writes and reads with.
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
    /// [`shutdown`](Self::shutdown).
    pub async fn begin(&self) -> Result<OutboxTransaction<P>> {
        if self.inner.tasks.signal().is_stopped() {
            return Err(Error::Shutdown);
        }
        let tx = self.inner.pool.begin().await?;
        Ok(OutboxTransaction::new(tx, self.clone()))
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
    /// transaction may have committed. Take its id before committing
    /// (`SELECT pg_current_xact_id()::text::bigint` in the same transaction, after
    /// `publish_in`), and on such a failure ask [`commit_status`](Self::commit_status) with it
    /// until it says committed (do not retry) or aborted (retry); see
    /// [`Error::CommitInDoubt`] for the procedure `OutboxTransaction::commit` follows.
    ///
    /// # Errors
    /// [`Error::Encode`] if an event does not serialise; [`Error::Database`] if the insert
    /// fails (the caller's transaction is then aborted, as with any failed statement).
    pub async fn publish_in(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        events: impl IntoIterator<Item = P>,
    ) -> Result<Vec<EventSequence>> {
        let mut buffer = Buffer::json_only();
        for event in events {
            buffer.push(Uuid::now_v7(), event, Headers::new())?;
        }
        if buffer.is_empty() {
            return Ok(Vec::new());
        }
        let written = insert::insert(tx, &mut buffer).await?;
        metrics::counter!(m::EVENTS_PUBLISHED).increment(written.sequences.len() as u64);
        if let Some(last) = written.sequences.last() {
            self.inner.lane.hint_head(last.get());
        }
        Ok(written.sequences)
    }

    /// Whether transaction `xid` committed: the question to ask after
    /// [`Error::CommitInDoubt`] (whose `xid` it takes), or after a caller-owned transaction
    /// that used [`publish_in`](Self::publish_in) lost its `COMMIT`'s answer. `xid` is the
    /// 64-bit id in `ordo.events.commit_xid` and [`Envelope::commit_xid`](crate::Envelope).
    ///
    /// `InProgress` means the transaction can still commit: ask again later, and do not
    /// publish its events again meanwhile.
    ///
    /// # Errors
    /// [`Error::Database`] if the server cannot be asked (or `xid` is in the future, that is,
    /// not a transaction id of this server).
    pub async fn commit_status(&self, xid: i64) -> Result<CommitStatus> {
        in_doubt::status(&self.inner.pool, xid).await
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
        in_doubt::published(&self.inner.pool, ids).await
    }

    /// A stream of the insert-ordered lane from `start`: every committed event once, in
    /// strictly increasing sequence, none missing. See [`EventStream`] for its error items.
    ///
    /// A listener that is behind the process-wide cache reads the table by pages and joins
    /// live delivery without a hole or repeat. Events are shared `Arc`s, never deep-copied.
    ///
    /// `Start::Now` starts after the lane's current frontier: every event that becomes
    /// visible to this process from then on.
    pub fn listen_inserted(&self, start: Start<EventSequence>) -> EventStream<P> {
        self.listen_filtered(start, TypeFilter::default())
    }

    /// [`listen_inserted`](Self::listen_inserted), but only the events whose type
    /// ([`Envelope::event_type`](crate::Envelope::event_type)) is one of `types`, and untyped
    /// ones. Events of other types are passed over before their payload is decoded, so a type
    /// `P` does not know never becomes an `Err` item. See the crate docs, "Event types".
    ///
    /// ```no_run
    /// # #[derive(serde::Serialize, serde::Deserialize)] enum Orders { Placed { id: u64 } }
    /// # async fn run(outbox: ordo::Outbox<Orders>) {
    /// use ordo::Start;
    /// let placed = outbox.listen_inserted_types(Start::Now, ["Placed"]);
    /// # }
    /// ```
    pub fn listen_inserted_types<I, T>(
        &self,
        start: Start<EventSequence>,
        types: I,
    ) -> EventStream<P>
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        self.listen_filtered(start, TypeFilter::only(types))
    }

    fn listen_filtered(&self, start: Start<EventSequence>, filter: TypeFilter) -> EventStream<P> {
        let after = match start {
            Start::Beginning => 0,
            Start::After(position) => position.get(),
            Start::Now => self.inner.lane.frontier(),
        };
        let reader = LaneReader::new(
            Arc::clone(&self.inner.lane),
            self.inner.tasks.signal(),
            ReadMode::Full,
            after,
        );
        listener::stream(reader, filter)
    }

    /// The insert lane's frontier in this process: every sequence at or below it is resolved
    /// (a committed event or a placeholder).
    pub fn insert_frontier(&self) -> EventSequence {
        EventSequence::new(self.inner.lane.frontier())
    }

    /// A stream of the commit-ordered lane from `start`: dense [`CommitSequence`]s (+1 each
    /// time), every source transaction's events contiguous and in insert order, the last one
    /// of each flagged as its `boundary`. See [`CommitStream`] for its error items.
    ///
    /// Groups are ordered by their lowest sequence: causal (a transaction that read another's
    /// committed row lands after it), not commit-timestamp order. See the crate docs.
    ///
    /// `Start::Now` starts after the log head as this process knows it.
    pub fn listen_committed(&self, start: Start<CommitSequence>) -> CommitStream<P> {
        let after = match start {
            Start::Beginning => 0,
            Start::After(position) => position.get(),
            Start::Now => self.inner.commit.head(),
        };
        let reader = CommitReader::new(
            Arc::clone(&self.inner.lane),
            Arc::clone(&self.inner.commit),
            self.inner.tasks.signal(),
            after,
        );
        commit_listener::stream(reader)
    }

    /// The commit log's head as this process knows it (`last_commit_seq`).
    pub fn commit_head(&self) -> CommitSequence {
        CommitSequence::new(self.inner.commit.head())
    }

    /// Read-your-writes on the commit lane: waits until every one of `sequences` (what
    /// [`OutboxTransaction::commit`] returned) is in the commit log, and returns their commit
    /// positions in the same order. Answered from the database, so it works in any process,
    /// whoever folds; woken early when this process sees the log head move.
    ///
    /// ```no_run
    /// # async fn run(outbox: ordo::Outbox<serde_json::Value>) -> ordo::Result<()> {
    /// use std::time::Duration;
    /// let mut tx = outbox.begin().await?;
    /// tx.publish(serde_json::json!({"order": 7}))?;
    /// let sequences = tx.commit().await?;
    /// let positions = outbox.wait_for_commit(&sequences, Duration::from_secs(5)).await?;
    /// println!("order 7 is at commit position {}", positions[0]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::WaitTimedOut`] when `limit` passes first (the commit lane is stalled, or no
    /// process folds: see `ordo status`); [`Error::Database`] if a query fails.
    pub async fn wait_for_commit(
        &self,
        sequences: &[EventSequence],
        limit: std::time::Duration,
    ) -> Result<Vec<CommitSequence>> {
        crate::commit_lane::wait::commit_positions(
            &self.inner.pool,
            self.inner.commit.head.subscribe(),
            sequences,
            limit,
        )
        .await
    }

    /// Read-your-writes through a subscription: waits until the subscription `name` (run by
    /// this or any other process) has handled and checkpointed every one of `sequences` (what
    /// [`OutboxTransaction::commit`] returned), on whichever lane it follows. After it returns,
    /// the subscription's writes for those events are committed (a projection can be read).
    ///
    /// ```no_run
    /// # async fn run(outbox: ordo::Outbox<serde_json::Value>) -> ordo::Result<()> {
    /// use std::time::Duration;
    /// let mut tx = outbox.begin().await?;
    /// tx.publish(serde_json::json!({"deposit": 100}))?;
    /// let sequences = tx.commit().await?;
    /// outbox.wait_for_subscription("balances", &sequences, Duration::from_secs(5)).await?;
    /// // the `balances` projection now includes the deposit
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::UnknownSubscription`] for a name with no row; [`Error::SubscriptionNotRunning`]
    /// when it is halted or paused short of the target; [`Error::WaitTimedOut`] when `limit`
    /// passes first; [`Error::Database`] if a query fails.
    pub async fn wait_for_subscription(
        &self,
        name: &str,
        sequences: &[EventSequence],
        limit: std::time::Duration,
    ) -> Result<()> {
        crate::commit_lane::wait::subscription_reached(
            &self.inner.pool,
            self.inner.commit.head.subscribe(),
            name,
            sequences,
            limit,
        )
        .await
    }

    /// Starts a durable subscription: `subscriber` handles every event of the configured lane,
    /// from the stored position (or the configured start for a new subscription), each in a
    /// transaction that also checkpoints the position. One process runs a given subscription at
    /// a time; others with the same name wait on standby and take over when its lease expires.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a contradictory `config`; [`Error::LaneMismatch`] when the
    /// stored subscription follows the other lane; [`Error::Database`] if its row cannot be
    /// read or created.
    pub async fn subscribe<S>(&self, config: JobConfig, subscriber: S) -> Result<SubscriptionHandle>
    where
        S: Subscriber<P>,
    {
        subscription::start(
            self.inner.pool.clone(),
            Arc::clone(&self.inner.lane),
            Arc::clone(&self.inner.commit),
            self.inner.tasks.signal(),
            config,
            subscriber,
        )
        .await
    }

    /// The outbox's state as the database shows it: positions, lag of each lane and each
    /// subscription, and stalls with the transaction holding them. Same as
    /// [`status`](crate::admin::status) on this outbox's pool; made for health endpoints.
    ///
    /// # Errors
    /// [`Error::Database`] if a query fails.
    pub async fn status(&self) -> Result<crate::OutboxStatus> {
        crate::admin::status(&self.inner.pool).await
    }

    /// Stops the background tasks, each after the step in hand, and ends every listener
    /// stream. Idempotent; also started (without waiting) when the last clone is dropped.
    pub async fn shutdown(&self) {
        self.inner.tasks.stop(SHUTDOWN_GRACE).await;
    }

    /// Hands events this process just committed to its own lane (`slots`, or `None` to have
    /// the lane read them from the table), and wakes other processes.
    pub(crate) fn committed(&self, last: u64, count: usize, slots: Option<Vec<Slot<P>>>) {
        if count == 0 {
            return;
        }
        metrics::counter!(m::EVENTS_PUBLISHED).increment(count as u64);
        match slots {
            // A send error means the frontier task has stopped; the table still has the events.
            Some(slots) => {
                let _ = self.inner.commits.send(slots);
            }
            None => self.inner.lane.hint_head(last),
        }
        self.inner.committed.send_if_modified(|sent| {
            let newer = last > *sent;
            if newer {
                *sent = last;
            }
            newer
        });
    }

    /// Points the lane at sequences written by a transaction whose outcome is unknown, so that
    /// it reads them soon if they did commit.
    pub(crate) fn hint_written(&self, last: u64) {
        self.inner.lane.hint_head(last);
    }
}
