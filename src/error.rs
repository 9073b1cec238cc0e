//! The one error type of ordo's public surface.

use std::sync::Arc;

use crate::position::{EventSequence, Ordering};
mod text;

pub(crate) use text::failure_text;
use text::{describe, migrate_reason};

/// Everything that can go wrong in ordo.
///
/// Variants are named for the cause, and their messages name the table, position or setting
/// involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database refused or failed a statement, or the connection was lost.
    #[error("database error: {}", describe(.0))]
    Database(#[source] sqlx::Error),

    /// Running ordo's migrations failed.
    #[error("migrating the ordo schema failed: {}", migrate_reason(.0))]
    Migrate(#[from] sqlx::migrate::MigrateError),

    /// A payload or header map could not be serialised to JSON at publish time.
    #[error("could not serialise an event for ordo.events: {0}")]
    Encode(#[source] serde_json::Error),

    /// The payload stored at `sequence` does not decode as the outbox's payload type. The
    /// listener goes on with the next event.
    #[error("the payload of ordo.events sequence {sequence} does not decode: {source}")]
    UndecodablePayload {
        /// The event whose payload failed to decode.
        sequence: EventSequence,
        /// What serde said.
        #[source]
        source: Arc<serde_json::Error>,
    },

    /// The value stored in `ordo.latest_values` for `event_type` does not decode as the
    /// latest-value stream's type. The stream goes on.
    #[error(
        "the latest value of {event_type:?} (version {version}) in ordo.latest_values does not decode: {source}"
    )]
    UndecodableLatest {
        /// The event type.
        event_type: String,
        /// The version that failed to decode.
        version: u64,
        /// What serde said.
        #[source]
        source: Arc<serde_json::Error>,
    },

    /// The pool given for `part` reaches PostgreSQL through a transaction-mode pooler
    /// (PgBouncer's `pool_mode = transaction`), where each transaction may run on another
    /// server connection: `part` needs a session of its own (`LISTEN`, session settings,
    /// advisory locks, prepared statements). `fix` says where to get one. See
    /// `docs/operations.md`, "Connection poolers".
    #[error(
        "{part} reaches PostgreSQL through a transaction-mode pooler (PgBouncer pool_mode = transaction), where it cannot keep a session: {fix}"
    )]
    TransactionPooler {
        /// What needs the session.
        part: &'static str,
        /// The setting or connection that gives it one.
        fix: &'static str,
    },

    /// A configuration value is out of range, or two settings contradict each other.
    #[error("invalid ordo configuration: {setting}: {reason}")]
    InvalidConfig {
        /// The setting (or settings) at fault.
        setting: &'static str,
        /// Why it is refused, and what would be accepted.
        reason: String,
    },

    /// A row the lane had already resolved is missing from `ordo.events` (deleted by hand, or
    /// dropped by retention), so the listener cannot continue without a hole.
    #[error(
        "ordo.events has no row at sequence {missing} although the insert lane resolved it; was it deleted?"
    )]
    MissingHistory {
        /// The first sequence that could not be read.
        missing: EventSequence,
    },

    /// The commit log has no row at a position at or below its head, or a log row's event is
    /// gone from `ordo.events`.
    #[error("ordo.commit_log has no readable row at commit sequence {missing}")]
    MissingCommitLog {
        /// The first commit sequence that could not be read.
        missing: crate::position::CommitSequence,
    },

    /// A subscription is stored on one lane and was started on the other. Switching lanes
    /// would replay or skip events, so it is refused: use a new subscription name.
    #[error(
        "subscription {subscription:?} is stored on the {stored} lane but was started on the {requested} lane; use a new name to switch lanes"
    )]
    LaneMismatch {
        /// The subscription's name.
        subscription: String,
        /// The lane in `ordo.subscriptions`.
        stored: Ordering,
        /// The lane in the [`JobConfig`](crate::JobConfig).
        requested: Ordering,
    },

    /// A row of `ordo.subscriptions` belongs to the other kind: a relay was started under the
    /// name of a subscription, or the reverse. Each would move the other's position (the
    /// other never sees the events it passes), so it is refused: use another name.
    #[error(
        "{subscription:?} in ordo.subscriptions is a {stored}, and a {requested} may not run it (it would move the {stored}'s position); use another name"
    )]
    KindMismatch {
        /// The row's name.
        subscription: String,
        /// What the row is: `subscription` or `relay`.
        stored: String,
        /// What was started on it: `subscription` or `relay`.
        requested: &'static str,
    },

    /// A row of `ordo.subscriptions` is run by another database role, which the connected
    /// role does not act as (it is not that role, nor inherits its privileges): row security
    /// lets it neither claim the row nor move its position.
    #[error(
        "{subscription:?} in ordo.subscriptions is run by role {owner:?}, and role {connected:?} may not write it; use another name, or run it as {owner:?} (GRANT {owner:?} TO {connected:?} if the two are one application)"
    )]
    NotOwnRow {
        /// The row's name.
        subscription: String,
        /// The role that runs it (`ordo.subscriptions.role`).
        owner: String,
        /// The role of this connection (`current_user`).
        connected: String,
    },

    /// A row created before ordo recorded the role that runs each row (a subscription or
    /// relay in `ordo.subscriptions`, an inbox consumer in `ordo.inbox_consumers`), which a
    /// role that does not bypass row security may not take for itself: any role could then
    /// take any such row. What to do: an operator assigns it to the role that runs it, with
    /// the command in `adopt` (`admin::adopt_subscription`, `inbox::adopt_consumer`).
    #[error(
        "{name:?} in {table} was created before ordo recorded the role that runs it, and role {connected:?} may not adopt it; an operator assigns it: `{adopt}`"
    )]
    Unadopted {
        /// The row's name (the subscription, relay or inbox consumer).
        name: String,
        /// Where it is: `ordo.subscriptions` or `ordo.inbox_consumers`.
        table: &'static str,
        /// The role of this connection (`current_user`).
        connected: String,
        /// The operator's command that assigns it to this role.
        adopt: String,
    },

    /// An inbox consumer name belongs to another database role (`ordo.inbox_consumers`, the
    /// first role that received for it), which the connected role does not act as: row
    /// security lets it write none of that consumer's rows in `ordo.inbox` or
    /// `ordo.inbox_watermarks`.
    #[error(
        "inbox consumer {consumer:?} belongs to role {owner:?} (ordo.inbox_consumers), and role {connected:?} may not receive for it; use another consumer name, or run it as {owner:?} (GRANT {owner:?} TO {connected:?} if the two are one application)"
    )]
    NotOwnInbox {
        /// The consumer name.
        consumer: String,
        /// The role it belongs to.
        owner: String,
        /// The role of this connection (`current_user`).
        connected: String,
    },

    /// No subscription of that name exists in `ordo.subscriptions`.
    #[error(
        "no subscription or relay named {name:?} in ordo.subscriptions (`ordo subscriptions` lists them)"
    )]
    UnknownSubscription {
        /// The name asked for.
        name: String,
    },

    /// No stalled event (a relay's parked one) of that subscription or relay holds that key.
    #[error(
        "no stalled event of {subscription:?} holds key {key:?} (`ordo subscriptions stalled {subscription}`, or `ordo relay parked {subscription}`, lists its keys)"
    )]
    UnknownStalledKey {
        /// The subscription or relay.
        subscription: String,
        /// The key asked for.
        key: String,
    },

    /// A lane was read below what retention keeps: those partitions were dropped.
    #[error(
        "the {lane} lane was read from position {requested}, below the retention floor {floor}: retention dropped those events"
    )]
    BelowRetentionFloor {
        /// The lane read.
        lane: Ordering,
        /// The position asked for.
        requested: u64,
        /// The lowest position still readable.
        floor: u64,
    },

    /// A partition of `ordo.events` has a bound that is not a range of sequences (one ordo
    /// did not make), so retention cannot tell which events it holds and stops rather than
    /// guess. What to do: detach or drop that partition, or attach it with a range bound.
    #[error(
        "partition ordo.{partition} of ordo.events has a bound ordo does not understand: {bound}; ordo partitions by ranges of sequence (FROM (a) TO (b)): detach it or attach it with such a range"
    )]
    UnreadablePartitionBound {
        /// The partition's name.
        partition: String,
        /// Its bound, as `pg_get_expr` prints it.
        bound: String,
    },

    /// The outbox was shut down; its listeners end and new work is refused.
    #[error("the ordo outbox has been shut down")]
    Shutdown,

    /// The database went back in time under this outbox: it no longer holds events this
    /// process's lanes had already passed (the events sequence is below the insert lane's
    /// frontier, or an event this process saw in the commit log is gone), after a failover
    /// to a standby that had not received the
    /// last transactions, a crash that lost commits made with `synchronous_commit = off`, a
    /// restore. The outbox's listeners end with this error (their events past that point are
    /// gone from the server, and its positions will be given to other events); `begin` and
    /// `publish_in` return it while the lanes stop. Then, by default
    /// ([`OnRewind::Resume`](crate::OnRewind::Resume)), the outbox starts its lanes again from
    /// what the server holds: listen again to follow it; subscriptions and relays go on from
    /// their positions stored there. Under [`OnRewind::Stop`](crate::OnRewind::Stop) it stays
    /// stopped. `docs/operations.md`, "Failover".
    #[error(
        "the database went back in time under this outbox ({what}): a failover to a standby that lacked the last transactions, a crash that lost commits, or a restore; events this process read past that point are gone from the server and their positions will be given to other events; every listener of this outbox ends here (listen again to follow what the server holds), and the outbox starts again from what the server holds unless OutboxConfig::on_rewind says to stop (until then, begin, publish_in, subscribe and relay return this error: try again)"
    )]
    ServerRewound {
        /// What showed it.
        what: String,
    },

    /// A relation of the `ordo` schema does not exist: the database was never migrated (or
    /// only partly).
    #[error(
        "{relation} does not exist: the ordo schema is not migrated in this database; run `ordo migrate` (or `ordo::migrate(&pool)`) first"
    )]
    NotMigrated {
        /// The missing relation or schema, as PostgreSQL named it.
        relation: String,
        /// What PostgreSQL said.
        #[source]
        source: sqlx::Error,
    },

    /// The database was migrated by a newer version of ordo than this one: its schema may
    /// differ from what this version reads and writes, so it is refused.
    #[error(
        "the ordo schema in this database is at migration {database}, newer than the newest this version of ordo knows ({known}): it was migrated by a newer ordo; run that version (or newer) against it"
    )]
    SchemaTooNew {
        /// The newest migration recorded in `ordo._sqlx_migrations`.
        database: i64,
        /// The newest migration this build embeds.
        known: i64,
    },

    /// `COMMIT` was sent but its answer was lost (the connection broke), and the server could
    /// not be asked in time whether transaction `xid` committed (it was unreachable, or the
    /// transaction was still in progress). The transaction, its domain writes and its events
    /// may or may not be stored. **Do not retry blindly**: a retry after a commit that did take
    /// effect publishes every event twice.
    ///
    /// What to do: ask [`Outbox::commit_status`](crate::Outbox::commit_status)`(xid,
    /// &event_ids)`, with both fields of this error, later or with a backoff, until it answers
    /// - [`Committed`](crate::CommitStatus::Committed): done; the events are stored and every
    ///   listener gets them once. Do not retry.
    /// - [`Aborted`](crate::CommitStatus::Aborted): nothing was stored (it rolled back, or a
    ///   failover to a standby that never received it took it out of the server's history);
    ///   run the whole transaction again. Republish the same `event_ids` with
    ///   [`publish_with_id`](crate::OutboxTransaction::publish_with_id), so that consumers that
    ///   deduplicate by id would also absorb a mistaken second copy.
    /// - [`InProgress`](crate::CommitStatus::InProgress), or an error (the server still
    ///   unreachable): ask again; never retry meanwhile.
    ///
    /// The event ids are what make the answer right across a failover: a promoted standby
    /// that never received this transaction gives `xid` to a transaction of its own, so the
    /// server's word on `xid` alone (`pg_xact_status`) can say committed for events it does not
    /// hold. If the `xid` was lost too (a crash), [`Outbox::published`](crate::Outbox::published)
    /// tells which of `event_ids` are stored, once the transaction can no longer be in
    /// progress.
    #[error(
        "the COMMIT of transaction {xid} ({} events) may or may not have taken effect: the connection was lost ({source}) and the server could not be asked; do not retry yet: ask Outbox::commit_status({xid}, &event_ids) with this error's event_ids until it says Committed (done) or Aborted (retry with the same ids)",
        event_ids.len()
    )]
    CommitInDoubt {
        /// The transaction's id (`ordo.events.commit_xid` of its events).
        xid: i64,
        /// The ids of the events it published, in publish order.
        event_ids: Vec<uuid::Uuid>,
        /// How the commit failed.
        #[source]
        source: sqlx::Error,
    },

    /// A wait for the lanes or a subscription to reach what a writer committed did not end
    /// within its limit. What to do: check `ordo status` (a stall names what holds the lane; a
    /// subscription may be paused, halted or run by no process).
    #[error("waited {waited:?} for {what}; it was not reached (see `ordo status`)")]
    WaitTimedOut {
        /// What was awaited, in words.
        what: String,
        /// How long.
        waited: std::time::Duration,
    },

    /// A subscription that a wait depends on is halted (or paused) and will not get there by
    /// itself. What to do: `ordo subscriptions resume NAME` once its `last_error` is dealt with.
    #[error("subscription {name:?} is {status}: {}", last_error.as_deref().unwrap_or("no error recorded"))]
    SubscriptionNotRunning {
        /// The subscription.
        name: String,
        /// Its stored status (`halted` or `paused`).
        status: String,
        /// Its last handler error, if any.
        last_error: Option<String>,
    },

    /// [`grant`](crate::admin::grant) refused a role: it does not exist, privileges cannot restrict
    /// it (a superuser, or the owner of ordo's tables), or ordo's owner is a superuser (an
    /// operator would become one). The database's message and hint are in `reason`.
    #[error("cannot make role {role:?} an ordo {kind}: {reason}")]
    Grant {
        /// The role named.
        role: String,
        /// `writer`, `reader` or `operator`.
        kind: &'static str,
        /// Why, and what to do.
        reason: String,
    },

    /// The commit log ends below a head this process already saw. The sequencer commits its
    /// appends asynchronously, so a server crash can lose the last ones after they were seen;
    /// they are folded again, identically. A listener waits for that (it retries, and never
    /// yields this error); it is not a deleted row.
    #[error(
        "ordo.commit_log ends at {durable}, below commit sequence {missing} seen before a server crash; waiting for the sequencer to fold it again"
    )]
    CommitLogBehind {
        /// The first commit sequence that could not be read.
        missing: crate::position::CommitSequence,
        /// `last_commit_seq` in `ordo.sequencer_state` now.
        durable: crate::position::CommitSequence,
    },

    /// A reset was given a position of the other lane than the subscription's.
    #[error(
        "subscription {subscription:?} runs on the {lane} lane but was given a {given} position; pass Position::{expected}"
    )]
    PositionLaneMismatch {
        /// The subscription's name.
        subscription: String,
        /// The lane stored in `ordo.subscriptions`.
        lane: Ordering,
        /// The lane of the position given.
        given: Ordering,
        /// The position type the lane takes, e.g. `Insert(EventSequence)`.
        expected: &'static str,
    },

    /// A reset would move a subscription past its lane's head, silently skipping every event
    /// written up to the target.
    #[error(
        "refusing to move subscription {subscription:?} to position {to}: the head of the {lane} lane is {head}, so the next {skipped} events would be skipped unseen; pass a position at or below {head}, or force it (`--force`) if skipping them is intended"
    )]
    PastHead {
        /// The subscription's name.
        subscription: String,
        /// The subscription's lane.
        lane: Ordering,
        /// The position asked for.
        to: u64,
        /// The lane's head when the reset was refused.
        head: u64,
        /// `to - head`.
        skipped: u64,
    },

    /// An event was asked for at a position past its lane's head: nothing is there yet.
    #[error(
        "no event at {lane} position {position} of {subscription:?}: the {lane} lane ends at {head} (`ordo relay parked {subscription}` lists the positions that wait)"
    )]
    BeyondHead {
        /// The relay (or subscription) asked about.
        subscription: String,
        /// Its lane.
        lane: Ordering,
        /// The position asked for.
        position: u64,
        /// The lane's head when asked.
        head: u64,
    },

    /// The subscription is held by a live runner, so deleting it is refused.
    #[error(
        "subscription {name:?} is held by runner {owner} until {expires_at}: shut that runner down first, or force the delete (`--force`); a runner whose row is gone stands by"
    )]
    SubscriptionLeased {
        /// The subscription's name.
        name: String,
        /// The runner holding the lease.
        owner: uuid::Uuid,
        /// When its lease runs out unless renewed.
        expires_at: chrono::DateTime<chrono::Utc>,
    },

    /// No dead letter with that id exists in `ordo.dead_letters`.
    #[error(
        "no dead letter with id {id} in ordo.dead_letters (`ordo dead-letters list` shows them)"
    )]
    UnknownDeadLetter {
        /// The id asked for.
        id: i64,
    },

    /// An inbox was handed a message it cannot store or deduplicate (an empty or over-long id
    /// or source, or a watermark-mode message without a source and position). Fix the
    /// transport's mapping; retrying the same message fails the same way.
    #[error("inbox consumer {consumer:?} refused message {id:?}: {reason}")]
    InvalidInboxMessage {
        /// The inbox consumer.
        consumer: String,
        /// The message's id (cut to 200 characters).
        id: String,
        /// What is wrong, and what is accepted.
        reason: String,
    },

    /// An inbox's broker adapter could not set up its side of the broker: connect, find the
    /// stream or queue, create or bind its consumer. Nothing was received. (Once running, an
    /// adapter reconnects by itself; this is what it cannot get past at start.)
    #[error("inbox adapter: {broker} at {at}: {reason}")]
    Broker {
        /// `nats` or `rabbitmq`.
        broker: &'static str,
        /// The server, its password redacted.
        at: String,
        /// What failed, and what to check.
        reason: String,
    },

    /// No row of `ordo.inbox` or `ordo.inbox_watermarks` is of that consumer: a typo, the
    /// wrong database, or a consumer that has not received a message yet.
    #[error(
        "no inbox consumer {consumer:?}: neither ordo.inbox nor ordo.inbox_watermarks has a row of it (`ordo inbox` lists the consumers)"
    )]
    UnknownConsumer {
        /// The consumer asked for.
        consumer: String,
    },

    /// No failed message with that id in `ordo.inbox` (of that consumer, when one was named).
    #[error(
        "no failed message {id:?} in ordo.inbox{}: `ordo inbox failed` lists them",
        consumer.as_deref().map(|c| format!(" for consumer {c:?}")).unwrap_or_default()
    )]
    UnknownInboxMessage {
        /// The message id asked for.
        id: String,
        /// The consumer asked for, if any.
        consumer: Option<String>,
    },
}

impl Error {
    /// `Err(InvalidConfig)` for `setting`, for the config validators.
    pub(crate) fn invalid_config<T>(setting: &'static str, reason: &str) -> Result<T> {
        Err(Error::InvalidConfig {
            setting,
            reason: reason.to_owned(),
        })
    }
}

/// `Result` with ordo's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
