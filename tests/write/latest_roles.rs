//! Latest values under least-privilege roles: a writer publishes only through
//! `ordo.publish_latest` (it cannot write a version of its own), and a reader follows but
//! cannot publish. The privileges on the latest-value objects are granted here by hand, as the
//! list `docs/latest-values.md` gives; `ordo.grant_writer`/`grant_reader` will carry them.

use crate::common;

use std::str::FromStr;
use std::time::Duration;

use common::{TestDb, server_url};
use futures::StreamExt;
use ordo::{Error, Grants, Outbox, OutboxConfig};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const PATIENCE: Duration = Duration::from_secs(30);

/// Roles are cluster-wide: unique names, dropped when the guard is (after the test's database,
/// which holds their privileges: declare the guard first).
struct RoleGuard(Vec<String>);

impl RoleGuard {
    async fn create(kinds: &[&str]) -> RoleGuard {
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let mut guard = RoleGuard(Vec::new());
        let server = PgPool::connect(server_url()).await.expect("connect");
        for kind in kinds {
            let role = format!("ordo_test_{}_{kind}", &tag[..12]);
            guard.0.push(role.clone());
            exec(&server, &format!("CREATE ROLE {role} LOGIN")).await;
        }
        server.close().await;
        guard
    }
}

impl Drop for RoleGuard {
    fn drop(&mut self) {
        let roles = std::mem::take(&mut self.0);
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                let Ok(server) = PgPool::connect(server_url()).await else {
                    return;
                };
                for role in roles {
                    let sql = format!("DROP ROLE IF EXISTS {role}");
                    let _ = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&server).await;
                }
                server.close().await;
            });
        })
        .join();
    }
}

async fn exec(pool: &PgPool, sql: &str) {
    sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn pool_as(db: &TestDb, role: &str) -> PgPool {
    let options = PgConnectOptions::from_str(&db.url)
        .expect("a valid database URL")
        .username(role);
    PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(PATIENCE)
        .connect_with(options)
        .await
        .expect("connect")
}

/// Whether `result` failed for want of a privilege (SQLSTATE 42501).
fn denied<T: std::fmt::Debug>(result: Result<T, sqlx::Error>) -> bool {
    match result {
        Err(sqlx::Error::Database(error)) => error.code().as_deref() == Some("42501"),
        other => panic!("expected a permission error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_publishes_only_through_the_function_and_a_reader_follows() {
    let roles = RoleGuard::create(&["writer", "reader"]).await;
    let db = TestDb::new().await;
    let (writer, reader) = (&roles.0[0], &roles.0[1]);
    let grants = Grants::writer(writer).and(Grants::reader(reader));
    ordo::admin::grant(&db.pool, &grants).await.expect("grant");

    let writer_pool = pool_as(&db, writer).await;
    let reader_pool = pool_as(&db, reader).await;
    let publisher = Outbox::<serde_json::Value>::new(writer_pool.clone(), OutboxConfig::default())
        .await
        .expect("writer outbox");
    let follower =
        Outbox::<serde_json::Value>::new(reader_pool.clone(), OutboxConfig::new().sequencer(false))
            .await
            .expect("reader outbox");
    let mut at_writer = publisher.latest::<u32>(["flags"]).expect("stream");
    let mut at_reader = follower.latest::<u32>(["flags"]).expect("stream");

    for n in 1..=3u32 {
        let version = publisher
            .publish_latest("flags", &n)
            .await
            .expect("publish");
        assert_eq!(version, u64::from(n));
    }
    for stream in [&mut at_writer, &mut at_reader] {
        loop {
            let item = tokio::time::timeout(PATIENCE, stream.next())
                .await
                .expect("a value in time")
                .expect("open")
                .expect("a value");
            if item.version == 3 {
                assert_eq!(*item.payload, 3);
                break;
            }
        }
    }

    // No version of the writer's own, nor a value around the function.
    let forged = sqlx::query("UPDATE ordo.latest_values SET version = 1")
        .execute(&writer_pool)
        .await;
    assert!(denied(forged), "a writer wrote a version");
    let forged = sqlx::query(
        "INSERT INTO ordo.latest_values (event_type, payload, version) VALUES ('x', '1', 99)",
    )
    .execute(&writer_pool)
    .await;
    assert!(denied(forged), "a writer inserted a row");
    match follower.publish_latest("flags", &9).await {
        Err(Error::Database(error)) => assert!(denied::<()>(Err(error)), "a reader published"),
        other => panic!("expected a permission error, got {other:?}"),
    }

    publisher.shutdown().await;
    follower.shutdown().await;
    writer_pool.close().await;
    reader_pool.close().await;
}
