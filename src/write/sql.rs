//! The write side's statements.

/// Inserts a transaction's buffered events in one statement.
///
/// The transaction id is obtained in a subquery the rows are joined to, so it is assigned
/// before the first `nextval`: every sequence this statement draws belongs to a transaction that
/// already had an xid, which is what the insert lane's abandonment proof needs.
pub(crate) const INSERT_EVENTS: &str = r#"
INSERT INTO ordo.events (commit_xid, sequence, id, payload, headers)
SELECT tx.xid, nextval('ordo.events_sequence'), e.id, e.payload::jsonb, e.headers::jsonb
FROM (SELECT pg_current_xact_id()::text::bigint AS xid) AS tx
CROSS JOIN unnest($1::uuid[], $2::text[], $3::text[]) WITH ORDINALITY AS e(id, payload, headers, ord)
ORDER BY e.ord
RETURNING id, sequence, commit_xid, recorded_at
"#;

/// A cross-process wake-up: carries only the highest sequence this process has committed.
pub(crate) const NOTIFY: &str = "SELECT pg_notify($1, $2)";

/// Whether a transaction committed. `commit_xid` is the full 64-bit transaction id
/// (`pg_current_xact_id()`), which `pg_xact_status` takes as `xid8`. When the server no longer
/// keeps that status (NULL), an event stored under the xid still proves it committed.
pub(crate) const COMMIT_STATUS: &str = r#"
SELECT coalesce(
    pg_xact_status($1::bigint::text::xid8),
    CASE WHEN EXISTS (SELECT 1 FROM ordo.events WHERE commit_xid = $1) THEN 'committed' END)
"#;

/// Which of the given ids are stored as events (`ordo.events.id` is indexed, not unique).
pub(crate) const PUBLISHED: &str = r#"
SELECT DISTINCT id FROM ordo.events WHERE id = ANY($1::uuid[]) AND commit_xid IS NOT NULL
"#;
