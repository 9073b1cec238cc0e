//! The shared test harness: a fresh database per test on a real PostgreSQL server.
//!
//! The server is `DATABASE_URL` when set. Otherwise, when Docker answers, one PostgreSQL
//! container is started for the whole test binary (with the `docker` command). Otherwise the
//! test fails with a message that says how to get a server.
#![allow(dead_code)]

use std::future::Future;
use std::str::FromStr;
use std::sync::OnceLock;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::time::Instant;

pub use databases::with_database;
use databases::{create_database, drop_database_from_drop};

/// A child process this test started, killed (SIGKILL) and reaped when the test ends, passed or
/// not: a failed assertion leaves no process behind.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A database created for one test and dropped when it ends.
pub struct TestDb {
    pub pool: PgPool,
    /// A URL that reaches this database, for other pools and for child processes.
    pub url: String,
    name: String,
}

impl TestDb {
    /// Runs the `ordo` command against this database: (succeeded, stdout, stderr).
    #[cfg(feature = "cli")]
    pub fn ordo(&self, args: &[&str]) -> (bool, String, String) {
        ordo_at(&self.url, args)
    }

    /// Creates a database, runs ordo's migrations in it and returns a pool of 10 connections.
    pub async fn new() -> TestDb {
        Self::with_partition_size(None).await
    }

    /// A database whose partitions hold `size` sequences each (the migration reads the
    /// `ordo.partition_size` setting).
    pub async fn with_partition_size(size: Option<u64>) -> TestDb {
        let server = server_url();
        let name = format!("ordo_test_{}", uuid::Uuid::new_v4().simple());
        create_database(server, &name)
            .await
            .expect("create the test database");
        if let Some(size) = size {
            let admin = PgPool::connect(server)
                .await
                .expect("connect to the test server");
            let sql = format!("ALTER DATABASE {name} SET ordo.partition_size = '{size}'");
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&admin)
                .await
                .expect("set the partition size");
            admin.close().await;
        }
        let url = with_database(server, &name);
        let pool = Self::pool_for(&url, 10).await;
        ordo::migrate(&pool)
            .await
            .expect("migrate the test database");
        TestDb { pool, url, name }
    }

    /// A separate pool on the same database (another "process" for the lanes).
    pub async fn another_pool(&self, size: u32) -> PgPool {
        Self::pool_for(&self.url, size).await
    }

    async fn pool_for(url: &str, size: u32) -> PgPool {
        let options = PgConnectOptions::from_str(url).expect("a valid database URL");
        PgPoolOptions::new()
            .max_connections(size)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options)
            .await
            .expect("connect to the test database")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        drop_database_from_drop(server_url().to_owned(), self.name.clone());
    }
}

/// Runs the `ordo` command against `url` (a database, perhaps as another role):
/// (succeeded, stdout, stderr).
#[cfg(feature = "cli")]
pub fn ordo_at(url: &str, args: &[&str]) -> (bool, String, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ordo"))
        .args(args)
        .env("DATABASE_URL", url)
        .output()
        .expect("run ordo");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// What to do without a server; printed once per test binary, not once per test.
const NO_SERVER: &str = "ordo's tests need PostgreSQL 14+: set DATABASE_URL (for example \
    postgres://postgres@127.0.0.1:5432/postgres, a role that may CREATE DATABASE), \
    or start Docker so that the tests can run one (image postgres:16-alpine)";

/// The server the tests run against. Without one, the first test to ask prints how to get one
/// and every test fails with a one-line pointer to it.
pub fn server_url() -> &'static str {
    static URL: OnceLock<Option<String>> = OnceLock::new();
    let url = URL.get_or_init(|| match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            let started = start_container();
            if let Err(why) = &started {
                eprintln!("{why}");
            }
            started.ok()
        }
    });
    match url {
        Some(url) => url,
        None => {
            panic!("no PostgreSQL server for the tests: see the first failure for how to get one")
        }
    }
}

/// The image the tests start when no server is given: the oldest PostgreSQL ordo supports
/// would do, a current one is what users run.
const IMAGE: &str = "postgres:16-alpine";

/// Starts one PostgreSQL container for this test binary with the `docker` command (no client
/// library: the tests' dependencies stay those of the examples), waits until it takes
/// connections, and leaves a watcher that removes it once this process has exited.
fn start_container() -> Result<String, String> {
    let docker = |args: &[&str]| -> Result<String, String> {
        let output = std::process::Command::new("docker")
            .args(args)
            .output()
            .map_err(|error| format!("docker {}: {error}; {NO_SERVER}", args.join(" ")))?;
        if !output.status.success() {
            return Err(format!(
                "docker {} failed: {}; {NO_SERVER}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    };
    if docker(&["info", "--format", "{{.ServerVersion}}"]).is_err() {
        return Err(NO_SERVER.to_owned());
    }
    let id = docker(&[
        "run",
        "--detach",
        "--rm",
        "--publish",
        "127.0.0.1::5432",
        "--env",
        "POSTGRES_PASSWORD=postgres",
        IMAGE,
        "-c",
        "max_prepared_transactions=16",
    ])?;
    // Removes the container once this test binary has exited, however it ends.
    let watcher = format!(
        "while kill -0 {} 2>/dev/null; do sleep 1; done; docker rm --force {id} >/dev/null 2>&1",
        std::process::id()
    );
    let _ = std::process::Command::new("sh")
        .args(["-c", &watcher])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    let published = docker(&["port", &id, "5432/tcp"])?;
    let port = published
        .lines()
        .next()
        .and_then(|line| line.rsplit(':').next())
        .and_then(|port| port.parse::<u16>().ok())
        .ok_or_else(|| format!("docker port {id}: {published:?} names no port"))?;
    let url = format!("postgres://postgres:postgres@127.0.0.1:{port}/postgres");
    wait_until_ready(&url)?;
    Ok(url)
}

/// Waits up to a minute for the container's server to take a query (its first start runs
/// initdb, then restarts the server once). On a thread of its own: the first test to ask may
/// be running on a runtime already.
fn wait_until_ready(url: &str) -> Result<(), String> {
    let url = url.to_owned();
    std::thread::spawn(move || ready_within_a_minute(&url))
        .join()
        .unwrap_or_else(|_| Err("the thread waiting for the container panicked".to_owned()))
}

fn ready_within_a_minute(url: &str) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| format!("a runtime to wait for the container: {error}"))?;
    runtime.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = match PgPool::connect(url).await {
                Ok(pool) => {
                    let answered = sqlx::query("SELECT 1").execute(&pool).await.is_ok();
                    pool.close().await;
                    answered
                }
                Err(_) => false,
            };
            if ready {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the PostgreSQL container at {url} took no connection within a minute"
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
}

/// Waits for `condition` to hold, polling every 10 ms, up to `limit`. Returns whether it held.
pub async fn eventually<F, Fut>(limit: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if condition().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A runtime of one worker for a victim: what a test kills by dropping it (every task it
/// spawned dies wherever it is, its connections close mid-statement), as a process would be.
pub fn victim_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("victim runtime")
}

/// Runs `work` on a runtime of its own, in a thread, until it returns, then drops the runtime:
/// every task it spawned dies wherever it is and its connections close mid-statement. A
/// killed process (its leases are left to expire).
pub fn run_then_kill<F, Fut>(work: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    std::thread::spawn(move || {
        let runtime = victim_runtime();
        runtime.block_on(work());
        runtime.shutdown_background();
    })
    .join()
    .expect("victim thread");
}

/// The payload type most tests publish.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Note {
    pub writer: u32,
    pub n: u32,
}

/// `transactions` transactions through `outbox` as `writer`: the n-th publishes `n % 3 + 1`
/// notes (`n * 10 + k`), and every seventh (n % 7 == 3) rolls back instead of committing.
pub async fn write_with_rollbacks(outbox: &ordo::Outbox<Note>, writer: u32, transactions: u32) {
    for n in 0..transactions {
        let mut tx = outbox.begin().await.expect("begin");
        for k in 0..=(n % 3) {
            tx.publish(Note {
                writer,
                n: n * 10 + k,
            })
            .expect("publish");
        }
        if n % 7 == 3 {
            tx.rollback().await.expect("rollback");
        } else {
            tx.commit().await.expect("commit");
        }
    }
}
#[cfg(all(feature = "nats", feature = "rabbitmq"))]
pub mod brokers;
pub mod cluster;
pub mod counters;
mod databases;
pub mod http_responder;
pub mod inbox;
pub mod invariants;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod keyed;
pub mod logs;
pub mod lost;
pub mod pgbouncer;
pub mod projection;
pub mod proxy;
pub mod recording_sink;
#[cfg(all(feature = "nats", feature = "rabbitmq"))]
pub mod relays;
pub mod roles;
pub mod subscribers;
pub mod tcp_fault;
