//! The receiving side in `ordo status`: each consumer's failed messages, and each watermark
//! consumer's marks with what holds them (a failing message, a gap).
//!
//! A gap is shown only once it has outlived a few redeliveries ([`GAP_SHOWN_AFTER`]): during
//! a normal catch-up (a relay ordering per key, a burst redelivered out of order) early
//! messages are refused and come back a second later, and a gap that closes by itself is not
//! the operator's business. A gap whose next position *arrived* and is failing is not a gap at
//! all: the position is named as failing, and moving the mark past it would skip it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};

use super::Watermark;
use super::rows::count;
use crate::error::Result;

/// A gap younger than this is a catch-up in progress, not shown: five redeliveries at the
/// adapters' default [`Redelivery::gap`](super::Redelivery::gap) of 1 s.
pub const GAP_SHOWN_AFTER: Duration = Duration::from_secs(5);

/// The inbox of the database `ordo status` reads: consumers with failed messages and every
/// watermark consumer's marks. Empty where no inbox receives.
#[derive(Debug, Clone, Default, Serialize)]
#[non_exhaustive]
pub struct InboxStatus {
    /// Consumers holding failed messages (row mode and watermark mode alike), by name.
    pub failed: Vec<FailedCount>,
    /// Every watermark consumer's marks, by consumer, source and route.
    pub marks: Vec<MarkStatus>,
}

/// A consumer's failed messages: they reached `max_attempts` and wait for an operator (`ordo
/// inbox failed`, `ordo inbox replay`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct FailedCount {
    /// The consumer.
    pub consumer: String,
    /// How many.
    pub count: u64,
    /// When the oldest of them failed.
    pub oldest_at: DateTime<Utc>,
}

/// One mark of a watermark consumer (a row of `ordo.inbox_watermarks`), as status shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct MarkStatus {
    /// The consumer.
    pub consumer: String,
    /// The sending ordo.
    pub source: String,
    /// The sender's route (`""`: the source's one route).
    pub route: String,
    /// The highest position handled.
    pub position: u64,
    /// Seconds since the mark last moved or recorded a failure.
    pub idle_seconds: f64,
    /// What holds the mark, if anything does.
    pub waits_on: Option<MarkWait>,
}

/// What holds a watermark consumer's mark.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum MarkWait {
    /// The next position arrived and its handler fails: it is tried again on each
    /// redelivery, until it succeeds or reaches `max_attempts` (then it is a failed message and
    /// the mark moves past it). Later positions wait behind it.
    Failing {
        /// The position failing.
        position: u64,
        /// Its failed attempts so far.
        attempts: u32,
        /// Its last error.
        error: Option<String>,
        /// The highest later position refused meanwhile, if one was.
        refused: Option<u64>,
    },
    /// A position has not arrived, and later ones were refused, for longer than
    /// [`GAP_SHOWN_AFTER`]: lost upstream, or still on its way. If it never comes, `ordo inbox
    /// set-watermark` moves the mark to it (`docs/inbox.md`, "Watermark mode").
    Gap {
        /// The position waited for.
        expected: u64,
        /// The highest position refused meanwhile.
        received: u64,
        /// How long the consumer has been waiting, in seconds.
        seconds: f64,
    },
}

/// Consumers with failed messages, oldest failure first within each.
const FAILED: &str = r#"
SELECT consumer, count(*) AS count, min(updated_at) AS oldest
FROM ordo.inbox WHERE status = 'failed'
GROUP BY consumer ORDER BY consumer
"#;

/// Every mark, with its ages on the database's clock.
const MARKS: &str = r#"
SELECT consumer, source, route, position, failing_position, attempts, last_error,
       extract(epoch FROM now() - updated_at)::float8 AS idle,
       gap_position, gap_expected, extract(epoch FROM now() - gap_since)::float8 AS gap_age
FROM ordo.inbox_watermarks
ORDER BY consumer, source, route
"#;

/// Reads the inbox's failed messages and marks.
///
/// # Errors
/// [`Error::Database`](crate::Error::Database) if `ordo.inbox` or `ordo.inbox_watermarks`
/// cannot be read.
pub(crate) async fn inbox_status(pool: &PgPool) -> Result<InboxStatus> {
    let failed = sqlx::query(FAILED)
        .fetch_all(pool)
        .await?
        .iter()
        .map(|row| {
            Ok(FailedCount {
                consumer: row.try_get("consumer")?,
                count: u64::try_from(row.try_get::<i64, _>("count")?).unwrap_or(0),
                oldest_at: row.try_get("oldest")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()?;
    let marks = sqlx::query(MARKS)
        .fetch_all(pool)
        .await?
        .iter()
        .map(mark)
        .collect::<Result<_, sqlx::Error>>()?;
    Ok(InboxStatus { failed, marks })
}

fn mark(row: &PgRow) -> Result<MarkStatus, sqlx::Error> {
    let unsigned = |value: i64| u64::try_from(value).unwrap_or(0);
    let position = unsigned(row.try_get("position")?);
    let failing = row
        .try_get::<Option<i64>, _>("failing_position")?
        .map(unsigned);
    let expected = row.try_get::<Option<i64>, _>("gap_expected")?.map(unsigned);
    let refused = row.try_get::<Option<i64>, _>("gap_position")?.map(unsigned);
    let gap = refused.map(|received| Gap {
        expected: expected.unwrap_or(position + 1),
        received,
        seconds: row
            .try_get::<Option<f64>, _>("gap_age")
            .ok()
            .flatten()
            .unwrap_or(0.0),
    });
    let failing = failing.map(|position| -> Result<Failing, sqlx::Error> {
        Ok(Failing {
            position,
            attempts: count(row.try_get("attempts")?),
            error: row.try_get("last_error")?,
        })
    });
    Ok(MarkStatus {
        consumer: row.try_get("consumer")?,
        source: row.try_get("source")?,
        route: row.try_get("route")?,
        position,
        idle_seconds: row.try_get::<f64, _>("idle")?.max(0.0),
        waits_on: waits_on(failing.transpose()?, gap),
    })
}

/// A mark's failing position, as its row stores it.
struct Failing {
    position: u64,
    attempts: u32,
    error: Option<String>,
}

/// A mark's gap, as its row stores it, with its age in seconds.
struct Gap {
    expected: u64,
    received: u64,
    seconds: f64,
}

/// What holds a mark, from what its row stores: a failing position (named so even while later
/// positions are refused behind it), or a gap older than [`GAP_SHOWN_AFTER`].
fn waits_on(failing: Option<Failing>, gap: Option<Gap>) -> Option<MarkWait> {
    match (failing, gap) {
        // The position the refused messages wait for arrived and is the failing one (or one
        // before it): the wait ends with its handler, not with a redelivery from upstream.
        (Some(failing), gap)
            if gap
                .as_ref()
                .is_none_or(|gap| gap.expected >= failing.position) =>
        {
            Some(MarkWait::Failing {
                position: failing.position,
                attempts: failing.attempts,
                error: failing.error,
                refused: gap.map(|gap| gap.received),
            })
        }
        (_, Some(gap)) if gap.seconds >= GAP_SHOWN_AFTER.as_secs_f64() => Some(MarkWait::Gap {
            expected: gap.expected,
            received: gap.received,
            seconds: gap.seconds,
        }),
        _ => None,
    }
}

impl Watermark {
    /// What holds this mark as of `now` (the database's clock, as near as you have it), as
    /// `ordo status` says it: a failing position, or a gap older than [`GAP_SHOWN_AFTER`];
    /// `None` while messages come in order (a younger gap is a catch-up in progress).
    ///
    /// ```no_run
    /// # async fn run(pool: sqlx::PgPool) -> ordo::Result<()> {
    /// let now = chrono::Utc::now();
    /// for mark in ordo::inbox::list_watermarks(&pool, None).await? {
    ///     if let Some(wait) = mark.waits_on(now) {
    ///         println!("{} from {}: {wait:?}", mark.consumer, mark.source);
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn waits_on(&self, now: DateTime<Utc>) -> Option<MarkWait> {
        let failing = self
            .failing_position
            .and_then(|position| u64::try_from(position).ok())
            .map(|position| Failing {
                position,
                attempts: self.attempts,
                error: self.last_error.clone(),
            });
        let gap = self.gap.as_ref().map(|gap| Gap {
            expected: gap.expected,
            received: gap.received,
            seconds: ((now - gap.since).num_milliseconds() as f64 / 1e3).max(0.0),
        });
        waits_on(failing, gap)
    }
}

#[cfg(test)]
mod tests {
    use super::GAP_SHOWN_AFTER;

    #[test]
    fn the_gap_warning_waits_as_long_as_status_does() {
        let interval = format!("interval '{} seconds'", GAP_SHOWN_AFTER.as_secs());
        assert_eq!(super::super::sql::NOTE_GAP.matches(&interval).count(), 2);
    }
}
