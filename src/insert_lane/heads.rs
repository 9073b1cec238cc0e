//! Where the insert lane stands in the table: the sequence head (the highest sequence drawn),
//! the contiguous end the frontier starts from, and rows above the head (which break the
//! schema contract). The lane's page reads are `rows.rs`.

use sqlx::PgPool;
use uuid::Uuid;

use crate::error::Result;
use crate::position::EventSequence;
use crate::telemetry::HotStatement;

/// The highest sequence any transaction has drawn (committed or not).
pub(crate) const HEAD: &str =
    "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM ordo.events_sequence";

/// The end of the contiguous run of rows that starts right above `$1`, or `$1` itself.
pub(crate) const CONTIGUOUS_END: &str = r#"
SELECT CASE
    WHEN NOT EXISTS (SELECT 1 FROM ordo.events WHERE sequence = $1 + 1) THEN $1
    ELSE (SELECT min(sequence) FROM (
            SELECT sequence, lead(sequence) OVER (ORDER BY sequence) AS next
            FROM ordo.events WHERE sequence > $1) AS run
          WHERE next IS DISTINCT FROM sequence + 1)
END
"#;

/// The first rows above the sequence head. A legitimate row never is: its writer drew its
/// sequence before inserting it.
const ABOVE_HEAD: &str = r#"
SELECT sequence, id FROM ordo.events WHERE sequence > $1 ORDER BY sequence LIMIT 10
"#;

/// Every position at or below the sequencer's cursor is resolved, so the start-up scan for
/// the frontier begins there instead of at the first event.
pub(crate) const RESOLVED_FLOOR: &str = "SELECT logged_through_sequence FROM ordo.sequencer_state";

pub(crate) async fn head(pool: &PgPool) -> Result<u64> {
    let head: EventSequence = sqlx::query_scalar(HEAD).fetch_one(pool).await?;
    Ok(head.get())
}

/// Up to ten rows above `head` (the sequence head), as (sequence, id): rows that break the
/// schema contract, inserted with an explicit `sequence` or left by a sequence set back.
pub(crate) async fn rows_above(pool: &PgPool, head: u64) -> Result<Vec<(u64, Uuid)>> {
    let rows: Vec<(EventSequence, Uuid)> = sqlx::query_as(ABOVE_HEAD)
        .bind(EventSequence::new(head))
        .fetch_all(pool)
        .await?;
    Ok(rows.into_iter().map(|(s, id)| (s.get(), id)).collect())
}

/// The insert lane's frontier as the table shows it: the end of the contiguous run of rows
/// above the sequencer's cursor.
pub(crate) async fn initial_frontier(pool: &PgPool) -> Result<u64> {
    let mut conn = pool.acquire().await?;
    frontier_on(&mut conn).await
}

/// [`initial_frontier`] on a connection the caller holds.
pub(crate) async fn frontier_on(conn: &mut sqlx::PgConnection) -> Result<u64> {
    let floor: Option<EventSequence> = sqlx::query_scalar(RESOLVED_FLOOR)
        .fetch_optional(&mut *conn)
        .await?;
    let end: Option<EventSequence> = sqlx::query_scalar(CONTIGUOUS_END)
        .bind(floor.unwrap_or(EventSequence::BEGIN))
        .fetch_one(&mut *conn)
        .await?;
    Ok(end.unwrap_or(EventSequence::BEGIN).get())
}

/// This file's statements on ordo's hot paths, with sample arguments, for `ops::plans`
/// (`tests/ops/plans.rs` fails if PostgreSQL would JIT-compile any).
pub(crate) const HOT_PATH: &[HotStatement] = &[
    HotStatement {
        name: "insert lane: sequence head",
        sql: HEAD,
        types: "",
        args: "",
        session: &[],
    },
    HotStatement {
        name: "insert lane: contiguous end",
        sql: CONTIGUOUS_END,
        types: "bigint",
        args: "0",
        session: &[],
    },
    HotStatement {
        name: "insert lane: resolved floor",
        sql: RESOLVED_FLOOR,
        types: "",
        args: "",
        session: &[],
    },
];
