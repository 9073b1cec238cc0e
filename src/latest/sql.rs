//! The latest values' statements.

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool};

use super::LatestRow;
use crate::envelope::Headers;
use crate::pooler::Statements;
use crate::telemetry::HotStatement;

/// Upserts a value and notifies `ordo_latest` at commit, through the function of migration
/// `20261201000300` (the only write a writer role may make here). Returns the version.
pub(crate) const PUBLISH: &str = "SELECT ordo.publish_latest($1, $2::jsonb, $3::jsonb)";

/// The current rows of the given types (those that have one).
pub(crate) const READ: &str = r#"
SELECT event_type, version, payload::text AS payload, headers, updated_at
FROM ordo.latest_values
WHERE event_type = ANY($1::text[])
"#;

/// Runs [`PUBLISH`] on `conn`: `payload` and `headers` are JSON texts.
pub(crate) async fn publish(
    conn: &mut PgConnection,
    event_type: &str,
    payload: &str,
    headers: &str,
    statements: Statements,
) -> Result<u64, sqlx::Error> {
    let version: i64 = sqlx::query_scalar(PUBLISH)
        .persistent(statements.persistent())
        .bind(event_type)
        .bind(payload)
        .bind(headers)
        .fetch_one(conn)
        .await?;
    // The column's CHECK keeps it positive.
    Ok(version.unsigned_abs())
}

/// A row as [`READ`] returns it.
#[derive(sqlx::FromRow)]
struct ReadRow {
    event_type: String,
    version: i64,
    payload: String,
    headers: Json<Headers>,
    updated_at: DateTime<Utc>,
}

/// Runs [`READ`] for `types`.
pub(crate) async fn read(pool: &PgPool, types: &[String]) -> Result<Vec<LatestRow>, sqlx::Error> {
    let rows: Vec<ReadRow> = sqlx::query_as(READ).bind(types).fetch_all(pool).await?;
    Ok(rows
        .into_iter()
        .map(|row| LatestRow {
            event_type: row.event_type,
            version: row.version.unsigned_abs(),
            payload: row.payload,
            headers: row.headers.0,
            updated_at: row.updated_at,
        })
        .collect())
}

/// This file's statements on ordo's hot paths, with sample arguments, for `ops::plans`
/// (`tests/ops/plans.rs` fails if PostgreSQL would JIT-compile any).
pub(crate) const HOT_PATH: &[HotStatement] = &[
    HotStatement {
        name: "latest values: publish",
        sql: PUBLISH,
        types: "text, text, text",
        args: "'fx.rate', '{\"micros\": 1}', '{}'",
        session: &[],
    },
    HotStatement {
        name: "latest values: read",
        sql: READ,
        types: "text[]",
        args: "ARRAY['fx.rate', 'flags']::text[]",
        session: &[],
    },
];
