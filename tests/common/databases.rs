//! Throwaway databases on a PostgreSQL server: made for one test, or one run of a load tool,
//! and dropped after. Shared by the test harness (`tests/common`) and the load tools
//! (`examples/support/scratch.rs` includes this file by path), so both name, reach and drop
//! them the same way.
#![allow(dead_code)]

use sqlx::PgPool;

/// Creates database `name` on `server` (a role that may `CREATE DATABASE`).
pub async fn create_database(server: &str, name: &str) -> Result<(), sqlx::Error> {
    let admin = PgPool::connect(server).await?;
    let created = sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&admin)
        .await;
    admin.close().await;
    created.map(drop)
}

/// Drops database `name` on `server`, closing whatever connections it still has.
pub async fn drop_database(server: &str, name: &str) -> Result<(), sqlx::Error> {
    let admin = PgPool::connect(server).await?;
    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
    let dropped = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&admin).await;
    admin.close().await;
    dropped.map(drop)
}

/// [`drop_database`] from a `Drop` impl: on a thread with a runtime of its own, since `Drop`
/// may run inside a runtime that must not be blocked. Best effort: a failure is ignored.
pub fn drop_database_from_drop(server: String, name: String) {
    let _ = std::thread::spawn(move || {
        if let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            let _ = runtime.block_on(drop_database(&server, &name));
        }
    })
    .join();
}

/// `url` with its database name replaced by `name` (a query string is kept).
pub fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let host = match base[scheme_end..].find('/') {
        Some(slash) => &base[..scheme_end + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{host}/{name}?{query}"),
        None => format!("{host}/{name}"),
    }
}
