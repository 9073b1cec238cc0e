//! Embedded migrations.

use sqlx::PgPool;
use sqlx::migrate::Migrator;

use crate::error::{Error, Result};

pub use crate::schema::MIGRATIONS_TABLE;

/// Whether ordo's history table exists yet (a database never migrated has none).
const HISTORY_EXISTS: &str = "SELECT to_regclass('ordo._sqlx_migrations') IS NOT NULL";

/// The newest migration applied to this database.
const NEWEST_APPLIED: &str = "SELECT max(version) FROM ordo._sqlx_migrations";

/// Every migration recorded in this database, oldest first.
const APPLIED: &str = "SELECT version FROM ordo._sqlx_migrations ORDER BY version";

/// `CREATE SCHEMA IF NOT EXISTS` and `CREATE TABLE IF NOT EXISTS` send a NOTICE on every run
/// after the first, which sqlx logs at INFO: the migrating session asks for warnings only.
const QUIET: &str = "SET client_min_messages = warning";
const UNQUIET: &str = "RESET client_min_messages";

/// SQLSTATE `insufficient_privilege`.
const INSUFFICIENT_PRIVILEGE: &str = "42501";

/// The migrator for the `ordo` schema, with the `.sql` files of `migrations/` embedded.
///
/// It records its history in [`MIGRATIONS_TABLE`] and ignores migrations it does not know, so
/// it coexists with an application's migrator on the same database. To fold ordo's schema
/// into your own migration set instead, copy the files under `migrations/` of this crate.
pub fn migrator() -> Migrator {
    let mut migrator = sqlx::migrate!("./migrations");
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator.create_schema("ordo");
    migrator.set_ignore_missing(true);
    migrator
}

/// Creates or upgrades the `ordo` schema (tables, sequence, indexes) in the database behind
/// `pool`. Idempotent: already-applied migrations are skipped, and concurrent callers are
/// serialised by an advisory lock. PostgreSQL's notices ("already exists, skipping") are not
/// logged; a debug event says which migration the schema is at.
///
/// # Errors
/// [`Error::SchemaTooNew`](crate::Error::SchemaTooNew) when the database holds a migration
/// newer than any this version knows (a newer ordo migrated it);
/// [`Error::Migrate`](crate::Error::Migrate) when a migration fails or an applied one was
/// modified; [`Error::TransactionPooler`](crate::Error::TransactionPooler) when `pool` goes
/// through a transaction-mode pooler, where the advisory lock cannot be held (migrate on a
/// direct connection).
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> ordo::Result<()> {
/// ordo::migrate(&pool).await?;
/// # Ok(()) }
/// ```
pub async fn migrate(pool: &PgPool) -> Result<()> {
    crate::pooler::require_sessions(
        pool,
        "the pool given to ordo::migrate",
        "migrate on a connection to the server itself or through a session-mode pool",
    )
    .await?;
    check_schema_version(pool).await?;
    let mut conn = pool.acquire().await?;
    sqlx::query(QUIET).execute(&mut *conn).await?;
    let ran = migrator().run(&mut *conn).await;
    // The connection goes back to the pool: it must not keep the quieter setting. If it
    // cannot be reset, it is not reused. Nor after a failed run: sqlx returns its error without
    // releasing the migrator's session advisory lock, which a pooled connection would hold for
    // ever, and every later `migrate`, in any process, would wait for it.
    if ran.is_err() || sqlx::query(UNQUIET).execute(&mut *conn).await.is_err() {
        conn.close_on_drop();
    }
    ran?;
    tracing::debug!(
        target: "ordo::migrate",
        version = newest_known(),
        "the ordo schema is up to date"
    );
    Ok(())
}

/// The newest migration this build embeds.
pub(crate) fn newest_known() -> i64 {
    migrator()
        .iter()
        .map(|migration| migration.version)
        .max()
        .unwrap_or(0)
}

/// The migrations recorded in [`MIGRATIONS_TABLE`] that this build does not embed, oldest
/// first: a newer ordo migrated the database (the migrator passes over them, as it must to
/// coexist with other migration sets, so nothing else says so). Empty when the database was
/// never migrated, and when this role may not read the history (every role `ordo grant` makes
/// may, since migration `20261206000100`).
pub(crate) async fn unknown_migrations(pool: &PgPool) -> Result<Vec<i64>> {
    let exists: bool = sqlx::query_scalar(HISTORY_EXISTS).fetch_one(pool).await?;
    if !exists {
        return Ok(Vec::new());
    }
    let applied: Vec<i64> = match sqlx::query_scalar(APPLIED).fetch_all(pool).await {
        Ok(applied) => applied,
        Err(error) if insufficient_privilege(&error) => return Ok(Vec::new()),
        Err(error) => return Err(error.into()),
    };
    let known: std::collections::HashSet<i64> = migrator()
        .iter()
        .map(|migration| migration.version)
        .collect();
    Ok(applied
        .into_iter()
        .filter(|version| !known.contains(version))
        .collect())
}

fn insufficient_privilege(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|code| code == INSUFFICIENT_PRIVILEGE)
}

/// Refuses a database whose ordo schema was migrated by a newer ordo: this version would read
/// and write a schema it does not know. A database not migrated at all passes (the first
/// statement on a missing table says to migrate), and so does one whose history this role may
/// not read.
pub(crate) async fn check_schema_version(pool: &PgPool) -> Result<()> {
    let exists: bool = sqlx::query_scalar(HISTORY_EXISTS).fetch_one(pool).await?;
    if !exists {
        return Ok(());
    }
    let newest: Option<i64> = match sqlx::query_scalar(NEWEST_APPLIED).fetch_one(pool).await {
        Ok(newest) => newest,
        Err(error) if insufficient_privilege(&error) => return Ok(()),
        Err(error) => return Err(error.into()),
    };
    let known = newest_known();
    match newest {
        Some(database) if database > known => Err(Error::SchemaTooNew { database, known }),
        _ => Ok(()),
    }
}
