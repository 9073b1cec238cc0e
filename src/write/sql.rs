//! The write side's statements.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::pooler::Statements;
use crate::position::EventSequence;
use crate::telemetry::HotStatement;

/// Inserts a transaction's buffered events in one statement.
///
/// It names only the columns a writer role may insert (`id`, `payload`, `headers`; see
/// `ordo.grant_writer`): `commit_xid`, `sequence` and `recorded_at` come from the column
/// defaults. `commit_xid` is declared before `sequence`, and PostgreSQL evaluates the defaults
/// of a row in column order, so the transaction id is assigned before the row's `nextval`:
/// every sequence this statement draws belongs to a transaction that already had an xid, which
/// is what the insert lane's abandonment proof needs (`tests/roles.rs` checks it). The rows
/// draw their sequences in `ord` order, so events keep the order they were published in.
pub(crate) const INSERT_EVENTS: &str = r#"
INSERT INTO ordo.events (id, payload, headers, event_type)
SELECT e.id, e.payload::jsonb, e.headers::jsonb, e.event_type
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS e(id, payload, headers, event_type, ord)
ORDER BY e.ord
RETURNING id, sequence, commit_xid, recorded_at
"#;

/// [`INSERT_EVENTS`] for a single event (most transactions publish one), without the arrays:
/// PostgreSQL plans and runs a one-row `VALUES` insert in less time than an `unnest` of
/// one-element arrays and its sort (about 10% more single-event transactions per second with
/// eight writers, `pgbench` on this schema). Same columns, same defaults, same order of their
/// evaluation.
pub(crate) const INSERT_EVENT: &str = r#"
INSERT INTO ordo.events (id, payload, headers, event_type)
VALUES ($1, $2::text::jsonb, $3::text::jsonb, $4)
RETURNING id, sequence, commit_xid, recorded_at
"#;

/// A row as [`INSERT_EVENTS`] returns it: (id, sequence, commit_xid, recorded_at).
pub(crate) type InsertedRow = (Uuid, EventSequence, i64, DateTime<Utc>);

/// Runs [`INSERT_EVENTS`] (or [`INSERT_EVENT`] for a single event) for one chunk: `ids[i]` with `payloads[i]`, `headers[i]` (JSON
/// texts) and `types[i]`, named or unnamed as `statements` says.
pub(crate) async fn insert_events(
    conn: &mut PgConnection,
    ids: &[Uuid],
    payloads: Vec<&str>,
    headers: Vec<&str>,
    types: &[Option<String>],
    statements: Statements,
) -> Result<Vec<InsertedRow>, sqlx::Error> {
    if let ([id], [payload], [headers], [event_type]) = (ids, &payloads[..], &headers[..], types) {
        let row = sqlx::query_as(INSERT_EVENT)
            .persistent(statements.persistent())
            .bind(id)
            .bind(*payload)
            .bind(*headers)
            .bind(event_type)
            .fetch_one(conn)
            .await?;
        return Ok(vec![row]);
    }
    sqlx::query_as(INSERT_EVENTS)
        .persistent(statements.persistent())
        .bind(ids)
        .bind(payloads)
        .bind(headers)
        .bind(types)
        .fetch_all(conn)
        .await
}

/// The server's word on transaction `$1`: `committed`, `aborted`, `in progress`, or NULL once
/// it no longer keeps that status. `commit_xid` is the full 64-bit transaction id
/// (`pg_current_xact_id()`), which `pg_xact_status` takes as `xid8`. Not proof on its own: a
/// server promoted after a failover gives a lost transaction's id to one of its own, so
/// `in_doubt::status` asks [`STORED_BY`] with the events' ids before it says committed (and
/// after this, so that a commit in between is seen by that second question).
pub(crate) const COMMIT_STATUS: &str = r#"
SELECT pg_xact_status($1::bigint::text::xid8)
"#;

/// Runs [`COMMIT_STATUS`] for `xid`: `pg_xact_status`'s answer, or NULL when unknown.
pub(crate) async fn commit_status(pool: &PgPool, xid: i64) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(COMMIT_STATUS)
        .bind(xid)
        .fetch_one(pool)
        .await
}

/// Whether transaction `$1` stored any of the events `$2` (ids it published).
pub(crate) const STORED_BY: &str = r#"
SELECT EXISTS (SELECT 1 FROM ordo.events WHERE id = ANY($2::uuid[]) AND commit_xid = $1)
"#;

/// Runs [`STORED_BY`].
pub(crate) async fn stored_by(pool: &PgPool, xid: i64, ids: &[Uuid]) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(STORED_BY)
        .bind(xid)
        .bind(ids)
        .fetch_one(pool)
        .await
}

/// Which of the given ids are stored as events (`ordo.events.id` is indexed, not unique).
pub(crate) const PUBLISHED: &str = r#"
SELECT DISTINCT id FROM ordo.events WHERE id = ANY($1::uuid[]) AND commit_xid IS NOT NULL
"#;

/// Runs [`PUBLISHED`]: which of `ids` are stored as committed events.
pub(crate) async fn published(pool: &PgPool, ids: &[Uuid]) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar(PUBLISHED)
        .bind(ids)
        .fetch_all(pool)
        .await
}

/// This file's statements on ordo's hot paths, with sample arguments, for `ops::plans`
/// (`tests/ops/plans.rs` fails if PostgreSQL would JIT-compile any).
pub(crate) const HOT_PATH: &[HotStatement] = &[
    HotStatement {
        name: "write: insert events",
        sql: INSERT_EVENTS,
        types: "uuid[], text[], text[], text[]",
        args: "ARRAY['0190c9d2-0000-7000-8000-000000000001']::uuid[], ARRAY['{}']::text[], ARRAY['{}']::text[], ARRAY['Placed']::text[]",
        session: &[],
    },
    HotStatement {
        name: "write: insert one event",
        sql: INSERT_EVENT,
        types: "uuid, text, text, text",
        args: "'0190c9d2-0000-7000-8000-000000000001', '{}', '{}', 'Placed'",
        session: &[],
    },
];
