//! Outbox configuration: a `Default` with documented values and builder-style setters.

use std::time::Duration;

mod retention;
mod validate;

pub use retention::{MAX_AHEAD, MAX_RETRY_FOR, RetentionConfig};

/// The fewest connections the pool given to [`Outbox::new`](crate::Outbox::new) may allow
/// (`max_connections`): one for the application's transactions, one for the outbox's
/// background work. No background task holds a pooled connection while it waits for another,
/// so two never deadlock; more make delivery independent of open application transactions.
/// Besides its pool, an outbox opens one connection for cross-process wake-ups (`LISTEN`) and
/// up to two for its sequencer.
pub const MIN_POOL_CONNECTIONS: u32 = 2;

/// The default of [`OutboxConfig::cache_bytes`]: 64 MiB. At the default 8,192 events that is
/// 8 KiB an event, so events of ordinary size are bounded by count, and only large payloads by
/// bytes.
const DEFAULT_CACHE_BYTES: usize = 64 * 1024 * 1024;

/// The longest [`OutboxConfig::resync_interval`]: 60 s. The idle resync is what finds events
/// written by plain SQL, by crashed processes or behind a lost wake-up; a longer interval leaves
/// them undelivered that long, and the lane's look at an open hole backs off up to it.
pub const MAX_RESYNC_INTERVAL: Duration = Duration::from_secs(60);

/// The longest [`OutboxConfig::gap_fill_timeout`] (and so [`OutboxConfig::gap_grace`], which
/// must be shorter): 24 hours. A hole held longer than that is an incident to end by hand
/// (`ordo status` names its transaction), not something to wait out; past some years the
/// lane's deadline would overflow the clock's arithmetic.
pub const MAX_GAP_FILL_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// The longest [`OutboxConfig::maintenance_interval`]: 24 hours. A maintainer that runs less
/// often lets the partitions made ahead run out under a steady stream of writes (and secret
/// keys stay in stored events that long).
pub const MAX_MAINTENANCE_INTERVAL: Duration = Duration::from_secs(24 * 3600);

/// The longest [`OutboxConfig::notify_debounce`]: 1 s. A wake-up held longer than the idle
/// resync ([`OutboxConfig::resync_interval`], 100 ms by default) wakes nobody who has not
/// already looked.
const MAX_NOTIFY_DEBOUNCE: Duration = Duration::from_secs(1);

/// What an [`Outbox`](crate::Outbox) does when the database goes back in time under it
/// ([`Error::ServerRewound`](crate::Error::ServerRewound)): a failover to a standby that had not
/// received the last transactions, a crash that lost commits made with `synchronous_commit =
/// off`, a restore. Either way every listener of the outbox ends with the error (its events
/// past that point are gone from the server, and their positions will be given to other
/// events), and the gauge `ordo_server_rewound` is 1 while the outbox is stopped by it.
///
/// ```
/// use ordo::{OnRewind, OutboxConfig};
///
/// // Page someone and keep the process as it is, instead of going on by itself.
/// let config = OutboxConfig::default().on_rewind(OnRewind::Stop);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnRewind {
    /// Start the outbox's lanes again from what the server holds, as a new `Outbox` would:
    /// [`begin`](crate::Outbox::begin) works again once they run, subscriptions and relays
    /// claim again and go on from the positions stored on the server, and listeners opened
    /// from then on read the server's events. Nothing needs restarting. The default.
    #[default]
    Resume,
    /// Stop the outbox, as [`shutdown`](crate::Outbox::shutdown) does: `begin` and
    /// `publish_in` return the error from then on, subscriptions and relays stop, and a new
    /// `Outbox` (or a restart of the process) is what goes on.
    Stop,
}

/// Settings of an [`Outbox`](crate::Outbox). Every setter states its default and unit;
/// [`Outbox::new`](crate::Outbox::new) checks the relations between settings.
#[derive(Debug, Clone)]
pub struct OutboxConfig {
    pub(crate) cache_capacity: usize,
    pub(crate) cache_bytes: usize,
    pub(crate) page_size: usize,
    pub(crate) gap_grace: Duration,
    pub(crate) gap_poll: Duration,
    pub(crate) gap_fill_timeout: Duration,
    pub(crate) resync_interval: Duration,
    pub(crate) notify_debounce: Duration,
    pub(crate) notify_channel: String,
    pub(crate) cross_process_wakeups: bool,
    pub(crate) sequencer: bool,
    pub(crate) fold_batch: usize,
    pub(crate) fold_interval: Duration,
    pub(crate) retention: RetentionConfig,
    pub(crate) maintenance_interval: Duration,
    pub(crate) partition_maintenance: bool,
    pub(crate) background_pool: Option<sqlx::PgPool>,
    pub(crate) on_rewind: OnRewind,
    pub(crate) early_commit_listeners: bool,
    pub(crate) unwatched_append_spacing: Duration,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        Self {
            cache_capacity: 8_192,
            cache_bytes: DEFAULT_CACHE_BYTES,
            page_size: 2_000,
            gap_grace: Duration::from_millis(25),
            gap_poll: Duration::from_millis(2),
            gap_fill_timeout: Duration::from_secs(5),
            resync_interval: Duration::from_millis(100),
            notify_debounce: Duration::from_millis(2),
            notify_channel: "ordo_events".to_owned(),
            cross_process_wakeups: true,
            sequencer: true,
            fold_batch: 5_000,
            fold_interval: Duration::ZERO,
            retention: RetentionConfig::default(),
            maintenance_interval: Duration::from_secs(60),
            partition_maintenance: true,
            background_pool: None,
            on_rewind: OnRewind::Resume,
            early_commit_listeners: true,
            unwatched_append_spacing: Duration::from_secs(1),
        }
    }
}

impl OutboxConfig {
    /// The defaults; same as [`OutboxConfig::default`].
    pub fn new() -> Self {
        Self::default()
    }

    /// How many recent events (and placeholders) the process-wide cache keeps for listeners.
    /// A listener further behind reads from the table by pages. The cache is also bounded by
    /// [`cache_bytes`](Self::cache_bytes). Default 8,192 events.
    pub fn cache_capacity(mut self, events: usize) -> Self {
        self.cache_capacity = events;
        self
    }

    /// The most payload bytes the process-wide cache keeps, measured as the JSON text of each
    /// event's payload and headers (decoded values in memory may weigh somewhat more). The
    /// cache is bounded by this and by [`cache_capacity`](Self::cache_capacity), whichever is
    /// reached first; so are the committed events waiting above an open hole. An event larger
    /// than the whole budget is never cached: listeners read it from the table, so a few huge
    /// payloads cannot pin memory after delivery. Default 64 MiB (67,108,864 bytes); at least
    /// 1 KiB.
    pub fn cache_bytes(mut self, bytes: usize) -> Self {
        self.cache_bytes = bytes;
        self
    }

    /// Rows per page when a listener backfills from `ordo.events` and when the lane fetches new
    /// rows. Default 2,000 rows.
    pub fn page_size(mut self, rows: usize) -> Self {
        self.page_size = rows;
        self
    }

    /// How long a hole in the sequence may stay open before the lane starts proving it
    /// abandoned. Holes are normal (transactions commit out of order) and nearly all close by
    /// themselves within a commit's latency. Never a skip: after the grace the lane still waits
    /// for proof. Default 25 ms; shorter than [`gap_fill_timeout`](Self::gap_fill_timeout).
    pub fn gap_grace(mut self, grace: Duration) -> Self {
        self.gap_grace = grace;
        self
    }

    /// How often the lane looks again at an open hole (the first look; it backs off up to the
    /// resync interval). Default 2 ms; more than zero (zero would poll in a busy loop), at most
    /// [`resync_interval`](Self::resync_interval).
    pub fn gap_poll(mut self, interval: Duration) -> Self {
        self.gap_poll = interval;
        self
    }

    /// How long the abandonment proof may be held up before the lane resolves the hole by
    /// writing a placeholder anyway, which waits for the hole's writer if it is still alive.
    /// Default 5 s; longer than [`gap_grace`](Self::gap_grace), at most
    /// [`MAX_GAP_FILL_TIMEOUT`] (24 hours).
    ///
    /// The proof waits only for the transactions that had drawn an event sequence (published,
    /// or were publishing) when the hole was seen, in this database: a long transaction that
    /// never publishes, here or in another database of the server, does not hold it. What runs
    /// into this time-out is a publishing transaction that stays open (a handler that publishes
    /// and then works for long, a prepared transaction nobody finishes).
    pub fn gap_fill_timeout(mut self, timeout: Duration) -> Self {
        self.gap_fill_timeout = timeout;
        self
    }

    /// How often an idle lane polls the sequence head, so that events from plain-SQL writers,
    /// from crashed processes or behind a lost notification are found. Default 100 ms; more
    /// than zero (zero would poll in a busy loop), at most [`MAX_RESYNC_INTERVAL`] (60 s).
    pub fn resync_interval(mut self, interval: Duration) -> Self {
        self.resync_interval = interval;
        self
    }

    /// The least time between two cross-process wake-ups (`pg_notify`) sent by this process.
    /// The first commit after a quiet spell notifies at once. Default 2 ms; at most 1 s (a
    /// longer wait wakes listeners after their idle resync has already found the events).
    pub fn notify_debounce(mut self, interval: Duration) -> Self {
        self.notify_debounce = interval;
        self
    }

    /// The `LISTEN`/`NOTIFY` channel for wake-ups. Default `ordo_events`; 1 to 63 ASCII
    /// letters, digits or underscores, and not `ordo_latest` (the latest values' channel). The
    /// outbox listens on it, and on `ordo_latest` once a latest stream is open, over one
    /// connection of its own (`application_name` `ordo.listen`).
    pub fn notify_channel(mut self, channel: impl Into<String>) -> Self {
        self.notify_channel = channel.into();
        self
    }

    /// Whether this process sends and listens for cross-process wake-ups. When off, events from
    /// other processes are found by the idle resync only. Default on.
    ///
    /// A wake-up is sent only while another listener was heard on the channel within the last
    /// 3 s (every outbox says once a second that it listens); a process alone holds its
    /// wake-ups back and sends the latest as soon as someone is heard. A `LISTEN` of your own
    /// on the channel says so with `SELECT pg_notify('ordo_events', '0')` once a second. See
    /// `docs/operations.md`, "Wake-ups between processes".
    pub fn cross_process_wakeups(mut self, enabled: bool) -> Self {
        self.cross_process_wakeups = enabled;
        self
    }

    /// A pool for the outbox's background parts: the insert lane's reads, the wake-ups'
    /// `LISTEN` connection and notifier, the sequencer, the maintainer, subscriptions, relays,
    /// and the in-doubt commit checks. By default they use the pool given to
    /// [`Outbox::new`](crate::Outbox::new), which then does everything.
    ///
    /// Set it when the application's pool goes through a transaction-mode pooler (PgBouncer's
    /// `pool_mode = transaction`): give this pool a direct or session-mode connection, and keep
    /// the pooled one for [`Outbox::new`](crate::Outbox::new), whose
    /// [`begin`](crate::Outbox::begin) and [`publish_in`](crate::Outbox::publish_in) then send
    /// unnamed statements, which a transaction-mode pooler passes. Without this setting,
    /// `Outbox::new` refuses a pooled pool with
    /// [`Error::TransactionPooler`](crate::Error::TransactionPooler); it refuses a pooled pool
    /// here too. It must allow at least [`MIN_POOL_CONNECTIONS`] connections. Default: none.
    ///
    /// ```no_run
    /// # async fn run() -> ordo::Result<()> {
    /// use ordo::{Outbox, OutboxConfig};
    /// use sqlx::postgres::PgPoolOptions;
    ///
    /// // The application's pool, through PgBouncer in transaction mode.
    /// let pooled = PgPoolOptions::new().connect("postgres://app@pgbouncer:6432/shop").await?;
    /// // ordo's background parts, on the server itself.
    /// let direct = PgPoolOptions::new().max_connections(4).connect("postgres://app@db:5432/shop").await?;
    /// let config = OutboxConfig::default().background_pool(direct);
    /// let outbox = Outbox::<serde_json::Value>::new(pooled, config).await?;
    /// # Ok(()) }
    /// ```
    pub fn background_pool(mut self, pool: sqlx::PgPool) -> Self {
        self.background_pool = Some(pool);
        self
    }

    /// What the outbox does when the database goes back in time under it (a failover that lost
    /// the last transactions): start again from what the server holds ([`OnRewind::Resume`],
    /// the default) or stop ([`OnRewind::Stop`]). See `docs/operations.md`, "Failover".
    pub fn on_rewind(mut self, on_rewind: OnRewind) -> Self {
        self.on_rewind = on_rewind;
        self
    }

    /// Whether this process runs the commit-lane sequencer. Any number of processes may run it
    /// at once; turn it off only where another process (or `ordo fold`) does. Default on.
    pub fn sequencer(mut self, enabled: bool) -> Self {
        self.sequencer = enabled;
        self
    }

    /// Whether [`listen_committed`](crate::Outbox::listen_committed) streams in this process
    /// take this process's own transactions at the positions its sequencer computed for them,
    /// before the append that logs them commits. Default on.
    ///
    /// The fold is a pure function of the insert lane, so a transaction committed through
    /// [`OutboxTransaction::commit`](crate::OutboxTransaction::commit), whose events this process knows,
    /// has known positions as soon as every group before it has: the sequencer hands them on
    /// at once, and the append (its own or another process's) writes the same ones. Each is
    /// compared with what the log then holds; a difference is reported as a rewind
    /// ([`Error::ServerRewound`](crate::Error::ServerRewound)), never passed over. Measured
    /// beside the peer library, this takes the stream spacing and the append out of the
    /// listener's wait (`PERFORMANCE.md`). Off, a listener waits for the append to commit, as
    /// subscriptions and relays always do (they store positions, so they take only logged
    /// ones). Where the sequencer is off this setting has no effect.
    pub fn early_commit_listeners(mut self, enabled: bool) -> Self {
        self.early_commit_listeners = enabled;
        self
    }

    /// The least time between the starts of two of this sequencer's appends. With zero (the
    /// default) the sequencer appends as soon as it has caught up; events that commit while an
    /// append is in flight go into the next one. Under a stream of commits (see "Several
    /// processes folding" in `docs/operations.md`), with no other process folding, appends start
    /// 2 to 5 ms apart whatever this is set to (what gathers about 16 transactions at their
    /// rate), since an append costs the database about the same whatever its size. A non-zero
    /// interval coalesces a stream of small transactions into fewer appends (less database load
    /// per event) at the price of commit-lane latency: timers tick in milliseconds, so even 1 ms
    /// adds up to about 2 ms. Measured here, one writer of single-event transactions: 1 ms raised
    /// throughput from 0.60x to 0.74x of a hand-written insert and the commit lane's p99 at 500
    /// transactions/s from 0.5 ms to 2.5 ms (`docs/performance-history.md`). Default 0.
    pub fn fold_interval(mut self, interval: Duration) -> Self {
        self.fold_interval = interval;
        self
    }

    /// How far apart this sequencer's appends start while nobody waits for the log. Default
    /// 1 s; zero turns it off. At most 60 s. An append starts sooner once
    /// [`fold_batch`](Self::fold_batch) transactions have gathered, or 256 (if fewer) while a
    /// [`listen_committed`](crate::Outbox::listen_committed) stream takes early positions: a
    /// long append takes the machine just when those listeners' next transactions come.
    ///
    /// Nobody waits when no subscription, relay or `wait_for_*` call in this process reads the
    /// commit lane, every group the sequencer has planned is this process's own (so its
    /// [`listen_committed`](crate::Outbox::listen_committed) streams have it already, see
    /// [`early_commit_listeners`](Self::early_commit_listeners)), and no other process is heard
    /// on the wake-up channel ([`notify_channel`](Self::notify_channel); every outbox says
    /// there that it listens). The log is then for readers yet to come, and each append costs
    /// the database a transaction that the writers' next commits wait behind now and then:
    /// one writer back to back had a transaction p99 of 1.20 to 1.28 ms with 25 ms between
    /// appends, 0.78 to 1.06 ms with 1 s, as with the commit lane off (0.81 to 0.84 ms in the
    /// same runs; `docs/performance-history.md`, 2026-12-06). Whoever starts waiting (a subscription that claims, a listener
    /// without early positions, another process that connects) ends the spacing at once. A
    /// process that reads the log without listening on the channel (with
    /// [`cross_process_wakeups`](Self::cross_process_wakeups) off, it polls every
    /// [`resync_interval`](Self::resync_interval)) may find it this much further behind; so
    /// may `ordo status` and the metric `ordo_fold_lag_events`. With `cross_process_wakeups`
    /// off in this process, it cannot hear the others and never gathers. When the outbox shuts
    /// down, the sequencer appends what it planned.
    pub fn unwatched_append_spacing(mut self, spacing: Duration) -> Self {
        self.unwatched_append_spacing = spacing;
        self
    }

    /// How many transactions fill the sequencer's plan. A full plan does not wait out
    /// [`unwatched_append_spacing`](Self::unwatched_append_spacing), no read of the insert lane
    /// adds more than this many, and none starts during an append once the next plan is full.
    /// Default 5,000; 1 to 1,000,000.
    pub fn fold_batch(mut self, transactions: usize) -> Self {
        self.fold_batch = transactions;
        self
    }

    /// What this outbox's maintainer does every
    /// [`maintenance_interval`](Self::maintenance_interval): it keeps partitions ready ahead of
    /// the head (past the last one, events land in the default partition, which it folds back
    /// into a range partition); it drops old ones only when
    /// [`RetentionConfig::keep`](RetentionConfig::keep) is set. Default: create ahead,
    /// drop nothing.
    pub fn retention(mut self, retention: RetentionConfig) -> Self {
        self.retention = retention;
        self
    }

    /// How often the maintainer runs (also once at start): partitions (see
    /// [`retention`](Self::retention)), and the removal of
    /// [secret payload keys](crate::admin::add_secret_keys) from the events every reader has
    /// passed. Default 60 s; 100 ms to [`MAX_MAINTENANCE_INTERVAL`] (24 hours).
    pub fn maintenance_interval(mut self, interval: Duration) -> Self {
        self.maintenance_interval = interval;
        self
    }

    /// Whether this outbox's maintainer creates, folds and drops partitions. Turn it off for an
    /// application role that may not create tables (it does not own `ordo.events`); an operator
    /// role must then run `ordo retention --apply` (or [`run_retention`](crate::admin::run_retention))
    /// regularly. When off, the maintainer still watches and logs a warning when fewer than
    /// [`RetentionConfig::warn_below`](RetentionConfig::warn_below) partitions remain
    /// ahead of the head; writes never fail for want of a partition (they land in the default
    /// partition). Default on; a role refused DDL is also detected at run time and told once.
    pub fn partition_maintenance(mut self, enabled: bool) -> Self {
        self.partition_maintenance = enabled;
        self
    }
}
