//! Positions in the two lanes: distinct newtypes, so a commit-lane cursor can never be handed
//! to the insert lane by mistake.

use std::fmt;

use serde::{Deserialize, Serialize};
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgHasArrayType, PgTypeInfo, PgValueRef, Postgres};

/// A position in the insert-ordered lane: the `sequence` column of `ordo.events`.
///
/// Sequences are dense once resolved: every value from 1 up to the lane's frontier is either a
/// committed event or a placeholder for a sequence no transaction can ever commit.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct EventSequence(u64);

/// A position in the commit-ordered lane: the `commit_seq` column of `ordo.commit_log`.
///
/// Commit sequences are dense from 1: the log never has a hole and never repeats a value.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct CommitSequence(u64);

macro_rules! position {
    ($name:ident) => {
        impl $name {
            /// The position before the first event: reading after it starts at the beginning.
            pub const BEGIN: Self = Self(0);

            /// Wraps a raw position.
            pub const fn new(value: u64) -> Self {
                Self(value)
            }

            /// The raw position.
            pub const fn get(self) -> u64 {
                self.0
            }

            /// The position right after this one.
            pub const fn next(self) -> Self {
                Self(self.0 + 1)
            }
        }

        impl From<u64> for $name {
            fn from(value: u64) -> Self {
                Self(value)
            }
        }

        impl From<$name> for u64 {
            fn from(value: $name) -> Self {
                value.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        /// Stored as PostgreSQL `bigint`: bind it and read it like any other column type.
        impl sqlx::Type<Postgres> for $name {
            fn type_info() -> PgTypeInfo {
                <i64 as sqlx::Type<Postgres>>::type_info()
            }

            fn compatible(ty: &PgTypeInfo) -> bool {
                <i64 as sqlx::Type<Postgres>>::compatible(ty)
            }
        }

        impl PgHasArrayType for $name {
            fn array_type_info() -> PgTypeInfo {
                <i64 as PgHasArrayType>::array_type_info()
            }
        }

        /// Refuses (as a bind error) a position past `i64::MAX`, which no column can hold.
        impl sqlx::Encode<'_, Postgres> for $name {
            fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
                let value = i64::try_from(self.0).map_err(|_| {
                    format!(
                        "{} {} is past the largest bigint PostgreSQL stores",
                        stringify!($name),
                        self.0
                    )
                })?;
                <i64 as sqlx::Encode<'_, Postgres>>::encode_by_ref(&value, buf)
            }

            fn size_hint(&self) -> usize {
                std::mem::size_of::<i64>()
            }
        }

        /// Refuses a negative value: no position is below 0.
        impl sqlx::Decode<'_, Postgres> for $name {
            fn decode(value: PgValueRef<'_>) -> Result<Self, BoxDynError> {
                let value = <i64 as sqlx::Decode<'_, Postgres>>::decode(value)?;
                u64::try_from(value)
                    .map(Self)
                    .map_err(|_| format!("a negative {}: {value}", stringify!($name)).into())
            }
        }
    };
}

position!(EventSequence);
position!(CommitSequence);

/// A lane: the one enum that names it everywhere (a subscription's choice, errors, status, dead
/// letters, the CLI). Stored and printed as `insert` / `commit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Ordering {
    /// The insert-ordered lane; the position is an [`EventSequence`](crate::EventSequence).
    #[default]
    Insert,
    /// The commit-ordered lane; the position is a [`CommitSequence`](crate::CommitSequence).
    Commit,
}

impl Ordering {
    /// The name stored in `ordo.subscriptions.lane`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Insert => "insert",
            Self::Commit => "commit",
        }
    }

    pub(crate) fn parse(stored: &str) -> Option<Self> {
        match stored {
            "insert" => Some(Self::Insert),
            "commit" => Some(Self::Commit),
            _ => None,
        }
    }
}

impl fmt::Display for Ordering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a listener starts reading a lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Start<Pos> {
    /// From the first event ever recorded.
    Beginning,
    /// From the event right after this position (exclusive).
    After(Pos),
    /// From the first event that becomes visible after the listener is created.
    Now,
}

/// A subscription's position, in the unit of its lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Position {
    /// On the insert lane: every event at or below it has been handled.
    Insert(EventSequence),
    /// On the commit lane: every log entry at or below it has been handled.
    Commit(CommitSequence),
}

impl Position {
    pub(crate) fn new(ordering: Ordering, value: u64) -> Self {
        match ordering {
            Ordering::Insert => Self::Insert(EventSequence::new(value)),
            Ordering::Commit => Self::Commit(CommitSequence::new(value)),
        }
    }

    /// The raw position.
    pub fn get(self) -> u64 {
        match self {
            Self::Insert(position) => position.get(),
            Self::Commit(position) => position.get(),
        }
    }

    /// Its lane.
    pub fn lane(self) -> Ordering {
        match self {
            Self::Insert(_) => Ordering::Insert,
            Self::Commit(_) => Ordering::Commit,
        }
    }

    /// `column` of `row`, a position on `lane` (a bigint column: the lane is not stored with
    /// each position, so the reader says which it is).
    pub(crate) fn read(
        row: &sqlx::postgres::PgRow,
        column: &str,
        lane: Ordering,
    ) -> Result<Self, sqlx::Error> {
        Ok(match lane {
            Ordering::Insert => Self::Insert(sqlx::Row::try_get(row, column)?),
            Ordering::Commit => Self::Commit(sqlx::Row::try_get(row, column)?),
        })
    }
}

/// `column` of `row`, a lane's name, as an [`Ordering`]; text that names no lane fails to
/// decode.
pub(crate) fn read_lane(
    row: &sqlx::postgres::PgRow,
    column: &str,
) -> Result<Ordering, sqlx::Error> {
    let text: String = sqlx::Row::try_get(row, column)?;
    Ordering::parse(&text).ok_or_else(|| sqlx::Error::ColumnDecode {
        index: column.to_owned(),
        source: format!("lane {text:?} is neither insert nor commit").into(),
    })
}

/// The raw number, as `ordo.subscriptions.position` stores it.
impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

/// The raw number (the lane is a field of its own wherever a position is serialized).
impl serde::Serialize for Position {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.get())
    }
}

/// Bound as `bigint`, like the sequence it wraps.
impl sqlx::Type<sqlx::Postgres> for Position {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <EventSequence as sqlx::Type<sqlx::Postgres>>::type_info()
    }
}

impl sqlx::Encode<'_, sqlx::Postgres> for Position {
    fn encode_by_ref(
        &self,
        buf: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        match self {
            Self::Insert(position) => sqlx::Encode::<sqlx::Postgres>::encode_by_ref(position, buf),
            Self::Commit(position) => sqlx::Encode::<sqlx::Postgres>::encode_by_ref(position, buf),
        }
    }

    fn size_hint(&self) -> usize {
        std::mem::size_of::<i64>()
    }
}

/// A server history of the commit lane: a stretch of the log in which no position was given
/// twice, named by an id, with the first position of that stretch (`ordo.commit_histories`).
/// A new history begins wherever positions can be handed out again: at every promotion of a
/// standby (the first append on a new PostgreSQL timeline), and at every rewind an outbox
/// detects (a restore from a dump, a storage snapshot rolled back, commits lost with
/// `synchronous_commit = off`: the log went back and its positions go to new events). Ids are
/// taken from the server clock and always grow, so a history begun after a restore is newer
/// than every one the restore took away. `(history, position)` names an event where the
/// position alone does not. A relay sends it beside each commit-lane position
/// ([`Message::history`](crate::relay::Message::history), the headers `Ordo-History` and
/// `Ordo-History-Start`); a watermark inbox uses it to tell new events from duplicates
/// ([`InboxMessage::history`](crate::inbox::InboxMessage::history)).
///
/// ```
/// let history = ordo::ServerHistory { id: 1_796_647_812_188_840, first_position: 151 };
/// assert!(history.first_position <= 160);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ServerHistory {
    /// The history's id: larger is newer. The log's first history has the PostgreSQL timeline
    /// it began on (1 on a server never promoted); later ones have ids from the server clock
    /// (microseconds since 1970), above every earlier id.
    pub id: u64,
    /// The first commit position of the history (1 for the history the log began on, or
    /// was on when ordo's schema gained histories).
    pub first_position: u64,
}
