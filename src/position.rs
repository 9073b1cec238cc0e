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
