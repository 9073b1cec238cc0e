//! Hole resolution: prove a sequence abandoned, then write a placeholder so every process
//! agrees. Never a skip on a timer.
//!
//! A hole at `s` is a sequence some transaction drew but nobody can see yet. The proof watches
//! only the transactions that can have drawn it, never the rest of the server: a long batch job
//! in another database, or a transaction here that never publishes, cannot hold it up.
//!
//! 1. **The head is read first** ([`heads::HEAD`], `ordo.events_sequence` has `CACHE 1`, so its
//!    `last_value` is the last sequence any transaction drew). The range is cut there: every
//!    sequence the lane asks about was drawn by a `nextval` that had returned before that read.
//! 2. **Then the drawers are read** ([`DRAWERS`]). `nextval` locks the sequence
//!    (`RowExclusiveLock`) before it draws, for the *top-level* transaction: the lock is held
//!    until that transaction ends, through a rolled-back savepoint, and a `PREPARE TRANSACTION`
//!    hands it to the prepared transaction (same virtual transaction id, no pid, the same xid
//!    lock). So the writer of a hole either had ended before this read, or it holds the lock
//!    throughout the read and is listed: `pg_locks` shows every lock held for the whole of one
//!    read, fast-path ones included. No writer can slip between the two reads: it would have to
//!    draw `s` after the head read, and `s` is at or below that head.
//! 3. **The drawers are watched** ([`DRAWERS_ENDED`]) until none of them holds the lock any
//!    more, each look one `pg_locks` read (materialized once, so one consistent view). A
//!    virtual transaction id is never reused while the server runs; a prepared transaction is
//!    also matched by its xid, since a restart may give it another virtual id (and when a
//!    drawer had no xid yet, every prepared holder counts as possibly it). Transactions that
//!    take the lock after step 2 drew above the head and are not waited for.
//! 4. **The fill** ([`FILL`]) then writes placeholders only where a fresh look finds no row:
//!    every possible writer has ended, so each sequence is committed (its row is there) or
//!    abandoned for good, and the placeholder never waits on, or collides with, a live writer.
//!
//! `pg_locks` is readable by every role, so a reader role proves holes as a writer does. If a
//! drawer stays open past `gap_fill_timeout` (a publishing transaction that idles, a prepared
//! transaction nobody finishes), the placeholder is written anyway with `ON CONFLICT DO
//! NOTHING`: a writer that already inserted its row makes that statement wait for its outcome,
//! so the lane still never passes a row that commits. That time-out is the last resort.

use std::time::Duration;

use sqlx::PgPool;
use tokio::time::Instant;

use super::heads;
use crate::error::Result;
use crate::position::EventSequence;
use crate::task::spawn_owned;
use crate::telemetry::HotStatement;

/// The transactions that hold a lock on `ordo.events_sequence` in this database now (any mode
/// but the `AccessShareLock` a plain read of the sequence takes): their virtual transaction
/// ids, their xids, and whether one of them has no xid yet. One row; `pg_locks` is read once.
pub(crate) const DRAWERS: &str = r#"
WITH locks AS MATERIALIZED (
    SELECT locktype, database, relation, virtualtransaction, pid, mode, granted, transactionid
    FROM pg_locks
), holders AS MATERIALIZED (
    SELECT DISTINCT virtualtransaction
    FROM locks
    WHERE locktype = 'relation' AND granted AND mode <> 'AccessShareLock'
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND relation = 'ordo.events_sequence'::regclass
), xids AS MATERIALIZED (
    SELECT virtualtransaction, transactionid
    FROM locks
    WHERE locktype = 'transactionid' AND mode = 'ExclusiveLock' AND granted
), drawers AS (
    SELECT h.virtualtransaction, x.transactionid
    FROM holders AS h
    LEFT JOIN xids AS x USING (virtualtransaction)
)
SELECT coalesce(array_agg(DISTINCT virtualtransaction), '{}') AS holders,
       coalesce(array_agg(DISTINCT transactionid::text) FILTER (WHERE transactionid IS NOT NULL), '{}') AS xids,
       coalesce(bool_or(transactionid IS NULL), false) AS without_xid
FROM drawers
"#;

/// True once none of the drawers `$1` (virtual transaction ids), `$2` (their xids) still holds
/// its lock on `ordo.events_sequence`. A prepared holder (no pid) is one of them if its virtual
/// id or one of its xids was listed, or if `$3` (a drawer had no xid, so it cannot be told).
pub(crate) const DRAWERS_ENDED: &str = r#"
WITH locks AS MATERIALIZED (
    SELECT locktype, database, relation, virtualtransaction, pid, mode, granted, transactionid
    FROM pg_locks
)
SELECT NOT EXISTS (
    SELECT 1
    FROM locks AS s
    WHERE s.locktype = 'relation' AND s.granted AND s.mode <> 'AccessShareLock'
      AND s.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND s.relation = 'ordo.events_sequence'::regclass
      AND (s.virtualtransaction = ANY($1::text[])
           OR (s.pid IS NULL
               AND ($3::bool OR EXISTS (
                   SELECT 1 FROM locks AS x
                   WHERE x.virtualtransaction = s.virtualtransaction
                     AND x.locktype = 'transactionid'
                     AND x.transactionid::text = ANY($2::text[])))))
)
"#;

/// The possible writers of every hole at or below the head read before them.
#[derive(Debug, sqlx::FromRow)]
struct Drawers {
    holders: Vec<String>,
    xids: Vec<String>,
    without_xid: bool,
}

impl Drawers {
    async fn read(pool: &PgPool) -> Result<Self, sqlx::Error> {
        sqlx::query_as(DRAWERS).fetch_one(pool).await
    }

    /// Whether every one of them has ended (or, prepared, been finished).
    async fn ended(&self, pool: &PgPool) -> Result<bool, sqlx::Error> {
        if self.holders.is_empty() {
            return Ok(true);
        }
        sqlx::query_scalar(DRAWERS_ENDED)
            .bind(&self.holders)
            .bind(&self.xids)
            .bind(self.without_xid)
            .fetch_one(pool)
            .await
    }
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
        // Read before the drawers (step 1 of the module's proof): every sequence at or below it
        // was drawn before they are read. A legitimate row is never above it (its writer drew it
        // before inserting), so the range is cut there and a forged row cannot make the lane
        // fill sequences nobody drew.
        let head = heads::head(&self.pool).await?;
        let upto = upto.min(head);
        if from > upto {
            let rows = heads::rows_above(&self.pool, head).await?;
            return Ok(Resolution::AboveHead { head, rows });
        }
        // Step 2: a drawer of any sequence up to `head` that is still open is among these.
        let drawers = Drawers::read(&self.pool).await?;
        let deadline = Instant::now() + self.timeout;
        let mut poll = self.poll;
        loop {
            if drawers.ended(&self.pool).await? {
                let filled = self.fill(from, upto).await?;
                return Ok(Resolution::Proven { filled });
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    from,
                    upto,
                    holders = drawers.holders.len(),
                    "abandonment proof held up by a transaction that drew an event sequence and is still open; filling under conflict checks"
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
        let written = spawn_owned("insert_lane.placeholders", async move {
            let filled =
                fill_placeholders(&pool, EventSequence::new(from), EventSequence::new(upto))
                    .await?;
            metrics::counter!(crate::telemetry::metrics::PLACEHOLDERS).increment(filled);
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

/// This file's statements on ordo's hot paths, with sample arguments, for `ops::plans`
/// (`tests/ops/plans.rs` fails if PostgreSQL would JIT-compile any).
pub(crate) const HOT_PATH: &[HotStatement] = &[
    HotStatement {
        name: "insert lane: sequence drawers",
        sql: DRAWERS,
        types: "",
        args: "",
        session: &[],
    },
    HotStatement {
        name: "insert lane: abandonment proof",
        sql: DRAWERS_ENDED,
        types: "text[], text[], bool",
        args: "ARRAY['3/7']::text[], ARRAY['1234']::text[], false",
        session: &[],
    },
    HotStatement {
        name: "insert lane: placeholders",
        sql: FILL,
        types: "bigint, bigint",
        args: "5, 9",
        session: &[],
    },
];
