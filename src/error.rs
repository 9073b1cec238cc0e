//! The one error type of ordo's public surface.

use std::sync::Arc;

use crate::position::EventSequence;

/// Everything that can go wrong in ordo.
///
/// Variants are named for the cause, and their messages name the table, position or setting
/// involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database refused or failed a statement, or the connection was lost.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),

    /// Running ordo's migrations failed.
    #[error("migrating the ordo schema failed: {0}")]
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
        stored: String,
        /// The lane in the [`JobConfig`](crate::JobConfig).
        requested: &'static str,
    },

    /// No subscription of that name exists in `ordo.subscriptions`.
    #[error("no subscription named {name:?} in ordo.subscriptions")]
    UnknownSubscription {
        /// The name asked for.
        name: String,
    },

    /// A lane was read below what retention keeps: those partitions were dropped.
    #[error(
        "the {lane} lane was read from position {requested}, below the retention floor {floor}: retention dropped those events"
    )]
    BelowRetentionFloor {
        /// `insert` or `commit`.
        lane: &'static str,
        /// The position asked for.
        requested: u64,
        /// The lowest position still readable.
        floor: u64,
    },

    /// The outbox was shut down; its listeners end and new work is refused.
    #[error("the ordo outbox has been shut down")]
    Shutdown,

    /// A reset was given a position of the other lane than the subscription's.
    #[error(
        "subscription {subscription:?} runs on the {lane} lane but was given a {given} position; pass Position::{expected}"
    )]
    PositionLaneMismatch {
        /// The subscription's name.
        subscription: String,
        /// The lane stored in `ordo.subscriptions`.
        lane: String,
        /// The lane of the position given.
        given: &'static str,
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
        /// `insert` or `commit`.
        lane: String,
        /// The position asked for.
        to: u64,
        /// The lane's head when the reset was refused.
        head: u64,
        /// `to - head`.
        skipped: u64,
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
