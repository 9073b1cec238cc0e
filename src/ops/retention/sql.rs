//! Retention's statements, in one place. The commit log is not partitioned (it is stored as
//! chunks, one row per append); its entries for dropped events are deleted by
//! `commit_lane::trim_below` in the drop's transaction.

/// Every partition of `ordo.events` with its bound (`DEFAULT` for the default partition).
pub(super) const PARTITIONS: &str = r#"
SELECT c.relname::text AS name, pg_get_expr(c.relpartbound, c.oid) AS bound
FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = 'ordo.events'::regclass
"#;

/// Partition size, floors, the drawn head and the sequencer's cursor, in one snapshot.
pub(super) const STATE: &str = r#"
SELECT p.partition_size, p.events_floor, p.commit_floor,
       (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM ordo.events_sequence) AS head,
       s.logged_through_sequence
FROM ordo.partitioning AS p, ordo.sequencer_state AS s
"#;

/// What each subscription still needs, as an insert sequence. A commit-lane subscription needs
/// the event of its next log row (read from the log).
pub(super) const SUBSCRIPTION_NEEDS: &str = r#"
SELECT s.name, s.lane, s.position,
       CASE s.lane
       WHEN 'insert' THEN s.position + 1
       ELSE (SELECT min(c.min_sequence) FROM ordo.commit_chunks AS c
             WHERE c.last_commit_seq > s.position)
       END AS needs
FROM ordo.subscriptions AS s
"#;

/// The rows in the default partition, read through the parent (a role may read `ordo.events`
/// without any right on its partitions): the range partitions are contiguous, so the default
/// holds exactly the rows at or above their end (`$1`) ...
pub(super) const DEFAULT_ROWS_ABOVE: &str = r#"
SELECT count(*) AS rows, min(sequence) AS low, max(sequence) AS high
FROM ordo.events WHERE sequence >= $1
"#;

/// ... and, once the first partition (from `MINVALUE`) was dropped, below their start (`$2`).
pub(super) const DEFAULT_ROWS_OUTSIDE: &str = r#"
SELECT count(*) AS rows, min(sequence) AS low, max(sequence) AS high
FROM ordo.events WHERE sequence >= $1 OR sequence < $2
"#;

/// The lowest and highest sequence of the default partition after a fold detached it (read by
/// the owner, who may). No count: that would scan the table under the fold's exclusive lock.
pub(super) const DETACHED_RANGE: &str = r#"
SELECT min(sequence) AS low, max(sequence) AS high FROM ordo.events_default
"#;

/// Records, for each upper bound in `$1`, that its partition is sealed, unless it was seen
/// sealed before. `clock_timestamp()`, not `now()`: the frontier that proved the seal was read
/// by an earlier statement, and the time recorded must not precede that reading (`now()` is the
/// transaction's start).
pub(super) const RECORD_SEALS: &str = r#"
INSERT INTO ordo.partition_seals (upper_bound, sealed_at)
SELECT b, clock_timestamp() FROM unnest($1::bigint[]) AS b
ON CONFLICT (upper_bound) DO NOTHING
"#;

/// How long ago each partition was first seen sealed, in seconds.
pub(super) const SEAL_AGES: &str = r#"
SELECT upper_bound, date_part('epoch', clock_timestamp() - sealed_at)::float8 AS age
FROM ordo.partition_seals
"#;

/// Forgets the seal of a dropped partition.
pub(super) const FORGET_SEAL: &str = "DELETE FROM ordo.partition_seals WHERE upper_bound = $1";

/// Whether a source transaction has events on both sides of `$2` (from `$1` on).
pub(super) const STRADDLES: &str = r#"
SELECT EXISTS (
    SELECT 1 FROM ordo.events AS a
    JOIN ordo.events AS b ON b.commit_xid = a.commit_xid
    WHERE a.sequence >= $1 AND a.sequence < $2 AND a.commit_xid IS NOT NULL AND b.sequence >= $2)
"#;

/// Serialises retention steps across processes. Taken in each step's transaction, under the
/// step's lock timeout, so a second run waits at most that long before it backs off.
pub(super) const SERIALISE: &str = "SELECT pg_advisory_xact_lock(hashtext('ordo.retention'))";

/// Creating, folding or dropping a partition takes an exclusive lock on the parent table, and
/// a waiting lock request queues every writer behind it. So a step waits briefly for its locks,
/// gives way, and is tried again after a pause (within the run's deadline) rather than stall
/// writers behind a long transaction.
pub(super) const LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '100ms'";

/// The floors after a drop: the lowest event kept (`$1`), and the highest commit sequence gone
/// (`$2`, from trimming the log).
pub(super) const FLOORS: &str = r#"
UPDATE ordo.partitioning
SET events_floor = $1,
    commit_floor = $2,
    updated_at = now()
"#;

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
