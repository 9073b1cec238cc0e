//! The shared harness itself: without a server, every test fails, and the message that says
//! how to get one is printed once for the whole test binary, not once per test.

mod common;

use std::process::Command;

/// Run by `without_a_server_the_how_to_message_is_printed_once`, in a child process with no
/// server configured.
#[tokio::test]
#[ignore = "run by without_a_server_the_how_to_message_is_printed_once"]
async fn needs_a_server_first() {
    let _db = common::TestDb::new().await;
}

/// As `needs_a_server_first`.
#[tokio::test]
#[ignore = "run by without_a_server_the_how_to_message_is_printed_once"]
async fn needs_a_server_second() {
    let _db = common::TestDb::new().await;
}

#[test]
fn without_a_server_the_how_to_message_is_printed_once() {
    let this = std::env::current_exe().expect("the test binary");
    let out = Command::new(this)
        .args(["needs_a_server", "--ignored", "--test-threads=1"])
        .env_remove("DATABASE_URL")
        // No `docker` on the path: the harness cannot start a container either.
        .env("PATH", "")
        .output()
        .expect("run the test binary");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success(),
        "both tests fail without a server: {text}"
    );
    assert!(text.contains("2 failed"), "{text}");
    assert_eq!(
        text.matches("ordo's tests need PostgreSQL 14+").count(),
        1,
        "the how-to message once: {text}"
    );
    assert!(text.contains("see the first failure"), "{text}");
}
