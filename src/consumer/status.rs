//! [`SubscriptionStatus`]: where a subscription stands, whoever asks.
//!
//! **Why one type.** A subscription's progress is one set of facts, stored in its row of
//! `ordo.subscriptions`: its lane and position, whether it may run ([`RunStatus`]), its failed
//! attempts and last error, who holds its lease. Its runner, `ordo subscriptions` and
//! `ordo status` each report those facts, so they report them as one [`SubscriptionStatus`]
//! (a type per reader would name the lane, the position and the status three ways, and a user
//! would learn three types for one thing). What differs between readers is where they stand,
//! not what they describe: the runner knows what
//! it is doing itself ([`SubscriptionState::Standby`], `Starting`), the database knows who
//! holds the lease for every process, and only the status report measures the age of the
//! oldest unhandled event. Facts only some readers have are `Option`s, documented with the
//! reader that fills them.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::sql::Stored;
use crate::position::Ordering;
use crate::position::Position;

/// Whether a subscription may run: `ordo.subscriptions.status`, set by operators (pause,
/// resume) and by a runner that exhausts an event's attempts or finds its position below the
/// retention floor (halt).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum RunStatus {
    /// Runs (stored `active`).
    #[default]
    Active,
    /// Paused by an operator (stored `paused`): no runner handles events until it is resumed.
    Paused,
    /// Halted (stored `halted`): on an event that exhausted its attempts, or because its
    /// position is below the retention floor (retention dropped the events it needs; its last
    /// error says so). Resumable; below the floor, move it to the floor first
    /// ([`reset_subscription`](crate::admin::reset_subscription)).
    Halted,
}

impl RunStatus {
    /// The text stored in `ordo.subscriptions.status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Paused => "paused",
            Self::Halted => "halted",
        }
    }

    /// The stored text; `None` for a value ordo does not write.
    pub(crate) fn parse(stored: &str) -> Option<Self> {
        match stored {
            "active" => Some(Self::Active),
            "paused" => Some(Self::Paused),
            "halted" => Some(Self::Halted),
            _ => None,
        }
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Stored as `text` (`ordo.subscriptions.status`, whose CHECK admits these three); any other
/// text fails to decode rather than pass for one of them.
impl sqlx::Type<sqlx::Postgres> for RunStatus {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <String as sqlx::Type<sqlx::Postgres>>::type_info()
    }

    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <String as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

impl sqlx::Decode<'_, sqlx::Postgres> for RunStatus {
    fn decode(value: sqlx::postgres::PgValueRef<'_>) -> Result<Self, sqlx::error::BoxDynError> {
        let text = <&str as sqlx::Decode<'_, sqlx::Postgres>>::decode(value)?;
        Self::parse(text).ok_or_else(|| {
            format!("ordo.subscriptions.status {text:?} is none of active, paused, halted").into()
        })
    }
}

impl sqlx::Encode<'_, sqlx::Postgres> for RunStatus {
    fn encode_by_ref(
        &self,
        buf: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        <&str as sqlx::Encode<'_, sqlx::Postgres>>::encode_by_ref(&self.as_str(), buf)
    }
}

/// What is happening to a subscription, as its reader can tell: a
/// [`SubscriptionHandle`](crate::SubscriptionHandle) tells what its own runner does; the
/// database ([`list_subscriptions`](crate::admin::list_subscriptions), [`status`](crate::admin::status))
/// tells `Running`, `Stopped`, `Paused` or `Halted`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SubscriptionState {
    /// Claiming the subscription (a handle's runner, before its first claim).
    Starting,
    /// Handling events (or waiting for them) under a live lease: a handle's own runner, or,
    /// read from the database, some runner.
    Running,
    /// Another process holds the lease; this handle's runner takes over if it expires.
    Standby,
    /// An operator paused it (`ordo subscriptions pause`).
    Paused,
    /// Halted on an event that exhausted its attempts, or below the retention floor (see
    /// [`RunStatus::Halted`]); resumable.
    Halted,
    /// No runner runs it: a handle's runner shut down or, read from the database, the
    /// subscription is active and no process holds a live lease on it.
    Stopped,
}

impl SubscriptionState {
    /// The state the database tells: the stored switch, then whether a live lease is held.
    pub(crate) fn stored(status: RunStatus, leased: bool) -> Self {
        match status {
            RunStatus::Paused => Self::Paused,
            RunStatus::Halted => Self::Halted,
            RunStatus::Active if leased => Self::Running,
            RunStatus::Active => Self::Stopped,
        }
    }
}

/// Where a subscription stands. Three readers report it:
///
/// - [`SubscriptionHandle::status`](crate::SubscriptionHandle::status): this process's runner,
///   live and free (no query); its lag is against this process's view of the lane head, its
///   [`state`](Self::state) is what that runner does.
/// - [`list_subscriptions`](crate::admin::list_subscriptions) (`ordo subscriptions`) and
///   [`status`](crate::admin::status) (`ordo status`): every subscription, from the database;
///   the state says whether some runner holds a live lease, and they add what only the
///   database knows (the oldest unhandled event's age, dead letters).
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct SubscriptionStatus {
    /// The subscription's name.
    pub name: String,
    /// Its lane (printed `insert` or `commit`).
    pub lane: Ordering,
    /// Everything at or below this position has been handled and checkpointed.
    pub position: Position,
    /// Positions between the checkpoint and the lane's head (for the insert lane, the highest
    /// stored sequence; placeholders count). From a handle, against this process's view of the
    /// head.
    pub lag: u64,
    /// What is happening to it.
    pub state: SubscriptionState,
    /// Whether it may run, as stored. From a handle, as of its runner's last claim or renewal.
    pub status: RunStatus,
    /// Failed attempts on the current event.
    pub attempts: u32,
    /// The last handler error, if the current event has failed.
    pub last_error: Option<String>,
    /// The runner holding the lease (a random id per runner), if any holds it; from a handle,
    /// its own runner's id while it holds the lease.
    pub lease_owner: Option<Uuid>,
    /// When that lease runs out (past once expired). From a handle, as its runner last
    /// extended it, by this machine's clock.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// Seconds since the first event it has not handled was committed (or recorded). The
    /// database readers measure it; `None` from a handle, and when every event is handled.
    pub oldest_unprocessed_seconds: Option<f64>,
    /// A keyed subscription's stalled keys (empty for any other): each waits on an event whose
    /// attempts ran out under [`OnExhaustion::Halt`](crate::OnExhaustion::Halt), until an
    /// operator retries it ([`retry_stalled_keys`](crate::admin::retry_stalled_keys)).
    pub stalled: Vec<StalledKey>,
    /// A relay's sink that its owner finds down (an outage: the relay backs off, counts no
    /// attempt, parks nothing and resumes by itself once the sink answers): since when and why.
    /// `None` while the sink answers, for subscriptions, and after a claim until the new
    /// owner finds the sink down again. From the database (`ordo.subscriptions.sink_down_since`
    /// and `sink_down_reason`), as the owning relay last stored it; a relay that stopped leaves
    /// its last state there until its row is claimed again. From a relay's handle, live.
    pub sink_down: Option<SinkDown>,
    /// Its dead letters: events it gave up on (its exhaustion policy was
    /// [`OnExhaustion::DeadLetter`](crate::OnExhaustion::DeadLetter)), how many and since
    /// when; `ordo dead-letters list --subscription NAME` shows them. From the database
    /// readers ([`status`](crate::admin::status),
    /// [`list_subscriptions`](crate::admin::list_subscriptions)); `None` from a handle, which
    /// reads nothing.
    pub dead_letters: Option<DeadLetterCount>,
    /// Its stuck keys' backlogs (`ordo.key_backlogs`): the events that wait behind its stalled
    /// (a relay: parked) events, out of its window. From the database readers; `None` from a
    /// handle, which reads nothing.
    pub backlog: Option<BacklogSize>,
    /// What the row is, `subscription` or `relay`, as stored in `ordo.subscriptions.kind`.
    /// `None` for a row an older ordo wrote, until a runner adopts it.
    pub kind: Option<String>,
    /// The database role that created the row and runs it (`ordo.subscriptions.role`); only
    /// roles that act as it may write the row. `None` for a row an older ordo wrote, until a
    /// runner adopts it.
    pub role: Option<String>,
}

/// A subscription's dead letters: see [`SubscriptionStatus::dead_letters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct DeadLetterCount {
    /// How many there are (0: none).
    pub count: u64,
    /// When the oldest was written; `None` when there is none.
    pub oldest_at: Option<DateTime<Utc>>,
}

impl DeadLetterCount {
    /// Read from a row's `dead_letters` (a count) and `oldest_dead_letter`.
    pub(crate) fn read(row: &sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        use sqlx::Row;
        Ok(Self {
            count: u64::try_from(row.try_get::<i64, _>("dead_letters")?).unwrap_or(0),
            oldest_at: row.try_get("oldest_dead_letter")?,
        })
    }
}

/// What waits in a subscription's or relay's stuck keys' backlogs: see
/// [`SubscriptionStatus::backlog`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct BacklogSize {
    /// Events in the backlogs, the stalled ones included (0: none).
    pub events: u64,
    /// What their payloads and headers weigh, as stored.
    pub bytes: u64,
    /// The distinct keys they carry.
    pub keys: u64,
    /// When the oldest was moved aside; `None` when there is none.
    pub oldest_at: Option<DateTime<Utc>>,
}

/// A relay's sink found down: see [`SubscriptionStatus::sink_down`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SinkDown {
    /// When the owning relay first found it down (the first outage flight of its claim).
    pub since: DateTime<Utc>,
    /// Why, as the sink said (at most 500 characters). It may hold event text (a subject, a
    /// key): escape it before showing it on a terminal
    /// ([`printable`](crate::admin::printable)).
    pub reason: String,
}

impl SinkDown {
    /// The most characters of a reason kept: a sink's error repeats no more of an event than
    /// that, and `ordo status` lines stay readable.
    pub(crate) const REASON_CHARS: usize = 500;

    /// Down since `since` for `reason`, cut to [`Self::REASON_CHARS`] characters.
    pub(crate) fn new(since: DateTime<Utc>, reason: &str) -> Self {
        let reason = match reason.char_indices().nth(Self::REASON_CHARS) {
            Some((cut, _)) => format!("{}...", &reason[..cut]),
            None => reason.to_owned(),
        };
        Self { since, reason }
    }

    /// Read from a row's `sink_down_since` and `sink_down_reason`.
    pub(crate) fn read(row: &sqlx::postgres::PgRow) -> Result<Option<Self>, sqlx::Error> {
        use sqlx::Row;
        let since: Option<DateTime<Utc>> = row.try_get("sink_down_since")?;
        let reason: Option<String> = row.try_get("sink_down_reason")?;
        Ok(since.map(|since| Self {
            since,
            reason: reason.unwrap_or_default(),
        }))
    }
}

impl std::fmt::Display for SinkDown {
    /// `sink down since 2026-12-02T01:02:03Z: reason` (the reason as stored, not escaped).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sink down since {}: {}",
            self.since
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            self.reason
        )
    }
}

/// A key of a keyed subscription that waits on a stalled event; every other key goes on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct StalledKey {
    /// The key, as [`Subscriber::keys`](crate::Subscriber::keys) gave it.
    pub key: String,
    /// The stalled event's position on the subscription's lane.
    pub position: Position,
    /// Its failed attempts.
    pub attempts: u32,
    /// Its last error.
    pub error: String,
    /// Whether an operator asked to retry it and the runner has not yet taken the request.
    pub retry_requested: bool,
    /// Since when it is stalled (a relay: parked): when its runner stalled it, or, read from
    /// the database, when its row last changed. `None` when the runner that reports it found
    /// it stalled already.
    pub since: Option<DateTime<Utc>>,
    /// Whether it is the first event not done: it holds the subscription's stored position
    /// (a relay's low watermark), whatever else is delivered meanwhile.
    pub holds_watermark: bool,
}

impl SubscriptionStatus {
    /// A runner's status before its first claim.
    pub(crate) fn starting(
        name: String,
        position: Position,
        kind: &str,
        role: Option<String>,
    ) -> Self {
        Self {
            name,
            lane: position.lane(),
            position,
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
            backlog: None,
            kind: Some(kind.to_owned()),
            role,
        }
    }

    /// What a claim or renewal read from the subscription's row: its position, whether it may
    /// run, and its attempts and last error (a halted one's reason). Subscriptions and relays
    /// report their row alike.
    pub(crate) fn claimed(&mut self, row: &Stored) {
        self.position = row.position;
        self.status = row.status;
        self.attempts = row.attempts;
        self.last_error = row.last_error.clone();
        // The claim cleared a relay's sink state: its runner judges the sink afresh.
        self.sink_down = None;
    }

    /// Whether a runner holds the lease at `now` (owner set, not expired).
    pub fn is_leased_at(&self, now: DateTime<Utc>) -> bool {
        self.lease_owner.is_some() && self.lease_expires_at.is_some_and(|at| at > now)
    }
}
