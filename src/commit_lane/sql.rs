//! The commit lane's statements, in one place.
//!
//! The log is stored as chunks (`ordo.commit_chunks`, one row per append of at most 1,024
//! entries, see the migration `20261130000600_commit_chunks.sql` for why) and read as entries
//! through `unnest`. Every statement here is shaped so that its plan stays cheap on a fresh
//! database whose tables have no statistics: a stock server JIT-compiles any plan whose cost
//! estimate crosses `jit_above_cost`, which costs hundreds of milliseconds on statements that
//! run in well under one (`tests/ops/plans.rs` checks each of them). The state row is read through
//! `LIMIT 1`: without statistics the planner guesses hundreds of rows for a one-page table and
//! multiplies everything joined to it.

use crate::telemetry::HotStatement;

/// The sequencer's restart point, in one statement (one snapshot): the log head, the cursor,
/// and the groups already logged above the cursor (a group straddles the cursor when it was
/// appended whole while the fold had only reached its first member), with each group's highest
/// logged sequence, and the newest server history (see [`HEAD_AND_CURSOR`]). Reading these apart
/// lets a peer's append slip between them and leaves a head that disagrees with the skip set.
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
       coalesce((SELECT array_agg(top ORDER BY xid) FROM logged), '{}') AS maxes,
       h.history, h.from_commit_seq AS history_from, h.timeline AS history_timeline,
       (extract(epoch FROM pg_catalog.pg_postmaster_start_time()) * 1000000)::bigint AS server_started
FROM s
LEFT JOIN LATERAL (
    SELECT history, from_commit_seq, timeline FROM ordo.commit_histories ORDER BY history DESC LIMIT 1
) AS h ON TRUE
"#;

/// After a refused compare-and-set: the state row and the entries a peer appended above the
/// head this process knows (`$1`), at most `$2` of them, with each entry's transaction, and the
/// newest server history, in one snapshot. The sequencer continues from what the peer appended instead of restarting.
/// Always at least one row (entry columns NULL when there is none).
pub(crate) const CATCH_UP: &str = r#"
WITH s AS MATERIALIZED (
    SELECT last_commit_seq, logged_through_sequence
    FROM ordo.sequencer_state WHERE singleton LIMIT 1
)
SELECT s.last_commit_seq, s.logged_through_sequence, h.history, h.from_commit_seq AS history_from,
       h.timeline AS history_timeline,
       (extract(epoch FROM pg_catalog.pg_postmaster_start_time()) * 1000000)::bigint AS server_started,
       l.commit_seq, l.sequence, l.group_last, e.commit_xid
FROM s
LEFT JOIN LATERAL (
    SELECT history, from_commit_seq, timeline FROM ordo.commit_histories ORDER BY history DESC LIMIT 1
) AS h ON TRUE
LEFT JOIN LATERAL (
    SELECT r.commit_seq, r.sequence, r.group_last
    FROM ordo.commit_log_range($1, s.last_commit_seq) AS r
    ORDER BY r.commit_seq
    LIMIT $2
) AS l ON TRUE
LEFT JOIN ordo.events AS e ON e.sequence = l.sequence
ORDER BY l.commit_seq
"#;

/// Appends whole groups under a compare-and-set on the state row, through
/// `ordo.append_commit_log` (migration `20261206000100_least_privilege.sql`): the function runs
/// as the schema's owner and takes the groups from `ordo.events` itself, so a role that folds
/// holds no direct write on the log or its state and cannot choose what is appended.
///
/// `$1` the cursor this process expects, `$2` the new cursor. The groups appended are the
/// transactions whose lowest event lies in `($1, $2]`, in the order of those lowest events:
/// exactly the groups the fold planned, in its order, since the first member the fold meets is
/// the group's lowest sequence. Each returned entry names its transaction (`commit_xid`); the
/// caller maps it to its plan. A planned group whose transaction has a row *below* the one
/// the fold met was logged before (the row met carries a `commit_xid` written by hand, foreign
/// to the schema contract): no entry comes back for it, rather than it being logged twice. A
/// range with a sequence that has no row yet, or above the sequence head, is refused with
/// SQLSTATE `OR001`. Members are looked up on the server, so a group of any size is never
/// materialised by the client; they are stored as chunks of at most 1,024 entries (the table's
/// CHECK).
///
/// Inside, the lookup of members is one `commit_xid = ANY(...)` index scan per partition for
/// the whole range, a CTE of its own: joined to the groups, the *generic* plan a prepared
/// statement switches to after five executions probed the index once per group with the whole
/// array (quadratic: 2.3 s for one append of 5,000 groups where the split form takes 19 ms,
/// `docs/performance-history.md`, 2026-12-01, `47d5248`).
///
/// The CAS is a column of the locked row: an UPDATE that waited on a peer's lock re-checks its
/// WHERE against the row version the peer committed, so the loser matches nothing and inserts
/// nothing (no row comes back; a CAS that succeeds returns at least one, NULLs for an empty
/// range). A guard on another table (`NOT EXISTS` in the log) would read this statement's older
/// snapshot and append the group twice.
///
/// Always sent alone, on a pooled connection outside any transaction (`store::append`): the
/// function refuses to run inside a transaction that published events (its own xid on rows of
/// `ordo.events`, migration `20261210000400`), and a statement of its own has no xid yet when
/// the function starts, so that check costs the fold nothing.
pub(crate) const APPEND: &str = r#"
SELECT a.commit_seq, a.sequence, a.group_last, a.commit_xid
FROM ordo.append_commit_log($1, $2) AS a
"#;

/// The log head, for processes that do not run a sequencer.
pub(crate) const HEAD: &str =
    "SELECT last_commit_seq FROM ordo.sequencer_state WHERE singleton LIMIT 1";

/// The log head, how far it covers the insert lane, and the newest server history, for the
/// head watcher (and at start).
///
/// The newest history (`ordo.commit_histories`: begun by the first append after a promotion,
/// or by a process that detected a rewind) is how a process learns that positions were given
/// again: one that began at or below a position this process saw gave those positions again,
/// whether or not this process ever read the lower head in between
/// ([`CommitShared::note_history`](super::CommitShared::note_history)).
pub(crate) const HEAD_AND_CURSOR: &str = r#"
SELECT s.last_commit_seq, s.logged_through_sequence, h.history, h.from_commit_seq AS history_from,
       h.timeline AS history_timeline,
       (extract(epoch FROM pg_catalog.pg_postmaster_start_time()) * 1000000)::bigint AS server_started
FROM (SELECT last_commit_seq, logged_through_sequence
      FROM ordo.sequencer_state WHERE singleton LIMIT 1) AS s
LEFT JOIN LATERAL (
    SELECT history, from_commit_seq, timeline FROM ordo.commit_histories ORDER BY history DESC LIMIT 1
) AS h ON TRUE
"#;

/// The server history (PostgreSQL timeline) the server writes on now; NULL on a standby.
pub(crate) const SERVER_HISTORY: &str = "SELECT CASE WHEN pg_catalog.pg_is_in_recovery() \
     THEN NULL ELSE ordo.server_history() END";

/// After the log went back below positions this process saw: what each of them holds now
/// (`now`, NULL while not appended again) and whether the event this process saw there is
/// still stored, with the lowest position the log still holds (`lowest`, NULL for an empty
/// log): a position below it was trimmed by retention with its event, not lost. `$1` the
/// positions, `$2` the event sequences seen at them, `$3` and `$4` the range `(after, upto]`
/// they lie in.
pub(crate) const GONE_BACK: &str = r#"
SELECT p.position, l.sequence AS now,
       EXISTS (SELECT 1 FROM ordo.events AS e
               WHERE e.sequence = p.seen AND e.commit_xid IS NOT NULL) AS stored,
       (SELECT min(c.first_commit_seq) FROM ordo.commit_chunks AS c) AS lowest
FROM unnest($1::bigint[], $2::bigint[]) AS p(position, seen)
LEFT JOIN ordo.commit_log_range($3, $4) AS l ON l.commit_seq = p.position
ORDER BY p.position
"#;

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

/// After a rewind: the new server history ([`new_history`](super::rewind::new_history)), from
/// `ordo.begin_history(known, first_position, lost_through)`, with when the last event the log
/// kept below it was recorded (NULL: none, or retention dropped it): what was written after
/// that may be lost.
pub(crate) const BEGIN_HISTORY: &str = r#"
SELECT b.history, b.from_commit_seq, b.began,
       (SELECT e.recorded_at
        FROM ordo.commit_log_range(b.from_commit_seq - 2, b.from_commit_seq - 1) AS l
        JOIN ordo.events AS e ON e.sequence = l.sequence) AS kept_until
FROM ordo.begin_history($1, $2, $3) AS b
"#;

/// This file's statements on ordo's hot paths, with sample arguments, for `ops::plans`
/// (`tests/ops/plans.rs` fails if PostgreSQL would JIT-compile any). The sequencer's own are
/// planned with the session settings of its connections.
pub(crate) const HOT_PATH: &[HotStatement] = &[
    HotStatement {
        name: "commit lane: restart",
        sql: RESTART,
        types: "",
        args: "",
        session: super::sequencer::SESSION,
    },
    HotStatement {
        name: "commit lane: catch up",
        sql: CATCH_UP,
        types: "bigint, bigint",
        args: "0, 8192",
        session: super::sequencer::SESSION,
    },
    HotStatement {
        name: "commit lane: append",
        sql: APPEND,
        types: "bigint, bigint",
        args: "0, 0",
        session: super::sequencer::SESSION,
    },
    HotStatement {
        name: "commit lane: head",
        sql: HEAD,
        types: "",
        args: "",
        session: &[],
    },
    HotStatement {
        name: "commit lane: head, cursor and history",
        sql: HEAD_AND_CURSOR,
        types: "",
        args: "",
        session: &[],
    },
    HotStatement {
        name: "commit lane: positions gone back",
        sql: GONE_BACK,
        types: "bigint[], bigint[], bigint, bigint",
        args: "ARRAY[9, 10]::bigint[], ARRAY[40, 41]::bigint[], 8, 10",
        session: &[],
    },
    HotStatement {
        name: "commit lane: page",
        sql: PAGE,
        types: "bigint, bigint, bigint",
        args: "0, 512, 512",
        session: &[],
    },
    HotStatement {
        name: "commit lane: retention trim",
        sql: TRIM,
        types: "bigint",
        args: "1000001",
        session: &[],
    },
];
