//! Hole resolution: prove a sequence abandoned, then write a placeholder so every process
//! agrees. Never a skip on a timer.
//!
//! A hole at `s` is a sequence some transaction drew but nobody can see yet. Every sequence the
//! lane asks about was drawn before the resolver starts (it was below a row or a head the lane
//! had already read), and every writer obtains its xid before it draws (see `write::sql` and the
//! column order of `ordo.events`). So the transaction behind the hole was either over before the
//! snapshot taken here, or is in that snapshot's in-progress list. Once every transaction of
//! that list has ended, a hole still without a row can never be filled by its writer: the
//! placeholder written then never waits on, or collides with, a live writer.
//!
//! If an unrelated long transaction holds the proof up past `gap_fill_timeout`, the placeholder
//! is written anyway with `ON CONFLICT DO NOTHING`: a writer that already inserted its row makes
//! that statement wait for its outcome, so the lane still never passes a row that commits.

use std::time::Duration;

use sqlx::PgPool;
use tokio::time::Instant;

use super::rows;
use crate::error::Result;
use crate::position::EventSequence;

/// The transactions in progress now, as text that [`ABANDONED`] takes back.
pub(crate) const SNAPSHOT: &str = "SELECT pg_current_snapshot()::text";

async fn snapshot(pool: &PgPool) -> Result<String, sqlx::Error> {
    sqlx::query_scalar(SNAPSHOT).fetch_one(pool).await
}

/// True once no transaction that was in progress in snapshot `$1` is still in progress.
pub(crate) const ABANDONED: &str = r#"
SELECT NOT EXISTS (
    SELECT 1
    FROM pg_snapshot_xip($1::pg_snapshot) AS held(xid)
    JOIN pg_snapshot_xip(pg_current_snapshot()) AS running(xid) USING (xid)
)
"#;

async fn abandoned(pool: &PgPool, snapshot: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(ABANDONED)
        .bind(snapshot)
        .fetch_one(pool)
        .await
}

/// Placeholders for every sequence of `[$1, $2]` that has no row, at or below the sequence
/// head. Through a `SECURITY DEFINER` function (migration `20261130000200_roles`): a writer role
/// may not write `sequence` or `commit_xid` itself, and the function writes nothing above the
/// head and never over a row. Its placeholders belong to no transaction (NULL `commit_xid`).
pub(crate) const FILL: &str = "SELECT ordo.fill_placeholders($1, $2)";

/// How many placeholders [`FILL`] wrote in `[from, upto]`.
async fn fill_placeholders(
    pool: &PgPool,
    from: EventSequence,
    upto: EventSequence,
) -> Result<u64, sqlx::Error> {
    let filled: i64 = sqlx::query_scalar(FILL)
        .bind(from)
        .bind(upto)
        .fetch_one(pool)
        .await?;
    // A count, never negative.
    Ok(u64::try_from(filled).unwrap_or(0))
}

/// How the resolution ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Resolution {
    /// Every writer of the range has ended; placeholders written where rows were missing.
    Proven { filled: u64 },
    /// The proof was held up past the timeout; placeholders written under conflict checks.
    TimedOut { filled: u64 },
    /// Nothing to resolve: the hole is above the sequence head, so no transaction has drawn it
    /// yet, and the rows that made it look like a hole are above the head too. Such rows break
    /// the schema contract (they were inserted with an explicit `sequence`, or the sequence was
    /// set back); filling up to them would take sequences that later publishes draw.
    AboveHead {
        /// The sequence head when the hole was looked at.
        head: u64,
        /// The first rows above the head: (sequence, id).
        rows: Vec<(u64, uuid::Uuid)>,
    },
}

pub(crate) struct Resolver {
    pub(crate) pool: PgPool,
    pub(crate) poll: Duration,
    pub(crate) max_poll: Duration,
    pub(crate) timeout: Duration,
}

impl Resolver {
    /// Resolves every hole in `[from, upto]`. The caller guarantees each of those sequences was
    /// drawn before this call.
    pub(crate) async fn resolve(&self, from: u64, upto: u64) -> Result<Resolution> {
        // Read before the snapshot: every sequence at or below it was drawn before the snapshot.
        // A legitimate row is never above it (its writer drew it before inserting), so the
        // range is cut there and a forged row cannot make the lane fill sequences nobody drew.
        let head = rows::head(&self.pool).await?;
        let upto = upto.min(head);
        if from > upto {
            let rows = rows::rows_above(&self.pool, head).await?;
            return Ok(Resolution::AboveHead { head, rows });
        }
        let snapshot = snapshot(&self.pool).await?;
        let deadline = Instant::now() + self.timeout;
        let mut poll = self.poll;
        loop {
            if abandoned(&self.pool, &snapshot).await? {
                let filled = self.fill(from, upto).await?;
                return Ok(Resolution::Proven { filled });
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    from,
                    upto,
                    "abandonment proof held up by a long transaction; filling under conflict checks"
                );
                let filled = self.fill(from, upto).await?;
                return Ok(Resolution::TimedOut { filled });
            }
            tokio::time::sleep(poll).await;
            poll = (poll * 2).min(self.max_poll);
        }
    }

    async fn fill(&self, from: u64, upto: u64) -> Result<u64> {
        let pool = self.pool.clone();
        // A task of its own, counted there: the frontier aborts this resolver once it passes
        // the hole, which the placeholder written here lets it do before this future resumes,
        // and the count must not go with it (the frontier may also drop the result unread).
        let written = tokio::spawn(async move {
            let filled =
                fill_placeholders(&pool, EventSequence::new(from), EventSequence::new(upto))
                    .await?;
            metrics::counter!(crate::ops::metrics::PLACEHOLDERS).increment(filled);
            Ok::<u64, sqlx::Error>(filled)
        });
        match written.await {
            Ok(filled) => Ok(filled?),
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            // Only a runtime shutting down cancels it.
            Err(_) => Err(crate::Error::Shutdown),
        }
    }
}
