//! [`Outbox`]: the handle an application holds.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{PgPool, Postgres, Transaction};
use tokio::sync::{mpsc, watch};

use super::insert::{self, Buffered};
use super::notifier;
use super::transaction::OutboxTransaction;
use crate::commit_lane::listener::{self as commit_listener, CommitReader, CommitStream};
use crate::commit_lane::sequencer::Sequencer;
use crate::commit_lane::{CommitShared, HEAD_SQL, watcher};
use crate::config::OutboxConfig;
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
    /// # Errors
    /// [`Error::InvalidConfig`] for a contradictory `config`; [`Error::Database`] if the table
    /// cannot be read (for instance, the schema was not migrated).
    pub async fn new(pool: PgPool, config: OutboxConfig) -> Result<Self> {
        config.validate()?;
        let frontier = rows::initial_frontier(&pool).await?;
        let lane = Arc::new(LaneShared::new(
            pool.clone(),
            frontier,
            config.cache_capacity,
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
    /// processes on their next wake-up or resync.
    ///
    /// **Causal order caveat.** The commit lane orders transactions by their lowest sequence,
    /// which is causal only if a transaction inserts its events *after* every read it makes.
    /// Call `publish_in` last, right before committing, as [`OutboxTransaction::commit`] does.
    ///
    /// # Errors
    /// [`Error::Encode`] if an event does not serialise; [`Error::Database`] if the insert
    /// fails (the caller's transaction is then aborted, as with any failed statement).
    pub async fn publish_in(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        events: impl IntoIterator<Item = P>,
    ) -> Result<Vec<EventSequence>> {
        let buffered = events
            .into_iter()
            .map(|event| Buffered::new(event, Headers::new()))
            .collect::<Result<Vec<_>>>()?;
        if buffered.is_empty() {
            return Ok(Vec::new());
        }
        let rows = insert::insert(tx, &buffered).await?;
        let sequences = insert::sequences(&rows);
        metrics::counter!(m::EVENTS_PUBLISHED).increment(sequences.len() as u64);
        if let Some(last) = sequences.last() {
            self.inner.lane.hint_head(last.get());
        }
        Ok(sequences)
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
        listener::stream(reader, TypeFilter::default())
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
        listener::stream(reader, TypeFilter::only(types))
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
    /// [`status`](crate::status) on this outbox's pool; made for health endpoints.
    ///
    /// # Errors
    /// [`Error::Database`] if a query fails.
    pub async fn status(&self) -> Result<crate::OutboxStatus> {
        crate::status(&self.inner.pool).await
    }

    /// Stops the background tasks, each after the step in hand, and ends every listener
    /// stream. Idempotent; also started (without waiting) when the last clone is dropped.
    pub async fn shutdown(&self) {
        self.inner.tasks.stop(SHUTDOWN_GRACE).await;
    }

    /// Hands events this process just committed to its own lane, and wakes other processes.
    pub(crate) fn committed(&self, slots: Vec<Slot<P>>) {
        let Some(last) = slots.last().map(|slot| slot.sequence) else {
            return;
        };
        metrics::counter!(m::EVENTS_PUBLISHED).increment(slots.len() as u64);
        // A send error means the frontier task has stopped; the table still has the events.
        let _ = self.inner.commits.send(slots);
        self.inner.committed.send_if_modified(|sent| {
            let newer = last > *sent;
            if newer {
                *sent = last;
            }
            newer
        });
    }
}
