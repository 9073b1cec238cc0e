//! The write side's statements.

/// Inserts a transaction's buffered events in one statement.
///
/// The transaction id is obtained in a subquery the rows are joined to, so it is assigned
/// before the first `nextval`: every sequence this statement draws belongs to a transaction that
/// already had an xid, which is what the insert lane's abandonment proof needs.
pub(crate) const INSERT_EVENTS: &str = r#"
INSERT INTO ordo.events (commit_xid, sequence, id, payload, headers, event_type)
SELECT tx.xid, nextval('ordo.events_sequence'), e.id, e.payload::jsonb, e.headers::jsonb, e.event_type
FROM (SELECT pg_current_xact_id()::text::bigint AS xid) AS tx
CROSS JOIN unnest($1::uuid[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS e(id, payload, headers, event_type, ord)
ORDER BY e.ord
RETURNING id, sequence, commit_xid, recorded_at
"#;

/// A cross-process wake-up: carries only the highest sequence this process has committed.
pub(crate) const NOTIFY: &str = "SELECT pg_notify($1, $2)";
