//! The operations queries, in one place.

/// The positions, in one statement: drawn head, highest committed row, the commit log's state,
/// and whether commit timestamps are tracked.
pub(super) const POSITIONS: &str = r#"
SELECT (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM ordo.events_sequence) AS sequence_head,
       coalesce((SELECT max(sequence) FROM ordo.events), 0) AS committed_head,
       s.last_commit_seq, s.logged_through_sequence,
       now() - s.updated_at AS sequencer_idle,
       current_setting('track_commit_timestamp') = 'on' AS commit_timestamps,
       now() AS measured_at
FROM ordo.sequencer_state AS s
"#;

/// Events committed above the frontier (waiting on the hole) and the age of the oldest, by
/// commit time where tracked, else by `recorded_at`.
pub(super) const INSERT_LAG: &str = r#"
SELECT count(*) FILTER (WHERE payload IS NOT NULL) AS events,
       date_part('epoch', now() - min(CASE WHEN $2 THEN coalesce(pg_xact_commit_timestamp(xmin), recorded_at)
                                           ELSE recorded_at END)) AS age
FROM ordo.events WHERE sequence > $1
"#;

/// Real events at or below the frontier that the commit log does not hold yet.
pub(super) const COMMIT_LAG: &str = r#"
SELECT count(*) AS events,
       date_part('epoch', now() - min(CASE WHEN $3 THEN coalesce(pg_xact_commit_timestamp(e.xmin), e.recorded_at)
                                           ELSE e.recorded_at END)) AS age
FROM ordo.events AS e
WHERE e.sequence > $1 AND e.sequence <= $2 AND e.payload IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM ordo.commit_log AS l WHERE l.sequence = e.sequence)
"#;

/// Each subscription with its lag and the age of the first event it has not handled.
pub(super) const SUBSCRIPTIONS: &str = r#"
SELECT s.name, s.lane, s.position, s.status, s.attempts, s.last_error,
       GREATEST(CASE s.lane WHEN 'commit' THEN $1 ELSE $2 END - s.position, 0) AS lag,
       date_part('epoch', now() - (
           CASE s.lane
           WHEN 'commit' THEN (
               SELECT CASE WHEN $3 THEN coalesce(pg_xact_commit_timestamp(e.xmin), e.recorded_at) ELSE e.recorded_at END
               FROM ordo.commit_log AS l JOIN ordo.events AS e ON e.sequence = l.sequence
               WHERE l.commit_seq = s.position + 1)
           ELSE (
               SELECT CASE WHEN $3 THEN coalesce(pg_xact_commit_timestamp(e.xmin), e.recorded_at) ELSE e.recorded_at END
               FROM ordo.events AS e
               WHERE e.sequence > s.position AND e.payload IS NOT NULL
               ORDER BY e.sequence LIMIT 1)
           END)) AS oldest_unprocessed
FROM ordo.subscriptions AS s
ORDER BY s.name
"#;

/// A probe for the holder of a hole: a placeholder insert that waits on the holder's row if it
/// has one. Run in a transaction that is always rolled back, under a short lock timeout.
/// Through the placeholder function, the one way a writer role may write a placeholder; a role
/// without EXECUTE on it (a reader) gets an error, and the stall names suspects instead.
pub(super) const PROBE: &str = "SELECT ordo.fill_placeholders($1, $1)";

pub(super) const PROBE_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '400ms'";

pub(super) const BACKEND_PID: &str = "SELECT pg_backend_pid()";

pub(super) const BLOCKERS: &str = "SELECT pg_blocking_pids($1)";

/// What operators need to know about a backend.
pub(super) const BACKENDS: &str = r#"
SELECT pid, coalesce(application_name, '') AS application_name, coalesce(state, '') AS state,
       date_part('epoch', now() - xact_start) AS transaction_age,
       left(coalesce(query, ''), 200) AS query
FROM pg_stat_activity
WHERE pid = ANY($1)
ORDER BY xact_start
"#;

/// Transactions holding an xid in this database, oldest first: the suspects when the holder
/// of a hole has not written its row yet.
pub(super) const OPEN_WRITERS: &str = r#"
SELECT pid
FROM pg_stat_activity
WHERE datname = current_database() AND backend_xid IS NOT NULL AND pid <> pg_backend_pid()
  AND xact_start < now() - make_interval(secs => $1)
ORDER BY xact_start
LIMIT 5
"#;
