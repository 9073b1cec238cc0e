//! Databases owned by a dedicated owner role (which ran the migrations, as in production),
//! with one role of each kind `ordo grant` makes, for the least-privilege tests
//! (`tests/roles.rs`, `tests/ops/least_privilege.rs`).

use std::str::FromStr;
use std::time::Duration;

use ordo::{Error, Grants};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use super::{server_url, with_database};

/// A database owned by a dedicated owner role (which ran the migrations, as in production),
/// and a role of each kind granted through `ordo::admin::grant` (two writers: `writer` and
/// `other`, two applications on one database). Roles are
/// cluster-wide: their names are unique, and `Drop` removes the database and then the roles,
/// whether the test passed or not.
pub struct Roles {
    guard: Guard,
    pub url: String,
    /// A superuser on the database (setup, checks that bypass grants).
    pub admin: PgPool,
    pub owner: String,
    pub writer: String,
    pub reader: String,
    pub operator: String,
    pub publisher: String,
    pub sequencer: String,
    pub consumer: String,
    pub other: String,
}

pub struct Guard {
    database: String,
    roles: Vec<String>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let database = self.database.clone();
        let roles = self.roles.clone();
        let server = server_url().to_owned();
        let dropped = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                let Ok(admin) = PgPool::connect(&server).await else {
                    return;
                };
                // The database first: the roles own objects and hold privileges in it.
                let sql = format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)");
                let _ = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&admin).await;
                for role in roles.iter().rev() {
                    let sql = format!("DROP ROLE IF EXISTS {}", quote(role));
                    let _ = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&admin).await;
                }
                admin.close().await;
            });
        });
        let _ = dropped.join();
    }
}

/// A quoted identifier, for test set-up only (the library binds role names instead).
pub fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

impl Roles {
    pub async fn new(partition_size: u64) -> Roles {
        Roles::migrated_to(partition_size, None).await
    }

    /// As [`new`](Self::new), with the schema migrated up to `version` only (an older ordo's
    /// schema, for upgrade tests); the grants are that version's.
    pub async fn migrated_to(partition_size: u64, version: Option<i64>) -> Roles {
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let name = |kind: &str| format!("ordo_test_{}_{kind}", &tag[..12]);
        let mut guard = Guard {
            database: format!("ordo_test_{tag}"),
            roles: Vec::new(),
        };
        let server = PgPool::connect(server_url()).await.expect("connect");
        let (owner, writer, reader, operator) = (
            name("owner"),
            name("writer"),
            name("reader"),
            name("operator"),
        );
        let (publisher, sequencer, consumer, other) = (
            name("publisher"),
            name("sequencer"),
            name("consumer"),
            name("other"),
        );
        for role in [
            &owner, &writer, &reader, &operator, &publisher, &sequencer, &consumer, &other,
        ] {
            // Registered before it exists, so a failure half-way still removes it.
            guard.roles.push(role.clone());
            exec(&server, &format!("CREATE ROLE {} LOGIN", quote(role))).await;
        }
        exec(
            &server,
            &format!("CREATE DATABASE {} OWNER {}", guard.database, quote(&owner)),
        )
        .await;
        exec(
            &server,
            &format!(
                "ALTER DATABASE {} SET ordo.partition_size = '{partition_size}'",
                guard.database
            ),
        )
        .await;
        server.close().await;
        let url = with_database(server_url(), &guard.database);
        let admin = pool(&url, None, 4).await;
        let roles = Roles {
            guard,
            url,
            admin,
            owner,
            writer,
            reader,
            operator,
            publisher,
            sequencer,
            consumer,
            other,
        };
        // Migrated by the owner, as in production: ordo's objects belong to a role that is
        // not a superuser, so an operator can be made a member of it.
        let owner_pool = roles.pool_as(&roles.owner, 2).await;
        match version {
            None => ordo::migrate(&owner_pool).await.expect("migrate as owner"),
            Some(version) => ordo::migrator()
                .run_to(version, &owner_pool)
                .await
                .expect("migrate as owner to an older schema"),
        }
        owner_pool.close().await;
        let grants = Grants::writer(&roles.writer)
            .and(Grants::reader(&roles.reader))
            .and(Grants::operator(&roles.operator))
            .and(Grants::publisher(&roles.publisher))
            .and(Grants::sequencer(&roles.sequencer))
            .and(Grants::consumer(&roles.consumer))
            .and(Grants::writer(&roles.other));
        ordo::admin::grant(&roles.admin, &grants)
            .await
            .expect("grant");
        roles
    }

    pub async fn pool_as(&self, role: &str, size: u32) -> PgPool {
        pool(&self.url, Some(role), size).await
    }

    /// Registers a role the test creates, so that it is dropped at the end.
    pub fn adopt(&mut self, role: &str) {
        self.guard.roles.push(role.to_owned());
    }
}

/// `url` with `role` as its user (the test roles log in without a password).
pub fn url_as(url: &str, role: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let host = rest.split_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://{role}@{host}")
}

pub async fn pool(url: &str, role: Option<&str>, size: u32) -> PgPool {
    let mut options = PgConnectOptions::from_str(url).expect("a valid database URL");
    if let Some(role) = role {
        options = options.username(role);
    }
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await
        .expect("connect")
}

pub async fn exec(pool: &PgPool, sql: &str) {
    sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Whether `result` failed for want of a privilege (SQLSTATE 42501).
pub fn denied<T: std::fmt::Debug>(result: Result<T, sqlx::Error>) -> bool {
    match result {
        Err(sqlx::Error::Database(error)) => error.code().as_deref() == Some("42501"),
        other => panic!("expected a permission error, got {other:?}"),
    }
}

pub fn denied_ordo<T: std::fmt::Debug>(result: ordo::Result<T>) -> bool {
    match result {
        Err(Error::Database(error)) => denied::<()>(Err(error)),
        other => panic!("expected a permission error, got {other:?}"),
    }
}

pub async fn head(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT last_value FROM ordo.events_sequence")
        .fetch_one(pool)
        .await
        .expect("head")
}
