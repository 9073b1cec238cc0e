//! `ordo relay run`, the standalone relay, as real processes: events written by plain SQL (as
//! an application in another language writes them) reach a JetStream stream through one
//! process killed with SIGKILL mid-stream and another started after it, every one at least
//! once, exactly once after the stream's deduplication, in order per key; the second (its URL
//! from ORDO_RELAY_URL) stops on SIGTERM and releases its lease. Bad settings are refused,
//! naming the setting.
#![cfg(all(feature = "cli", feature = "nats", feature = "rabbitmq"))]

use crate::common;

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::brokers::{NATS_ADDR, TestStream, addr, nats_url};
use common::{TestDb, eventually};
use serde_json::Value;
use sqlx::PgPool;

const ORDO_BIN: &str = env!("CARGO_BIN_EXE_ordo");
const KEYS: u32 = 7;
const PATIENCE: Duration = Duration::from_secs(20);

/// Writes events `from..from + count` the way a program in any language would: plain INSERTs,
/// ten to a transaction, keyed by customer in the payload.
async fn insert_by_sql(pool: &PgPool, from: u32, count: u32) {
    for chunk in (from..from + count).collect::<Vec<_>>().chunks(10) {
        let mut tx = pool.begin().await.expect("begin");
        for id in chunk {
            let payload = serde_json::json!({"id": id, "customer": format!("c{}", id % KEYS)});
            sqlx::query(
                "INSERT INTO ordo.events (payload, event_type) VALUES ($1::jsonb, 'parcel.shipped')",
            )
            .bind(payload.to_string())
            .execute(&mut *tx)
            .await
            .expect("insert an event");
        }
        tx.commit().await.expect("commit");
    }
}

/// The relay's flags: short timing, so that a killed process's lease expires in two seconds.
fn relay_args<'a>(stream: &'a TestStream, url: &'a str) -> Vec<&'a str> {
    vec![
        "relay",
        "run",
        "parcels-to-nats",
        "--sink",
        "nats",
        "--url",
        url,
        "--subject-prefix",
        &stream.prefix,
        "--key-from",
        "payload:/customer",
        "--batch-size",
        "20",
        "--per-event-budget",
        "25ms",
        "--batch-deadline",
        "600ms",
        "--lease",
        "2s",
        "--backoff-initial",
        "5ms",
        "--backoff-max",
        "50ms",
        "--progress",
        "1s",
    ]
}

/// An `ordo relay run` process, killed when dropped (a failing test leaves none behind).
struct RelayProcess(Option<Child>);

/// Runs `ordo` with `args`; the sink's URL in ORDO_RELAY_URL when `url_env` gives one.
fn spawn_relay(db: &TestDb, args: &[&str], url_env: Option<&str>) -> RelayProcess {
    let mut command = Command::new(ORDO_BIN);
    match url_env {
        Some(url) => command.env("ORDO_RELAY_URL", url),
        None => command.env_remove("ORDO_RELAY_URL"),
    };
    let child = command
        .args(args)
        .env("DATABASE_URL", &db.url)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ordo relay run");
    RelayProcess(Some(child))
}

impl RelayProcess {
    fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("a running process")
    }

    /// SIGKILL: no shutdown, the lease left to expire.
    fn kill(&mut self) {
        let child = self.child();
        child.kill().expect("SIGKILL ordo relay run");
        let _ = child.wait();
    }

    /// SIGTERM, then its exit and what it logged.
    fn terminate(mut self) -> Output {
        let child = self.0.take().expect("a running process");
        let sent = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "SIGTERM to ordo relay run");
        child.wait_with_output().expect("ordo relay run ends")
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Every event in the stream once (by `Nats-Msg-Id`), every customer's in id order; the ids
/// the stream holds.
async fn stream_ids_once_in_key_order(stream: &TestStream) -> Vec<u64> {
    let mut seen = HashSet::new();
    let mut last_of_key: HashMap<String, u64> = HashMap::new();
    let mut ids = Vec::new();
    for message in stream.messages().await {
        let event: Value = serde_json::from_slice(&message.payload).expect("a JSON payload");
        let id = event["id"].as_u64().expect("an id");
        let key = event["customer"].as_str().expect("a customer").to_owned();
        let message_id = message
            .headers
            .get("Nats-Msg-Id")
            .expect("a message id")
            .to_string();
        assert!(seen.insert(message_id), "event {id} twice in the stream");
        if let Some(before) = last_of_key.insert(key.clone(), id) {
            assert!(before < id, "customer {key}: event {id} after {before}");
        }
        let header_key = message.headers.get("Ordo-Key").map(|k| k.to_string());
        assert_eq!(header_key.as_deref(), Some(key.as_str()), "the key travels");
        ids.push(id);
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_relay_killed_mid_stream_delivers_every_sql_written_event_once_in_key_order() {
    let db = TestDb::new().await;
    let stream = TestStream::new().await;
    let url = nats_url(addr(NATS_ADDR));
    let args = relay_args(&stream, &url);
    insert_by_sql(&db.pool, 0, 200).await;

    let mut first = spawn_relay(&db, &args, None);
    // More events arrive while the first process delivers.
    let writer = {
        let pool = db.pool.clone();
        tokio::spawn(async move { insert_by_sql(&pool, 200, 200).await })
    };
    assert!(
        eventually(PATIENCE, || async { stream.len().await >= 40 }).await,
        "the first relay process delivered nothing"
    );
    first.kill();
    let at_kill = stream.len().await;
    assert!(at_kill < 400, "the relay was not killed mid-stream");
    writer.await.expect("the writer");
    // Its lease was not released: it expires, and the next process takes over.
    let leased: Option<uuid::Uuid> = sqlx::query_scalar(
        "SELECT lease_owner FROM ordo.subscriptions WHERE name = 'parcels-to-nats'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("the relay's row");
    assert!(leased.is_some(), "a killed process released its lease");

    // The same relay, its URL from the environment this time.
    let without_url: Vec<&str> = args
        .iter()
        .copied()
        .filter(|arg| *arg != "--url" && *arg != url)
        .collect();
    let second = spawn_relay(&db, &without_url, Some(&url));
    insert_by_sql(&db.pool, 400, 50).await;
    let all = eventually(PATIENCE, || async { stream.len().await >= 450 }).await;
    let output = second.terminate();
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(all, "not every event reached the stream: {log}");
    assert!(output.status.success(), "a graceful stop exits 0: {log}");
    assert!(log.contains("relay started"), "{log}");
    assert!(log.contains("delivering: this process holds"), "{log}");
    assert!(
        log.contains("relay stopped; its lease is released"),
        "{log}"
    );

    let mut ids = stream_ids_once_in_key_order(&stream).await;
    ids.sort_unstable();
    assert_eq!(ids, (0..450).collect::<Vec<u64>>(), "every event, once");
    let (position, owner, stalled): (i64, Option<uuid::Uuid>, i64) = sqlx::query_as(
        "SELECT position, lease_owner,
                (SELECT count(*) FROM ordo.subscription_progress p
                  WHERE p.subscription = 'parcels-to-nats' AND p.state <> 'done')
           FROM ordo.subscriptions WHERE name = 'parcels-to-nats'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("the relay's row");
    assert_eq!(position, 450, "the watermark reached the head");
    assert_eq!(owner, None, "SIGTERM released the lease");
    assert_eq!(stalled, 0, "nothing failed or parked");
}

/// Runs `ordo` with `args`, which must fail (within 20 s: a relay that accepted its settings
/// would run until stopped, so it is killed and the test fails); its stderr.
fn refused(db: &TestDb, args: &[&str]) -> String {
    let mut child = Command::new(ORDO_BIN)
        .args(args)
        .env("DATABASE_URL", &db.url)
        .env_remove("ORDO_RELAY_URL")
        .env_remove("ORDO_WEBHOOK_SECRET")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ordo relay run");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("poll ordo").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("accepted, and running: {args:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output: Output = child.wait_with_output().expect("ordo's output");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "accepted: {args:?}: {stderr}");
    stderr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_settings_are_refused_naming_the_setting_before_anything_runs() {
    let db = TestDb::new().await;
    let base = [
        "relay",
        "run",
        "orders",
        "--sink",
        "nats",
        "--url",
        "nats://127.0.0.1:4222",
        "--key-from",
        "event-type",
    ];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        base.iter().chain(extra).copied().collect()
    };

    // The relay's timing rule, as the library checks it, in the flags' names.
    let timing = refused(&db, &with(&["--batch-deadline", "40s"]));
    assert!(timing.contains("--batch-deadline/--lease"), "{timing}");
    let budget = refused(
        &db,
        &with(&["--batch-size", "1000", "--per-event-budget", "1s"]),
    );
    assert!(
        budget.contains("--batch-size/--per-event-budget/--batch-deadline"),
        "{budget}"
    );
    // A sink's per-message timeout at or past the deadline: never blamed.
    let patient = refused(
        &db,
        &with(&["--ack-timeout", "20s", "--batch-deadline", "5s"]),
    );
    assert!(
        patient.contains("--ack-timeout/--batch-deadline"),
        "{patient}"
    );
    // A sink's own settings.
    let prefix = refused(&db, &with(&["--subject-prefix", "a..b"]));
    assert!(prefix.contains("--subject-prefix"), "{prefix}");
    let foreign = refused(&db, &with(&["--exchange", "orders"]));
    assert!(
        foreign.contains("--exchange is a setting of --sink rabbitmq"),
        "{foreign}"
    );
    let detail = refused(
        &db,
        &[
            "relay",
            "run",
            "orders",
            "--sink",
            "rabbitmq",
            "--url",
            "amqp://127.0.0.1:5672",
            "--key-from",
            "event-type",
            "--detail-headers",
        ],
    );
    assert!(
        detail.contains("--detail-headers is a setting of --sink nats"),
        "{detail}"
    );
    // Required settings, and what they accept.
    let no_keys = refused(&db, &base[..7]);
    assert!(no_keys.contains("--key-from is required"), "{no_keys}");
    let bad_keys = refused(&db, &[&base[..7], &["--key-from", "customer"]].concat());
    assert!(bad_keys.contains("not a key source"), "{bad_keys}");
    // No secret on the command line.
    let mut credentials = base.to_vec();
    credentials[6] = "nats://user:secret@127.0.0.1:4222";
    let secret = refused(&db, &credentials);
    assert!(
        secret.contains("--url carries credentials") && !secret.contains("user:secret"),
        "{secret}"
    );
    let webhook = refused(
        &db,
        &[
            "relay",
            "run",
            "hooks",
            "--sink",
            "webhook",
            "--url",
            "https://h.example/in",
            "--key-from",
            "none",
        ],
    );
    assert!(webhook.contains("ORDO_WEBHOOK_SECRET"), "{webhook}");

    // A file: its lines are the flags' names; the flags override it; a bad line is named.
    let file = tempfile(
        "# orders\nname = orders\nsink = nats\nurl = nats://127.0.0.1:4222\n\
                             key-from = event-type\nbatch-size = 10\nbatch-deadline = 1s\nlease = 20s\n",
    );
    let path = file.path();
    let overridden = refused(&db, &["relay", "run", "--config", &path, "--lease", "1s"]);
    assert!(
        overridden.contains("--batch-deadline/--lease"),
        "{overridden}"
    );
    file.write("sink = nats\nbatch-sise = 10\n");
    let line = refused(&db, &["relay", "run", "orders", "--config", &path]);
    assert!(
        line.contains("line 2: unknown setting `batch-sise`"),
        "{line}"
    );

    let relays: i64 = sqlx::query_scalar("SELECT count(*) FROM ordo.subscriptions")
        .fetch_one(&db.pool)
        .await
        .expect("count");
    assert_eq!(relays, 0, "a refused relay left a row");
}

/// A settings file in the temporary directory, removed when dropped.
struct TempFile(std::path::PathBuf);

fn tempfile(text: &str) -> TempFile {
    let path = std::env::temp_dir().join(format!("ordo_relay_{}.conf", uuid::Uuid::new_v4()));
    let file = TempFile(path);
    file.write(text);
    file
}

impl TempFile {
    fn path(&self) -> String {
        self.0.display().to_string()
    }

    fn write(&self, text: &str) {
        let mut file = std::fs::File::create(&self.0).expect("create the settings file");
        file.write_all(text.as_bytes()).expect("write it");
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
