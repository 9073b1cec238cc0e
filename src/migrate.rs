//! Embedded migrations.

use sqlx::PgPool;
use sqlx::migrate::Migrator;

use crate::error::Result;

/// The table in which ordo records its applied migrations. It lives in the `ordo` schema, so
/// ordo's history never mixes with an application's own `_sqlx_migrations`.
pub const MIGRATIONS_TABLE: &str = "ordo._sqlx_migrations";

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
/// serialised by an advisory lock.
///
/// # Errors
/// [`Error::Migrate`](crate::Error::Migrate) when a migration fails or an applied one was
/// modified.
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> ordo::Result<()> {
/// ordo::migrate(&pool).await?;
/// # Ok(()) }
/// ```
pub async fn migrate(pool: &PgPool) -> Result<()> {
    migrator().run(pool).await?;
    Ok(())
}
