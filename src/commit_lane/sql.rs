//! The commit lane's statements, in one place.
//!
//! The log is stored as chunks (`ordo.commit_chunks`, one row per append of at most 1,024
//! entries, see the migration `20261130000600_commit_chunks.sql` for why) and read as entries
//! through `unnest`. Every statement here is shaped so that its plan stays cheap on a fresh
//! database whose tables have no statistics: a stock server JIT-compiles any plan whose cost
//! estimate crosses `jit_above_cost`, which costs hundreds of milliseconds on statements that
//! run in well under one (`tests/plans.rs` checks each of them). The state row is read through
//! `LIMIT 1`: without statistics the planner guesses hundreds of rows for a one-page table and
//! multiplies everything joined to it.

/// The sequencer's restart point, in one statement (one snapshot): the log head, the cursor,
/// and the groups already logged above the cursor (a group straddles the cursor when it was
/// appended whole while the fold had only reached its first member), with each group's highest
/// logged sequence. Reading these apart lets a peer's append slip between them and leaves a
/// head that disagrees with the skip set.
pub(crate) const RESTART: &str = r#"
WITH s AS MATERIALIZED (
    SELECT last_commit_seq, logged_through_sequence
    FROM ordo.sequencer_state WHERE singleton LIMIT 1
),
logged AS MATERIALIZED (
    SELECT e.commit_xid AS xid, max(u.sequence) AS top
    FROM s
    JOIN ordo.commit_chunks AS c ON c.max_sequence > s.logged_through_sequence
    CROSS JOIN LATERAL unnest(c.sequences) AS u(sequence)
    JOIN ordo.events AS e ON e.sequence = u.sequence
    WHERE u.sequence > s.logged_through_sequence
    GROUP BY e.commit_xid
)
SELECT s.last_commit_seq,
       s.logged_through_sequence,
       coalesce((SELECT array_agg(xid ORDER BY xid) FROM logged), '{}') AS xids,
       coalesce((SELECT array_agg(top ORDER BY xid) FROM logged), '{}') AS maxes
FROM s
"#;

/// After a refused compare-and-set: the state row and the entries a peer appended above the
/// head this process knows (`$1`), at most `$2` of them, with each entry's transaction, in one
/// snapshot. The sequencer continues from what the peer appended instead of restarting.
/// Always at least one row (entry columns NULL when there is none).
pub(crate) const CATCH_UP: &str = r#"
WITH s AS MATERIALIZED (
    SELECT last_commit_seq, logged_through_sequence
    FROM ordo.sequencer_state WHERE singleton LIMIT 1
)
SELECT s.last_commit_seq, s.logged_through_sequence,
       l.commit_seq, l.sequence, l.group_last, e.commit_xid
FROM s
LEFT JOIN LATERAL (
    SELECT r.commit_seq, r.sequence, r.group_last
    FROM ordo.commit_log_range($1, s.last_commit_seq) AS r
    ORDER BY r.commit_seq
    LIMIT $2
) AS l ON TRUE
LEFT JOIN ordo.events AS e ON e.sequence = l.sequence
ORDER BY l.commit_seq
"#;

/// Appends whole groups under a compare-and-set on the state row.
///
/// `$1` the cursor this process expects, `$2` the new cursor, `$3`/`$4` the groups in log order
/// as (commit_xid, the first sequence the fold met). Members are looked up here, on the server,
/// so a group of any size is never materialised by the client; they are stored as chunks of at
/// most 1,024 entries (the table's CHECK). Each returned entry names its group (`ord`, 1-based
/// in the plan).
///
/// The first member the fold meets is the group's lowest sequence, so a planned group whose
/// transaction has a row *below* it was logged before: the row met is foreign to the schema
/// contract (a `commit_xid` written by hand). Such a group is left out (no entry comes back for
/// its `ord`) rather than logged twice; the lookup by `commit_xid` costs the same either way.
/// The lookup is one `commit_xid = ANY(...)` index scan per partition for the whole plan, not
/// a probe per group: per group, a nested loop's rescan of the partitions cost more than the
/// index descent itself (cold fold of single-event transactions, 66,000 groups/s before). The
/// scan is a CTE of its own (`found`), joined to the plan afterwards: written as one join, the
/// *generic* plan a prepared statement switches to after five executions estimates the
/// `unnest` at 10 rows and probes the index once per group with the whole array as a second
/// key, each probe sorting and walking the array again: quadratic, 2.3 s for one append of
/// 5,000 groups on this machine where the split form takes 19 ms (`EXPLAIN ANALYZE` under
/// `plan_cache_mode = force_generic_plan`; `tests/plans.rs` checks it).
///
/// A group's first and last members come from one window sorted by (`ord`, `sequence`), the
/// order `members` numbers them in, so that sort finds its input in order (PostgreSQL's sort
/// checks for that first): one full sort of the plan's members instead of two, and one window
/// pass fewer. An append of 2,000 single-event groups took 20.0 to 22.9 ms instead of 23.7 to
/// 24.8 (`EXPLAIN ANALYZE`, five and four runs alternated); one of 30, 0.4 to 0.9 ms either way
/// (`PERFORMANCE.md`, session 10).
///
/// The CAS is a column of the locked row: an UPDATE that waited on a peer's lock re-checks its
/// WHERE against the row version the peer committed, so the loser matches nothing and inserts
/// nothing (no row comes back; a CAS that succeeds returns at least one, NULLs for an empty
/// plan). A guard on another table (`NOT EXISTS` in the log) would read this statement's older
/// snapshot and append the group twice.
pub(crate) const APPEND: &str = r#"
WITH plan AS (
    SELECT g.xid, g.low, g.ord
    FROM unnest($3::bigint[], $4::bigint[]) WITH ORDINALITY AS g(xid, low, ord)
),
found AS MATERIALIZED (
    SELECT e.sequence, e.commit_xid
    FROM ordo.events AS e
    WHERE e.commit_xid = ANY ($3::bigint[])
),
candidates AS MATERIALIZED (
    SELECT p.ord, p.low, f.sequence,
           first_value(f.sequence) OVER w AS first,
           last_value(f.sequence) OVER w AS last
    FROM found AS f
    JOIN plan AS p ON p.xid = f.commit_xid
    WINDOW w AS (PARTITION BY p.ord ORDER BY f.sequence
                 ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
),
members AS MATERIALIZED (
    SELECT c.sequence, c.ord,
           row_number() OVER (ORDER BY c.ord, c.sequence) AS rn,
           c.sequence = c.last AS group_last
    FROM candidates AS c
    WHERE c.first = c.low
),
state AS (
    UPDATE ordo.sequencer_state
    SET last_commit_seq = last_commit_seq + (SELECT count(*) FROM members),
        logged_through_sequence = $2,
        updated_at = now()
    WHERE singleton AND logged_through_sequence = $1
    RETURNING last_commit_seq - (SELECT count(*) FROM members) AS base
),
chunks AS (
    INSERT INTO ordo.commit_chunks
        (first_commit_seq, last_commit_seq, min_sequence, max_sequence, sequences, group_last)
    SELECT state.base + min(m.rn), state.base + max(m.rn), min(m.sequence), max(m.sequence),
           array_agg(m.sequence ORDER BY m.rn), array_agg(m.group_last ORDER BY m.rn)
    FROM state, members AS m
    GROUP BY state.base, (m.rn - 1) / 1024
)
SELECT state.base + m.rn AS commit_seq, m.sequence, m.group_last, m.ord
FROM state LEFT JOIN members AS m ON TRUE
ORDER BY m.rn
"#;

/// The log head, for processes that do not run a sequencer.
pub(crate) const HEAD: &str =
    "SELECT last_commit_seq FROM ordo.sequencer_state WHERE singleton LIMIT 1";

/// The log head and how far it covers the insert lane, for the head watcher.
pub(crate) const HEAD_AND_CURSOR: &str = "SELECT last_commit_seq, logged_through_sequence \
     FROM ordo.sequencer_state WHERE singleton LIMIT 1";

/// A page of the log joined to its events, in `(after, upto]`.
pub(crate) const PAGE: &str = r#"
SELECT l.commit_seq, l.group_last, e.sequence, e.commit_xid, e.id,
       e.payload::text AS payload, e.headers::text AS headers, e.recorded_at, e.event_type
FROM ordo.commit_log_range($1, $2) AS l
JOIN ordo.events AS e ON e.sequence = l.sequence
ORDER BY l.commit_seq
LIMIT $3
"#;

/// Retention, once the events below `$1` are gone: the new commit floor (every entry at or
/// below it is an event below `$1`; they are a prefix of the log because groups are ordered by
/// their lowest sequence), with the chunks below it deleted and the one straddling it trimmed.
pub(crate) const TRIM: &str = r#"
WITH boundary AS MATERIALIZED (
    SELECT coalesce(
        (SELECT c.first_commit_seq + u.ord - 2
         FROM ordo.commit_chunks AS c
         CROSS JOIN LATERAL unnest(c.sequences) WITH ORDINALITY AS u(sequence, ord)
         WHERE c.first_commit_seq = (
                   SELECT first_commit_seq FROM ordo.commit_chunks
                   WHERE max_sequence >= $1 ORDER BY first_commit_seq LIMIT 1)
           AND u.sequence >= $1
         ORDER BY u.ord LIMIT 1),
        (SELECT last_commit_seq FROM ordo.sequencer_state WHERE singleton LIMIT 1)) AS floor
),
gone AS (
    DELETE FROM ordo.commit_chunks AS c
    USING boundary AS b
    WHERE c.last_commit_seq <= b.floor
),
trimmed AS (
    UPDATE ordo.commit_chunks AS c
    SET first_commit_seq = b.floor + 1,
        sequences = c.sequences[b.floor - c.first_commit_seq + 2:],
        group_last = c.group_last[b.floor - c.first_commit_seq + 2:],
        min_sequence = (SELECT min(s) FROM unnest(c.sequences[b.floor - c.first_commit_seq + 2:]) AS s)
    FROM boundary AS b
    WHERE c.first_commit_seq <= b.floor AND c.last_commit_seq > b.floor
)
SELECT floor FROM boundary
"#;

/// The commit positions of the given insert sequences (`$1`), for those already logged. Only
/// chunks reaching up to the lowest of them are read, so a wait for fresh writes reads the
/// log's tail.
pub(crate) const POSITIONS_OF: &str = r#"
SELECT u.sequence, c.first_commit_seq + u.ord - 1 AS commit_seq
FROM ordo.commit_chunks AS c
CROSS JOIN LATERAL unnest(c.sequences) WITH ORDINALITY AS u(sequence, ord)
WHERE c.max_sequence >= (SELECT min(s) FROM unnest($1::bigint[]) AS s)
  AND u.sequence = ANY ($1::bigint[])
"#;
