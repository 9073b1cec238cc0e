//! The write side's statements.

/// Inserts a transaction's buffered events in one statement.
///
/// It names only the columns a writer role may insert (`id`, `payload`, `headers`; see
/// `ordo.grant_writer`): `commit_xid`, `sequence` and `recorded_at` come from the column
/// defaults. `commit_xid` is declared before `sequence`, and PostgreSQL evaluates the defaults
/// of a row in column order, so the transaction id is assigned before the row's `nextval`:
/// every sequence this statement draws belongs to a transaction that already had an xid, which
/// is what the insert lane's abandonment proof needs (`tests/roles.rs` checks it). The rows
/// draw their sequences in `ord` order, so events keep the order they were published in.
pub(super) const INSERT_EVENTS: &str = r#"
INSERT INTO ordo.events (id, payload, headers)
SELECT e.id, e.payload::jsonb, e.headers::jsonb
FROM unnest($1::uuid[], $2::text[], $3::text[]) WITH ORDINALITY AS e(id, payload, headers, ord)
ORDER BY e.ord
RETURNING id, sequence, commit_xid, recorded_at
"#;

/// A cross-process wake-up: carries only the highest sequence this process has committed.
pub(super) const NOTIFY: &str = "SELECT pg_notify($1, $2)";
