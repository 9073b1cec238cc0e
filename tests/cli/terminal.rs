//! What `ordo` writes to a terminal and a pipe, run as real processes: a reader that goes away
//! ends it quietly, no library's log noise reaches the operator, names that only look alike
//! read apart in every list, and log lines show a name escapes and all without acting on it.
#![cfg(feature = "cli")]

use crate::common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{TestDb, eventually};

const ORDO_BIN: &str = env!("CARGO_BIN_EXE_ordo");
const PATIENCE: Duration = Duration::from_secs(30);

/// `ordo ARGS` on `db` with stdout and stderr piped and no RUST_LOG of the test's.
fn spawn(db: &TestDb, args: &[&str]) -> std::process::Child {
    Command::new(ORDO_BIN)
        .args(args)
        .env("DATABASE_URL", &db.url)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ordo")
}

/// Waits for `child` to exit, up to [`PATIENCE`]: its success and its stderr.
fn finish(mut child: std::process::Child) -> (bool, String) {
    let deadline = std::time::Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for ordo") {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "ordo did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        let _ = stderr.read_to_string(&mut err);
    }
    (status.success(), err)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_goes_away_ends_the_command_quietly() {
    let db = TestDb::new().await;
    // Far more than a pipe holds, so that ordo is still writing when the reader leaves.
    sqlx::query(
        "INSERT INTO ordo.subscriptions (name, lane, position, kind) \
         SELECT 'subscription-' || n, 'insert', 0, 'subscription' FROM generate_series(1, 10000) AS n",
    )
    .execute(&db.pool)
    .await
    .expect("ten thousand subscriptions");
    for args in [&["subscriptions", "--json"][..], &["subscriptions"][..]] {
        let mut child = spawn(&db, args);
        let mut stdout = child.stdout.take().expect("stdout");
        let mut first = [0u8; 10];
        stdout.read_exact(&mut first).expect("the first bytes");
        drop(stdout);
        let (ok, err) = finish(child);
        assert!(ok, "ordo {args:?} failed when its reader went away: {err}");
        assert!(err.is_empty(), "ordo {args:?} said: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_statement_is_not_reported_by_the_database_library() {
    let db = TestDb::new().await;
    // Hold the table the command reads until its statement has waited past sqlx's threshold
    // for a "slow statement" warning (1 s).
    let mut holder = db.pool.begin().await.expect("begin");
    sqlx::query("LOCK TABLE ordo.subscriptions IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *holder)
        .await
        .expect("lock");
    let child = spawn(&db, &["subscriptions"]);
    let waited = eventually(PATIENCE, || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND now() - query_start > interval '1.5 seconds')",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap_or(false)
    })
    .await;
    assert!(waited, "ordo subscriptions never waited on the lock");
    holder.commit().await.expect("release the lock");
    let (ok, err) = finish(child);
    assert!(ok, "{err}");
    assert!(err.is_empty(), "the CLI's stderr carried: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_only_look_alike_read_apart_in_every_list() {
    let db = TestDb::new().await;
    let names = ["billing", "billing ", "billing\u{200b}"];
    for name in names {
        sqlx::query(
            "INSERT INTO ordo.subscriptions (name, lane, position, kind) VALUES ($1, 'insert', 0, 'subscription')",
        )
        .bind(name)
        .execute(&db.pool)
        .await
        .expect("a subscription");
        sqlx::query(
            "INSERT INTO ordo.dead_letters (subscription, lane, position, sequence, error, attempts) \
             VALUES ($1, 'insert', 1, 1, 'boom', 1)",
        )
        .bind(name)
        .execute(&db.pool)
        .await
        .expect("a dead letter");
        sqlx::query(
            "INSERT INTO ordo.inbox (consumer, message_id, status, attempts, last_error) \
             VALUES ($1, 'm-1', 'failed', 1, 'boom')",
        )
        .bind(name)
        .execute(&db.pool)
        .await
        .expect("a failed inbox message");
    }
    for args in [
        &["subscriptions"][..],
        &["status"][..],
        &["dead-letters"][..],
        &["inbox", "failed"][..],
    ] {
        let (ok, out, err) = db.ordo(args);
        assert!(ok, "{args:?}: {err}");
        // The table rows: the name is each one's first cell (the dead letters' after their id).
        let shown: Vec<&str> = out
            .lines()
            .filter(|line| line.starts_with("billing") || line.starts_with(' '))
            .filter_map(|line| {
                line.split_whitespace()
                    .find(|word| word.starts_with("billing"))
            })
            .collect();
        assert_eq!(
            shown,
            ["billing", "billing\\u{20}", "billing\\u{200b}"],
            "ordo {args:?}:\n{out}"
        );
    }
    let (ok, out, _) = db.ordo(&["subscriptions", "--json"]);
    assert!(ok);
    assert!(out.contains(r#""name":"billing\u200b""#), "{out}");
}

#[cfg(feature = "http")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relays_log_lines_show_its_name_escaped() {
    use std::io::BufRead;
    use std::sync::{Arc, Mutex};

    let db = TestDb::new().await;
    let name = "mailer\nFORGED line \u{1b}[31m\u{200b}";
    let mut child = Command::new(ORDO_BIN)
        .args([
            "relay",
            "run",
            name,
            "--sink",
            "webhook",
            "--url",
            "http://127.0.0.1:9/hooks",
            "--secret-env",
            "ORDO_TEST_WEBHOOK_SECRET",
            "--key-from",
            "none",
        ])
        .env("DATABASE_URL", &db.url)
        .env(
            "ORDO_TEST_WEBHOOK_SECRET",
            "a webhook secret of 32 bytes...",
        )
        .env_remove("RUST_LOG")
        .env_remove("ORDO_RELAY_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ordo relay run");
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let stderr = child.stderr.take().expect("stderr");
    let reader = {
        let lines = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                lines.lock().expect("lines").push(line);
            }
        })
    };
    // "delivering" is logged once the relay watches for SIGTERM: stopped then, it stops cleanly.
    let started = eventually(PATIENCE, || async {
        lines
            .lock()
            .expect("lines")
            .iter()
            .any(|line| line.contains("delivering"))
    })
    .await;
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let (ok, _) = finish(child);
    let _ = reader.join();
    let lines = lines.lock().expect("lines").clone();
    assert!(started, "no start line: {lines:?}");
    assert!(ok, "{lines:?}");
    assert!(
        lines.iter().all(|line| !line.starts_with("FORGED")
            && !line.contains('\u{1b}')
            && !line.contains('\u{200b}')),
        "a raw name in: {lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|line| line.contains(r"mailer\nFORGED line \u{1b}[31m\u{200b}")),
        "{lines:#?}"
    );
}
