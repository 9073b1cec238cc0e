//! The commit lane's statements, in one place.

/// The sequencer's restart point, in one statement (one snapshot): the log head, the cursor,
/// and the groups already logged above the cursor (a group straddles the cursor when it was
/// appended whole while the fold had only reached its first member), with each group's highest
/// logged sequence. Reading these apart lets a peer's append slip between them and leaves a
/// head that disagrees with the skip set.
pub(super) const RESTART: &str = r#"
SELECT s.last_commit_seq,
       s.logged_through_sequence,
       coalesce(g.xids, '{}') AS xids,
       coalesce(g.maxes, '{}') AS maxes
FROM ordo.sequencer_state AS s
LEFT JOIN LATERAL (
    SELECT array_agg(xid ORDER BY xid) AS xids, array_agg(top ORDER BY xid) AS maxes
    FROM (
        SELECT e.commit_xid AS xid, max(l.sequence) AS top
        FROM ordo.commit_log AS l
        JOIN ordo.events AS e ON e.sequence = l.sequence
        WHERE l.sequence > s.logged_through_sequence
        GROUP BY e.commit_xid
    ) AS logged
) AS g ON TRUE
WHERE s.singleton
"#;

/// Appends whole groups under a compare-and-set on the state row.
///
/// `$1` the cursor this process expects, `$2` the new cursor, `$3`/`$4` the groups in log order
/// as (commit_xid, lowest unlogged sequence). Members are looked up here, on the server, so a
/// group of any size is never materialised by the client.
///
/// The CAS is a column of the locked row: an UPDATE that waited on a peer's lock re-checks its
/// WHERE against the row version the peer committed, so the loser matches nothing and inserts
/// nothing. A guard on another table (`NOT EXISTS` in the log) would read this statement's older
/// snapshot and append the group twice.
pub(super) const APPEND: &str = r#"
WITH plan AS (
    SELECT g.xid, g.low, g.ord
    FROM unnest($3::bigint[], $4::bigint[]) WITH ORDINALITY AS g(xid, low, ord)
),
members AS (
    SELECT e.sequence,
           row_number() OVER (ORDER BY p.ord, e.sequence) AS rn,
           e.sequence = max(e.sequence) OVER (PARTITION BY p.ord) AS group_last
    FROM plan AS p
    JOIN ordo.events AS e ON e.commit_xid = p.xid AND e.sequence >= p.low
),
total AS (SELECT count(*) AS n FROM members),
state AS (
    UPDATE ordo.sequencer_state
    SET last_commit_seq = last_commit_seq + (SELECT n FROM total),
        logged_through_sequence = $2,
        updated_at = now()
    WHERE singleton AND logged_through_sequence = $1
    RETURNING last_commit_seq - (SELECT n FROM total) AS base
)
INSERT INTO ordo.commit_log (commit_seq, sequence, group_last)
SELECT state.base + m.rn, m.sequence, m.group_last
FROM state, members AS m
ORDER BY m.rn
RETURNING commit_seq, sequence, group_last
"#;

/// The log head, for processes that do not run a sequencer.
pub(crate) const HEAD: &str = "SELECT last_commit_seq FROM ordo.sequencer_state WHERE singleton";

/// A page of the log joined to its events, in `(after, upto]`.
pub(super) const PAGE: &str = r#"
SELECT l.commit_seq, l.group_last, e.sequence, e.commit_xid, e.id,
       e.payload::text AS payload, e.headers::text AS headers, e.recorded_at
FROM ordo.commit_log AS l
JOIN ordo.events AS e ON e.sequence = l.sequence
WHERE l.commit_seq > $1 AND l.commit_seq <= $2
ORDER BY l.commit_seq
LIMIT $3
"#;
