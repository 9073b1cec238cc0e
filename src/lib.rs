//! # ordo: a PostgreSQL table as a reliable, ordered event stream
//!
//! ordo is the transactional outbox done right. Application transactions publish events into
//! `ordo.events` in the same transaction as their domain writes; ordo turns that table into two
//! ordered streams that lose nothing, repeat nothing and never skip a late commit.
//!
//! ## Concepts
//!
//! - **Publishing.** [`Outbox::begin`] opens a transaction ([`OutboxTransaction`], which derefs
//!   to the connection for your domain writes). [`OutboxTransaction::publish`] buffers an event;
//!   [`OutboxTransaction::commit`] inserts every buffered event in one statement (bounded
//!   chunks for a very large transaction) and commits.
//!   Rollback, or dropping the transaction, publishes nothing. [`Outbox::publish_in`] writes
//!   into a `sqlx::Transaction` you own. Any SQL client can publish too:
//!   `INSERT INTO ordo.events (payload) VALUES ('{"k": 1}')` is a valid event.
//! - **The insert-ordered lane** ([`Outbox::listen_inserted`]): committed events in
//!   [`EventSequence`] order. Sequences are drawn before commit, so transactions commit out of
//!   order and rolled-back ones leave holes. The lane never passes a hole until it is
//!   *resolved*: its row becomes visible, or it is proven that no transaction can ever commit
//!   it (every transaction that was running when the hole was seen has ended), in which case a
//!   placeholder row (NULL payload, NULL `commit_xid`) is written so that every process agrees.
//!   There is no timer that skips.
//! - **The commit-ordered lane** ([`Outbox::listen_committed`]): a dense log (the view
//!   `ordo.commit_log`, [`CommitSequence`] 1, 2, 3, …) in which every source transaction's
//!   events are contiguous, in insert order, the last one flagged as a `boundary`. An
//!   in-process *sequencer* folds the insert lane into the log, appending under a
//!   compare-and-set on the one row of `ordo.sequencer_state`; every [`Outbox`] runs one by
//!   default, any number may run at once, and the log is the same as if one had (a sequencer
//!   that loses the compare-and-set takes in what the winner appended and goes on). The log is
//!   stored as one row per append (`ordo.commit_chunks`, arrays of at most 1,024 entries), so
//!   under load it writes a few bytes per event; plain SQL reads it through the view, or a
//!   range of it with `SELECT * FROM ordo.commit_log_range(after, upto)`.
//! - **Envelopes.** Listeners receive `Arc`-shared [`Envelope`]s (id, sequence, `commit_xid`,
//!   payload, headers, `recorded_at`): one allocation per event per process, however many
//!   listeners.
//!
//! - **Event types.** One event enum per service: each variant is a type, stored in
//!   `ordo.events.event_type` ([`Envelope::event_type`]). Publishing reads it from the
//!   payload's serde tag (an externally tagged enum's variant name, or an object's string
//!   field `type`; otherwise untyped, NULL); [`OutboxTransaction::publish_typed`] sets it, and
//!   plain SQL may set the column. [`JobConfig::event_types`] and
//!   [`Outbox::listen_inserted_types`] select types: the others are skipped before their
//!   payload is decoded, so a foreign row never fails a typed consumer. Untyped events are
//!   handed on unless [`JobConfig::skip_untyped`].
//!
//! - **Latest values** ([`Outbox::publish_latest`], [`Outbox::latest`]): an exchange rate, the
//!   feature flags: one row per type in `ordo.latest_values`, overwritten by each publish
//!   (alone, in an [`OutboxTransaction`], or in your transaction), with a `version` that grows
//!   by one per committed publish. A [`LatestStream`] in any process gets the current value of
//!   each type it selects, then every newer one (it may skip versions, never go back). Nothing
//!   of it enters `ordo.events` or the commit log. See `docs/latest-values.md`.
//! - **Durable subscriptions** ([`Outbox::subscribe`]): a named [`Subscriber`] whose handler
//!   runs in a transaction that also moves the subscription's position in
//!   `ordo.subscriptions`, so its database effects happen exactly once. One process runs a
//!   subscription at a time under a lease; a runner that lost its lease cannot commit. Failures
//!   are retried ([`RetryPolicy`]) and then halt the subscription or dead-letter the event
//!   ([`OnExhaustion`]); [`JobConfig`] chooses the lane, batching and start. A **keyed**
//!   subscription ([`JobConfig::keyed`], [`Subscriber::keys`]) orders events per key only and
//!   runs events of different keys concurrently; a failing event holds only its own keys
//!   ([`StalledKey`]). See `docs/keyed-subscriptions.md` for the exact guarantee.
//! - **The consumer inbox** ([`Inbox`], module [`inbox`]): the receiving side. Messages from a
//!   broker, an endpoint or another ordo's relay are handled in a transaction that also
//!   records them (a row per message id, or a high-water mark per source for dense
//!   positions), so a redelivery is a [`Receipt::Duplicate`] and the effects happen once.
//! - **Operations** ([`admin`]): [`admin::status`] names what holds a lane (the transaction,
//!   by pid) and how far behind each consumer is; [`metrics`] lists the metrics emitted through
//!   the `metrics` facade; [`admin::run_retention`] drops old partitions of events with their
//!   log entries; the subscription and dead-letter functions list and steer consumers. The
//!   `ordo` CLI (feature `cli`) wraps all of it; `docs/operations.md` says what to do when a
//!   figure is bad.
//! - **Relays** ([`relay`]): events delivered to NATS JetStream, RabbitMQ, Kafka or HTTP webhooks
//!   (each behind a cargo feature: `nats`, `rabbitmq`, `kafka`, `http`), routed by templates
//!   and framed as CloudEvents where asked, or to your own [`relay::Sink`], at
//!   least once, the event id travelling as the message id, in order per key
//!   ([`Outbox::relay`]): batches under one deadline with no transaction open, blameless
//!   expiries, parking after the attempts; `docs/relays.md` is the guide.
//! - **Roles**: [`admin::grant`] gives an application role only what it needs ([`Grants::writer`]:
//!   it cannot write `sequence` or `commit_xid`, nor create partitions), a read-only role
//!   ([`Grants::reader`]) and an operator ([`Grants::operator`], partitions and retention).
//!
//! ## What the commit order is, and is not
//!
//! Groups (the events of one transaction, identified by `commit_xid`) are ordered by their
//! **lowest** sequence. That order is *causal*: if transaction T read a row that A committed,
//! and T inserts its events after its reads, then T's sequences were all drawn after A's
//! commit, so T's group comes after A's. It is **not** a serialisation order of concurrent
//! transactions and **not** commit-timestamp order: two transactions that did not see each
//! other may appear in either order relative to when they committed.
//!
//! The write discipline it relies on: a transaction inserts its outbox rows *after* all of its
//! reads. [`OutboxTransaction::commit`] does this for you (events are buffered and inserted
//! right before `COMMIT`). With [`Outbox::publish_in`] or plain SQL, insert the events last.
//! Events written by plain SQL are otherwise first-class: they are stamped with `commit_xid`
//! by the column default, grouped and ordered like any others, and found by the lane's resync
//! (default every 100 ms) or the next wake-up.
//!
//! ## Guarantees
//!
//! - Every committed event is delivered to every insert-lane listener exactly once, in strictly
//!   increasing sequence, none missing, across lag, backfill from the table, reconnects and
//!   restarts (from a position you kept).
//! - The commit log is dense, complete (every real event exactly once, no placeholder),
//!   grouped and causal, under any number of concurrent sequencers, any of them killed at any
//!   instant (an append is one statement).
//! - Within one process, a commit reaches in-process listeners without a database round trip.
//!   Across processes, a debounced `pg_notify` wakes the others (never one per transaction,
//!   and none while no other process listens on the channel), and an idle resync finds
//!   anything a lost notification missed.
//!
//! ## Failure modes
//!
//! - A payload that does not decode as `P` is an `Err` item naming its sequence
//!   ([`Error::UndecodablePayload`]); the stream goes on.
//! - A transaction that holds a sequence open holds the lane at that sequence until it ends;
//!   that is the price of never skipping. A rolled-back hole is proven abandoned once every
//!   transaction that had drawn an event sequence when it was seen has ended (they hold a lock
//!   on the sequence until then, which `pg_locks` shows): a long transaction that never
//!   publishes, in this database or another, does not hold it up. A publishing transaction
//!   that stays open can, for at most [`OutboxConfig::gap_fill_timeout`]; then the placeholder
//!   is written under a conflict check that waits for the hole's writer if it is still alive.
//! - A commit whose answer is lost (the connection broke during `COMMIT`) is resolved by asking
//!   PostgreSQL whether the transaction committed; only when that cannot be learned does
//!   `commit` return [`Error::CommitInDoubt`], whose docs say how to retry without publishing
//!   twice ([`Outbox::commit_status`] with the error's xid and event ids, which stays right
//!   across a failover; [`OutboxTransaction::publish_with_id`]).
//! - Database errors in background tasks are logged (`tracing`) and retried with capped
//!   backoff. Listener streams retry transient failures (lost connection, server restart,
//!   pool timeout, serialization failure) at the same position and never yield them; they
//!   yield only what needs you (see [`EventStream`] for the list).
//!
//! ## Lifecycle
//!
//! [`migrate`] once; [`Outbox::new`] starts the background tasks (the insert lane's frontier,
//! the wake-up listener and notifier, the sequencer, the partition maintainer);
//! [`Outbox::shutdown`] stops the subscriptions first (each finishes the handler in hand, within
//! its lease, and releases its lease), then the background tasks, and ends the listener streams.
//! Dropping the last clone of an `Outbox` also stops them.
//!
//! ## Example
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use futures::StreamExt;
//! use ordo::{Outbox, OutboxConfig, Start};
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct OrderPlaced { order_id: i64 }
//!
//! let pool = sqlx::PgPool::connect("postgres://localhost/app").await?;
//! ordo::migrate(&pool).await?;
//! let outbox = Outbox::<OrderPlaced>::new(pool, OutboxConfig::default()).await?;
//! let mut by_commit = outbox.listen_committed(Start::Beginning);
//!
//! let mut tx = outbox.begin().await?;
//! sqlx::query("UPDATE orders SET placed = true WHERE id = 7").execute(&mut *tx).await?;
//! tx.publish(OrderPlaced { order_id: 7 })?;
//! tx.commit().await?;
//!
//! while let Some(item) = by_commit.next().await {
//!     let item = item?;
//!     println!("{} {} boundary={}", item.commit_sequence, item.event.payload.order_id, item.boundary);
//! }
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
// docs.rs builds with every feature and `--cfg docsrs` (Cargo.toml, `package.metadata.docs.rs`):
// each feature-gated item then says which feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

mod commit_lane;
mod config;
mod consumer;
mod envelope;
mod error;
mod event_type;
mod handler_error;
pub mod inbox;
mod insert_lane;
mod latest;
mod listen;
mod listener;
mod migrate;
mod ops;
mod outbox;
mod pooler;
mod position;
pub mod relay;
mod schema;
mod subscription;
mod task;
mod telemetry;
mod wire;
mod write;

pub use commit_lane::listener::CommitStream;
pub use config::{
    MAX_AHEAD, MAX_GAP_FILL_TIMEOUT, MAX_MAINTENANCE_INTERVAL, MAX_RESYNC_INTERVAL, MAX_RETRY_FOR,
    MIN_POOL_CONNECTIONS, OnRewind, OutboxConfig, RetentionConfig,
};
pub use consumer::{
    BacklogSize, DEFAULT_KEYED_WINDOW, DeadLetterCount, Keys, MAX_LEASE, MIN_LEASE, RunStatus,
    SERIAL_KEY, SinkDown, StalledKey, StartFrom, SubscriptionHandle, SubscriptionState,
    SubscriptionStatus,
};
pub use envelope::{CommitOrderedEnvelope, Envelope, Headers};
pub use error::{Error, Result};
pub use handler_error::HandlerError;
pub use inbox::{Inbox, InboxConfig, InboxHandler, InboxMessage, InboxMode, Receipt};
pub use insert_lane::listener::EventStream;
pub use latest::{Latest, LatestStream};
pub use migrate::{MIGRATIONS_TABLE, migrate, migrator};
pub use ops::grants::{Grants, RoleKind};
#[doc(hidden)]
pub use ops::plans::hot_path_statements;
pub use ops::retention::{PartitionInfo, RetentionReport};
pub use ops::secrets::{ScrubReport, SecretKey};
pub use ops::status::{Backend, LagClock, LaneLag, OutboxStatus, PreparedTransaction, Stall};
pub use outbox::Outbox;
pub use position::{CommitSequence, EventSequence, ServerHistory, Start};
pub use subscription::{
    Batch, DeadLetter, Delivery, JobConfig, MAX_CONCURRENCY, OnExhaustion, Ordering, Position,
    RetryPolicy, Subscriber,
};
#[doc(hidden)]
pub use telemetry::HotStatement;
pub use telemetry::metrics;
pub use telemetry::trace::TRACEPARENT;
pub use write::in_doubt::CommitStatus;
pub use write::transaction::OutboxTransaction;

/// The operator's functions: what the `ordo` CLI runs, for your own tools and endpoints. Each
/// takes a pool on the database holding the `ordo` schema; none needs a running
/// [`Outbox`].
pub mod admin {
    /// Whether a pool keeps its sessions, or goes through a transaction-mode pooler.
    pub use crate::pooler::keeps_sessions;

    /// The outbox's positions, lag and stalls, naming the transactions that hold a lane.
    pub use crate::ops::status::{list_subscriptions, status};

    /// [`OutboxStatus`](crate::OutboxStatus) as Prometheus text.
    pub use crate::ops::prometheus::prometheus_text;

    /// The status, the subscriptions, dead letters, the inbox's failed messages and
    /// watermarks, the secret keys and a retention report as tables, and any text made safe
    /// for a terminal.
    pub use crate::ops::render::{
        backlog_table, dead_letters_table, inbox_failed_table, needs_escape, printable,
        retention_table, secret_keys_table, stalled_keys_table, status_table, subscriptions_table,
        watermarks_table,
    };

    /// A relay's event: whether it was delivered, and its failed attempts with their time,
    /// error, host and pid ("was this event sent, when, and why not").
    pub use crate::relay::attempts::relay_attempts;

    /// Partitions: what retention would do, and doing it.
    pub use crate::ops::retention::{plan_retention, run_retention};

    /// Secret payload keys: name them, and remove them from the events every reader passed.
    pub use crate::ops::secrets::{
        add_secret_keys, list_secret_keys, remove_secret_keys, scrub_secrets,
    };

    /// Least-privilege roles for writers, readers and operators.
    pub use crate::ops::grants::grant;

    /// Durable subscriptions: list, pause, resume, move and delete them.
    pub use crate::subscription::{
        delete_subscription, pause_subscription, reset_subscription, resume_subscription,
    };

    /// Keyed subscriptions' stalled keys: list them, retry them.
    pub use crate::consumer::{list_stalled_keys, retry_stalled_keys};

    /// Stuck keys' backlogs: what waits in them; a stalled event skipped, a key's backlog
    /// purged (both recorded).
    pub use crate::consumer::{
        BacklogAction, KeyBacklog, backlog_actions, list_backlog, purge_backlog, skip_stalled_event,
    };

    /// A subscription or relay row from before ordo recorded roles, assigned to its role.
    pub use crate::consumer::adopt_subscription;

    /// Dead letters: list, hand back to the subscription's runner, purge.
    pub use crate::subscription::{
        list_dead_letters, purge_dead_letters, retry_dead_letter, retry_dead_letters,
    };
}

/// The sqlx ordo was built with: its API takes `sqlx` types (`PgPool`, `PgConnection`,
/// `Transaction`), so build yours from this one and the versions cannot drift apart.
pub use sqlx;
