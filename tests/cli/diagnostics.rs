//! What the `ordo` tool says when it cannot do its job: where the connection failed and why,
//! a schema that needs migrating, a position beyond any position. Run as real processes.
#![cfg(feature = "cli")]

use crate::common;

use std::process::{Command, Output};

use common::TestDb;

const ORDO_BIN: &str = env!("CARGO_BIN_EXE_ordo");

fn ordo(url: &str, args: &[&str]) -> Output {
    Command::new(ORDO_BIN)
        .args(args)
        .env("DATABASE_URL", url)
        .env_remove("RUST_LOG")
        .output()
        .expect("run ordo")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_refused_connection_is_called_refused_and_names_host_and_port_but_not_the_password() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
        // Closed here: nothing listens on the port any more.
    };
    let url = format!("postgres://someone:hunter2secret@127.0.0.1:{port}/app");
    let out = ordo(&url, &["status"]);
    let text = stderr(&out);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(text.contains("connection refused"), "{text}");
    assert!(!text.contains("hunter2secret"), "{text}");
    assert!(!text.contains("pool timed out"), "{text}");
}

#[test]
fn a_refused_connection_is_answered_at_once_whatever_the_connect_timeout() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let url = format!("postgres://someone@127.0.0.1:{port}/app");
    // An hour to connect: an answer well before the deadline is the refusal's, not a timeout.
    let mut child = Command::new(ORDO_BIN)
        .args(["--connect-timeout", "3600", "status"])
        .env("DATABASE_URL", &url)
        .env_remove("RUST_LOG")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run ordo");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            panic!("ordo waited on a refused port instead of answering");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    let text = stderr(&out);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("connection refused"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_that_fails_says_postgresql_s_message_without_its_source_line() {
    let db = TestDb::new().await;
    // A database whose `ordo` schema holds a table of another shape under ordo's first name.
    let other = db.another_pool(1).await;
    sqlx::query("DROP SCHEMA ordo CASCADE")
        .execute(&other)
        .await
        .expect("drop the schema");
    for statement in ["CREATE SCHEMA ordo", "CREATE TABLE ordo.events (x int)"] {
        sqlx::query(statement)
            .execute(&other)
            .await
            .expect("a table in its way");
    }
    other.close().await;
    let out = ordo(&db.url, &["migrate"]);
    let text = stderr(&out);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("relation \"events\" already exists"),
        "{text}"
    );
    assert!(text.contains("[SQLSTATE 42P07]"), "{text}");
    assert!(!text.contains(" at line "), "{text}");
}

#[test]
fn a_server_that_accepts_and_never_answers_is_called_hung_and_names_host_and_port() {
    // Bound and listening but never accepting: the kernel completes the handshake and
    // nothing ever answers, as with a hung server.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let url = format!("postgres://someone:hunter2secret@127.0.0.1:{port}/app");
    let out = ordo(&url, &["status"]);
    let text = stderr(&out);
    drop(listener);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(text.contains("did not answer"), "{text}");
    assert!(!text.contains("hunter2secret"), "{text}");
    assert!(!text.contains("pool timed out"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_before_migrate_says_to_run_ordo_migrate() {
    let db = TestDb::new().await;
    sqlx::query("DROP SCHEMA ordo CASCADE")
        .execute(&db.pool)
        .await
        .expect("drop the schema");
    for command in [&["status"][..], &["tail"], &["subscriptions"]] {
        let out = ordo(&db.url, command);
        let text = stderr(&out);
        assert!(!out.status.success(), "{command:?}: {text}");
        assert!(text.contains("run `ordo migrate`"), "{command:?}: {text}");
        assert!(!text.contains(" at line "), "{command:?}: {text}");
    }
    let out = ordo(&db.url, &["migrate"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = ordo(&db.url, &["status"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_after_a_position_beyond_any_position_says_so_not_retention() {
    let db = TestDb::new().await;
    for lane in ["insert", "commit"] {
        let out = ordo(
            &db.url,
            &[
                "tail",
                "--lane",
                lane,
                "--after",
                &u64::MAX.to_string(),
                "--follow",
            ],
        );
        let text = stderr(&out);
        assert!(!out.status.success(), "{lane}: {text}");
        assert!(text.contains("beyond any position"), "{lane}: {text}");
        assert!(!text.contains("retention"), "{lane}: {text}");
    }
    let out = ordo(&db.url, &["tail", "--after", &i64::MAX.to_string()]);
    assert!(
        out.status.success(),
        "the highest position is accepted: {}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_and_errors_reach_the_terminal_escaped() {
    let db = TestDb::new().await;
    sqlx::query(
        "INSERT INTO ordo.subscriptions (name, lane, status, last_error) \
         VALUES ($1, 'insert', 'halted', $2)",
    )
    .bind("sub\u{1b}[2Jname")
    .bind("boom \u{1b}]0;owned\u{7} \u{9b}1m")
    .execute(&db.pool)
    .await
    .expect("a subscription row");
    for args in [
        &["subscriptions"][..],
        &["subscriptions", "--json"],
        &["status"],
        &["status", "--json"],
    ] {
        let out = ordo(&db.url, args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            !text
                .chars()
                .any(|c| matches!(c, '\u{1b}' | '\u{9b}' | '\u{7}')),
            "{args:?}: {text:?}"
        );
        assert!(text.contains("sub"), "{args:?}: {text}");
    }
    let out = ordo(&db.url, &["subscriptions", "--json"]);
    let row: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("still one valid JSON object");
    assert_eq!(row["last_error"], "boom \u{1b}]0;owned\u{7} \u{9b}1m");
    let out = ordo(&db.url, &["subscriptions", "pause", "no\u{1b}[2Jsuch"]);
    let text = stderr(&out);
    assert!(!out.status.success());
    assert!(!text.contains('\u{1b}'), "{text:?}");
}
