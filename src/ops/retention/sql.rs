//! Retention's statements, in one place. The commit log is not partitioned (it is stored as
//! chunks, one row per append); its entries for dropped events are deleted by
//! `commit_lane::trim_below` in the drop's transaction.

use sqlx::{PgConnection, Row};

use super::plan::DefaultRows;
use crate::position::{CommitSequence, EventSequence};

/// Every partition of `ordo.events` with its bound (`DEFAULT` for the default partition).
const PARTITIONS: &str = r#"
SELECT c.relname::text AS name, pg_get_expr(c.relpartbound, c.oid) AS bound
FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = 'ordo.events'::regclass
"#;

/// Each partition's name and bound, as [`PARTITIONS`] reads them.
pub(super) async fn partitions(
    conn: &mut PgConnection,
) -> Result<Vec<(String, String)>, sqlx::Error> {
    sqlx::query_as(PARTITIONS).fetch_all(&mut *conn).await
}

/// Partition size, floors, the drawn head and the sequencer's cursor, in one snapshot.
const STATE: &str = r#"
SELECT p.partition_size, p.events_floor, p.commit_floor,
       (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM ordo.events_sequence) AS head,
       s.logged_through_sequence
FROM ordo.partitioning AS p, ordo.sequencer_state AS s
"#;

/// What [`STATE`] reads.
#[derive(sqlx::FromRow)]
pub(super) struct State {
    #[sqlx(try_from = "i64")]
    pub(super) partition_size: u64,
    pub(super) events_floor: EventSequence,
    pub(super) commit_floor: CommitSequence,
    pub(super) head: EventSequence,
    pub(super) logged_through_sequence: EventSequence,
}

pub(super) async fn state(conn: &mut PgConnection) -> Result<State, sqlx::Error> {
    sqlx::query_as(STATE).fetch_one(&mut *conn).await
}

/// What each subscription still needs, as an insert sequence. A commit-lane subscription needs
/// the event of its next log row (read from the log). The function (migration
/// `20261202000100_secret_keys`) is shared with the scrubbing of secret keys, so that "every
/// reader passed it" means one thing to both.
const SUBSCRIPTION_NEEDS: &str = r#"
SELECT n.name, n.lane, n.position, n.needs FROM ordo.subscription_needs() AS n
"#;

/// One subscription's need, as [`SUBSCRIPTION_NEEDS`] reads it.
#[derive(sqlx::FromRow)]
pub(super) struct Need {
    pub(super) name: String,
    pub(super) lane: String,
    pub(super) position: i64,
    /// `None` for a commit-lane subscription that has read the whole log.
    pub(super) needs: Option<EventSequence>,
}

pub(super) async fn subscription_needs(conn: &mut PgConnection) -> Result<Vec<Need>, sqlx::Error> {
    sqlx::query_as(SUBSCRIPTION_NEEDS)
        .fetch_all(&mut *conn)
        .await
}

/// The rows in the default partition, read through the parent (a role may read `ordo.events`
/// without any right on its partitions): the range partitions are contiguous, so the default
/// holds exactly the rows at or above their end (`$1`) ...
const DEFAULT_ROWS_ABOVE: &str = r#"
SELECT count(*) AS rows, min(sequence) AS low, max(sequence) AS high
FROM ordo.events WHERE sequence >= $1
"#;

/// ... and, once the first partition (from `MINVALUE`) was dropped, below their start (`$2`).
const DEFAULT_ROWS_OUTSIDE: &str = r#"
SELECT count(*) AS rows, min(sequence) AS low, max(sequence) AS high
FROM ordo.events WHERE sequence >= $1 OR sequence < $2
"#;

/// The rows in the default partition, where the range partitions are `[low, top)` (`low`
/// `None` while the first one reaches down to `MINVALUE`).
pub(super) async fn default_rows(
    conn: &mut PgConnection,
    top: EventSequence,
    low: Option<EventSequence>,
) -> Result<DefaultRows, sqlx::Error> {
    let query = match low {
        None => sqlx::query(DEFAULT_ROWS_ABOVE).bind(top),
        Some(low) => sqlx::query(DEFAULT_ROWS_OUTSIDE).bind(top).bind(low),
    };
    let row = query.fetch_one(&mut *conn).await?;
    let low: Option<EventSequence> = row.try_get("low")?;
    let high: Option<EventSequence> = row.try_get("high")?;
    Ok(DefaultRows {
        // A count, never negative.
        rows: u64::try_from(row.try_get::<i64, _>("rows")?).unwrap_or(0),
        low: low.map(EventSequence::get),
        high: high.map(EventSequence::get),
    })
}

/// The lowest and highest sequence of the default partition after a fold detached it (read by
/// the owner, who may). No count: that would scan the table under the fold's exclusive lock.
const DETACHED_RANGE: &str = r#"
SELECT min(sequence) AS low, max(sequence) AS high FROM ordo.events_default
"#;

pub(super) async fn detached_range(
    conn: &mut PgConnection,
) -> Result<(Option<EventSequence>, Option<EventSequence>), sqlx::Error> {
    sqlx::query_as(DETACHED_RANGE).fetch_one(&mut *conn).await
}

/// Records, for each upper bound in `$1`, that its partition is sealed, unless it was seen
/// sealed before. `clock_timestamp()`, not `now()`: the frontier that proved the seal was read
/// by an earlier statement, and the time recorded must not precede that reading (`now()` is the
/// transaction's start).
const RECORD_SEALS: &str = r#"
INSERT INTO ordo.partition_seals (upper_bound, sealed_at)
SELECT b, clock_timestamp() FROM unnest($1::bigint[]) AS b
ON CONFLICT (upper_bound) DO NOTHING
"#;

pub(super) async fn record_seals(
    conn: &mut PgConnection,
    upper_bounds: &[EventSequence],
) -> Result<(), sqlx::Error> {
    sqlx::query(RECORD_SEALS)
        .bind(upper_bounds)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// How long ago each partition was first seen sealed, in seconds.
const SEAL_AGES: &str = r#"
SELECT upper_bound, date_part('epoch', clock_timestamp() - sealed_at)::float8 AS age
FROM ordo.partition_seals
"#;

/// Each seal's upper bound and age in seconds.
pub(super) async fn seal_ages(
    conn: &mut PgConnection,
) -> Result<Vec<(EventSequence, f64)>, sqlx::Error> {
    sqlx::query_as(SEAL_AGES).fetch_all(&mut *conn).await
}

/// Forgets the seal of a dropped partition.
const FORGET_SEAL: &str = "DELETE FROM ordo.partition_seals WHERE upper_bound = $1";

pub(super) async fn forget_seal(
    conn: &mut PgConnection,
    upper_bound: EventSequence,
) -> Result<(), sqlx::Error> {
    sqlx::query(FORGET_SEAL)
        .bind(upper_bound)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Whether a source transaction has events on both sides of `$2` (from `$1` on).
const STRADDLES: &str = r#"
SELECT EXISTS (
    SELECT 1 FROM ordo.events AS a
    JOIN ordo.events AS b ON b.commit_xid = a.commit_xid
    WHERE a.sequence >= $1 AND a.sequence < $2 AND a.commit_xid IS NOT NULL AND b.sequence >= $2)
"#;

pub(super) async fn straddles(
    conn: &mut PgConnection,
    from: EventSequence,
    to: EventSequence,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(STRADDLES)
        .bind(from)
        .bind(to)
        .fetch_one(&mut *conn)
        .await
}

/// Serialises retention steps across processes. Taken in each step's transaction, under the
/// step's lock timeout, so a second run waits at most that long before it backs off.
const SERIALISE: &str = "SELECT pg_advisory_xact_lock(hashtext('ordo.retention'))";

/// Creating, folding or dropping a partition takes an exclusive lock on the parent table, and
/// a waiting lock request queues every writer behind it. So a step waits briefly for its locks,
/// gives way, and is tried again after a pause (within the run's deadline) rather than stall
/// writers behind a long transaction.
const LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '100ms'";

/// Sets a step's transaction up: [`LOCK_TIMEOUT`] first, so that even the advisory lock of
/// [`SERIALISE`] is waited for only that long.
pub(super) async fn lock_step(tx: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query(LOCK_TIMEOUT).execute(&mut *tx).await?;
    sqlx::query(SERIALISE).execute(&mut *tx).await?;
    Ok(())
}

/// The floors after a drop: the lowest event kept (`$1`), and the highest commit sequence gone
/// (`$2`, from trimming the log).
const FLOORS: &str = r#"
UPDATE ordo.partitioning
SET events_floor = $1,
    commit_floor = $2,
    updated_at = now()
"#;

pub(super) async fn set_floors(
    conn: &mut PgConnection,
    events_floor: EventSequence,
    commit_floor: CommitSequence,
) -> Result<(), sqlx::Error> {
    sqlx::query(FLOORS)
        .bind(events_floor)
        .bind(commit_floor)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The partitioned table.
pub(super) const EVENTS: &str = "events";
/// Every table partitioned by event sequence, in the order steps lock them.
pub(super) const PARTITIONED: [&str; 1] = [EVENTS];

// The DDL below is built with `format!` from numbers ordo computed and from the fixed table
// names above, never from user input.

/// Creates `table`'s range partition `[from, to)`.
pub(super) fn create_partition(table: &str, from: u64, to: u64) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS ordo.{table}_{from} PARTITION OF ordo.{table} FOR VALUES FROM ({from}) TO ({to})"
    )
}

/// Detaches `table`'s default partition (the first half of a fold): from here to the end of
/// the transaction nobody can add a row to it.
pub(super) fn detach_default(table: &str) -> String {
    format!("ALTER TABLE ordo.{table} DETACH PARTITION ordo.{table}_default")
}

/// The rest of a fold: the detached default becomes `table`'s range partition `[from, to)`
/// without copying a row (renamed with its indexes, attached with the range; PostgreSQL scans it
/// once to check the range), and an empty default takes its place.
pub(super) fn fold_detached(table: &str, from: u64, to: u64) -> [String; 4] {
    [
        format!("ALTER TABLE ordo.{table}_default RENAME TO {table}_{from}"),
        format!(
            "DO $$
             DECLARE i record;
             BEGIN
                 FOR i IN SELECT c.relname FROM pg_index AS x JOIN pg_class AS c ON c.oid = x.indexrelid
                          WHERE x.indrelid = 'ordo.{table}_{from}'::regclass
                 LOOP
                     EXECUTE format('ALTER INDEX ordo.%I RENAME TO %I', i.relname,
                                    replace(i.relname, '{table}_default', '{table}_{from}'));
                 END LOOP;
             END $$"
        ),
        format!(
            "ALTER TABLE ordo.{table} ATTACH PARTITION ordo.{table}_{from} FOR VALUES FROM ({from}) TO ({to})"
        ),
        format!("CREATE TABLE ordo.{table}_default PARTITION OF ordo.{table} DEFAULT"),
    ]
}

/// Drops the events partition `events_partition`.
pub(super) fn drop_partition(events_partition: &str) -> String {
    format!("DROP TABLE IF EXISTS ordo.{events_partition}")
}
