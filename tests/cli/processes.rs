//! The `ordo` command-line tool, run as real processes: migrate, tail on both lanes, and
//! several `ordo fold` processes, one killed with SIGKILL mid-run and restarted.
#![cfg(feature = "cli")]

use crate::common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::invariants::{ORDO, check_log, counts};
use common::{Note, TestDb, eventually};
use ordo::{Outbox, OutboxConfig};
use rand::Rng;

const ORDO_BIN: &str = env!("CARGO_BIN_EXE_ordo");

fn ordo(db: &TestDb, args: &[&str]) -> std::process::Output {
    Command::new(ORDO_BIN)
        .args(args)
        .env("DATABASE_URL", &db.url)
        .output()
        .expect("run ordo")
}

fn spawn_fold(db: &TestDb) -> Child {
    Command::new(ORDO_BIN)
        .args(["fold", "--progress", "0"])
        .env("DATABASE_URL", &db.url)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ordo fold")
}

fn terminate(child: &mut Child) -> bool {
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    sent && child.wait().map(|s| s.success()).unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_is_idempotent_and_tail_prints_one_json_object_per_event_on_both_lanes() {
    let db = TestDb::new().await;
    let migrated = ordo(&db, &["migrate"]);
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );

    let outbox = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish_all([Note { writer: 1, n: 1 }, Note { writer: 1, n: 2 }])
        .expect("publish");
    tx.commit().await.expect("commit");
    assert!(
        eventually(Duration::from_secs(10), || async {
            outbox.commit_head().get() == 2
        })
        .await,
        "folded"
    );

    let tailed = ordo(&db, &["tail", "--lane", "insert", "--limit", "2"]);
    assert!(
        tailed.status.success(),
        "{}",
        String::from_utf8_lossy(&tailed.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&tailed.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["lane"], "insert");
    assert_eq!(lines[0]["sequence"], 1);
    assert_eq!(lines[1]["payload"]["n"], 2);
    assert!(
        lines[0]["id"].is_string()
            && lines[0]["commit_xid"].is_i64()
            && lines[0]["recorded_at"].is_string()
    );

    let tailed = ordo(&db, &["tail", "--lane", "commit", "--after", "1"]);
    assert!(
        tailed.status.success(),
        "{}",
        String::from_utf8_lossy(&tailed.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&tailed.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 1, "after commit sequence 1 of 2, one event");
    assert_eq!(lines[0]["lane"], "commit");
    assert_eq!(lines[0]["commit_sequence"], 2);
    assert_eq!(lines[0]["sequence"], 2);
    assert_eq!(lines[0]["boundary"], true);

    let refused = Command::new(ORDO_BIN)
        .args(["tail"])
        .env_remove("DATABASE_URL")
        .output()
        .expect("run ordo");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("DATABASE_URL"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fold_processes_killed_with_sigkill_and_restarted_keep_the_log_invariants() {
    let db = TestDb::new().await;
    let mut folders: Vec<Child> = (0..3).map(|_| spawn_fold(&db)).collect();
    let writer = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default().sequencer(false))
        .await
        .expect("writer outbox");

    let writing = tokio::spawn({
        let writer = writer.clone();
        async move {
            let mut tasks = Vec::new();
            for id in 0..6u32 {
                let writer = writer.clone();
                tasks.push(tokio::spawn(async move {
                    for n in 0..150u32 {
                        let (events, rollback) = {
                            let mut rng = rand::rng();
                            (rng.random_range(1..=3u32), rng.random_bool(0.25))
                        };
                        let mut tx = writer.begin().await.expect("begin");
                        tx.publish_all((0..events).map(|k| Note {
                            writer: id,
                            n: n * 10 + k,
                        }))
                        .expect("publish");
                        if rollback {
                            tx.rollback().await.expect("rollback");
                        } else {
                            tx.commit().await.expect("commit");
                        }
                        tokio::time::sleep(Duration::from_millis(3)).await;
                    }
                }));
            }
            for task in tasks {
                task.await.expect("writer");
            }
        }
    });
    // Kill one folder mid-run with SIGKILL, twice, restarting it each time.
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(rand::rng().random_range(100..400))).await;
        folders[0].kill().expect("SIGKILL a folder");
        let _ = folders[0].wait();
        folders[0] = spawn_fold(&db);
    }
    writing.await.expect("writers");

    let caught_up = eventually(Duration::from_secs(60), || async {
        let (real, logged) = counts(&db.pool).await;
        logged >= real
    })
    .await;
    let (real, logged) = counts(&db.pool).await;
    assert!(caught_up, "folders did not catch up: {logged} of {real}");
    if let Err(broken) = check_log(&db.pool, &ORDO).await {
        panic!("commit log invariant broken: {broken}");
    }
    for folder in &mut folders {
        assert!(terminate(folder), "ordo fold exits cleanly on SIGTERM");
    }
}

struct Counts;

impl ordo::Subscriber<Note> for Counts {
    async fn handle(
        &self,
        tx: &mut sqlx::PgConnection,
        _event: &ordo::Delivery<Note>,
    ) -> Result<(), ordo::HandlerError> {
        sqlx::query("UPDATE handled SET n = n + 1")
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_lists_pauses_resumes_and_resets() {
    let db = TestDb::new().await;
    sqlx::raw_sql("CREATE TABLE handled (n INT NOT NULL); INSERT INTO handled VALUES (0);")
        .execute(&db.pool)
        .await
        .expect("counter table");
    let outbox = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let retry = ordo::RetryPolicy {
        max_attempts: 5,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(10),
    };
    let config = ordo::JobConfig::new("counter")
        .lease(Duration::from_millis(300))
        .retry(retry);
    let handle = outbox.subscribe(config, Counts).await.expect("subscribe");
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish_all((0..3).map(|n| Note { writer: 0, n }))
        .expect("publish");
    tx.commit().await.expect("commit");
    let (_, done) = handle
        .wait_for(Duration::from_secs(10), |s| s.position.get() == 3)
        .await;
    assert!(done);

    let listed = ordo(&db, &["subscriptions"]);
    let table = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.status.success());
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("counter") && l.contains("insert") && l.contains("active")),
        "{table}"
    );
    let listed = ordo(&db, &["subscriptions", "--json"]);
    let row: serde_json::Value = serde_json::from_slice(&listed.stdout).expect("one JSON row");
    assert_eq!(
        (
            row["name"].as_str(),
            row["position"].as_u64(),
            row["lag"].as_u64()
        ),
        (Some("counter"), Some(3), Some(0))
    );

    assert!(
        ordo(&db, &["subscriptions", "pause", "counter"])
            .status
            .success()
    );
    let (_, paused) = handle
        .wait_for(Duration::from_secs(10), |s| {
            s.state == ordo::SubscriptionState::Paused
        })
        .await;
    assert!(paused, "the runner sees the pause");
    assert!(
        ordo(&db, &["subscriptions", "reset", "counter", "--to", "1"])
            .status
            .success()
    );
    assert!(
        ordo(&db, &["subscriptions", "resume", "counter"])
            .status
            .success()
    );
    // Replays events 2 and 3: 3 + 2 handled in all.
    let replayed = eventually(Duration::from_secs(10), || async {
        let n: i32 = sqlx::query_scalar("SELECT n FROM handled")
            .fetch_one(&db.pool)
            .await
            .unwrap_or(0);
        n == 5
    })
    .await;
    assert!(replayed, "reset --to 1 replays the two later events once");
    handle.shutdown().await;

    let unknown = ordo(&db, &["subscriptions", "pause", "nope"]);
    assert!(!unknown.status.success());
    assert!(
        String::from_utf8_lossy(&unknown.stderr)
            .contains("no subscription or relay named \"nope\"")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_retention_report_for_people_and_machines() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(Note { writer: 0, n: 0 }).expect("publish");
    tx.commit().await.expect("commit");
    assert!(
        eventually(Duration::from_secs(10), || async {
            outbox.commit_head().get() == 1
        })
        .await
    );

    let status = ordo(&db, &["status", "--json"]);
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).expect("JSON");
    assert_eq!(
        (
            json["insert_frontier"].as_u64(),
            json["commit_head"].as_u64()
        ),
        (Some(1), Some(1))
    );
    let table = ordo(&db, &["status"]);
    assert!(String::from_utf8_lossy(&table.stdout).contains("nothing is stuck: no lane stall"));
    let prometheus = ordo(&db, &["status", "--prometheus"]);
    assert!(String::from_utf8_lossy(&prometheus.stdout).contains("ordo_commit_head 1"));

    let plan = ordo(&db, &["retention", "--keep", "0s", "--json"]);
    assert!(
        plan.status.success(),
        "{}",
        String::from_utf8_lossy(&plan.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&plan.stdout).expect("JSON");
    assert_eq!(report["partitions"][0]["name"], "events_p0");
    assert_eq!(
        report["partitions"][0]["drop"], false,
        "the head's partition is kept"
    );
    let bad = ordo(&db, &["retention", "--keep", "soon"]);
    assert!(!bad.status.success());
}

/// JSON nested deeper than serde_json's recursion limit (128): PostgreSQL stores it, a relay
/// delivers its bytes, and `ordo tail` prints it on both lanes rather than stop there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_prints_a_payload_nested_deeper_than_serde_json_parses_on_both_lanes() {
    let db = TestDb::new().await;
    let nested = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    sqlx::query("INSERT INTO ordo.events (payload) VALUES ($1::jsonb), ('{\"after\": true}')")
        .bind(&nested)
        .execute(&db.pool)
        .await
        .expect("a deeply nested payload, then another");
    let folder =
        Outbox::<Box<serde_json::value::RawValue>>::new(db.pool.clone(), OutboxConfig::default())
            .await
            .expect("outbox");
    assert!(
        eventually(Duration::from_secs(10), || async {
            folder.commit_head().get() == 2
        })
        .await,
        "folded"
    );
    for lane in ["insert", "commit"] {
        let tailed = ordo(&db, &["tail", "--lane", lane]);
        let stderr = String::from_utf8_lossy(&tailed.stderr);
        assert!(tailed.status.success(), "--lane {lane}: {stderr}");
        let lines: Vec<&str> = std::str::from_utf8(&tailed.stdout)
            .expect("UTF-8")
            .lines()
            .collect();
        assert_eq!(lines.len(), 2, "--lane {lane}: {lines:?} {stderr}");
        let squeezed: String = lines[0].chars().filter(|c| !c.is_whitespace()).collect();
        assert!(
            squeezed.ends_with(&format!("\"payload\":{nested}}}")),
            "--lane {lane}: {}",
            &lines[0][..200]
        );
        // Each lane's line carries the event's id and when it was recorded.
        let last: serde_json::Value = serde_json::from_str(lines[1]).expect("a JSON line");
        assert!(last["id"].is_string(), "--lane {lane}: {last}");
        assert!(last["recorded_at"].is_string(), "--lane {lane}: {last}");
        assert_eq!(last["payload"]["after"], true);
    }
    folder.shutdown().await;
}

/// `ordo fold` as the role `ordo grant --sequencer` makes, with no secret key configured: it
/// folds and warns of nothing (it may not scrub secrets, and there are none to scrub).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fold_as_the_sequencer_role_folds_without_a_warning() {
    use std::io::{BufRead, BufReader};
    use std::sync::{Arc, Mutex};

    let roles = common::roles::Roles::new(1_000).await;
    sqlx::query("INSERT INTO ordo.events (payload) VALUES ('{}')")
        .execute(&roles.admin)
        .await
        .expect("an event");
    let mut child = Command::new(ORDO_BIN)
        .args(["fold", "--progress", "0"])
        .env("DATABASE_URL", as_role(&roles.url, &roles.sequencer))
        .env("RUST_LOG", "warn,ordo=debug")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ordo fold");
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let reader = {
        let lines = Arc::clone(&lines);
        let stderr = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                lines.lock().expect("lines").push(line);
            }
        })
    };
    // Folded, and the maintainer's first run has looked at the secrets (it says so at debug).
    let done = eventually(Duration::from_secs(30), || async {
        let head: i64 = sqlx::query_scalar("SELECT last_commit_seq FROM ordo.sequencer_state")
            .fetch_one(&roles.admin)
            .await
            .unwrap_or(0);
        head == 1
            && lines
                .lock()
                .expect("lines")
                .iter()
                .any(|line| line.contains("may not scrub secret keys, and none is configured"))
    })
    .await;
    assert!(terminate(&mut child), "ordo fold exits cleanly on SIGTERM");
    let _ = reader.join();
    let lines = lines.lock().expect("lines").clone();
    assert!(done, "{lines:#?}");
    let warnings: Vec<&String> = lines
        .iter()
        .filter(|line| line.contains(" WARN ") || line.contains(" ERROR "))
        .collect();
    assert!(warnings.is_empty(), "{warnings:#?}");
}

/// `url` connecting as `role` instead of its user (the test server trusts local roles).
fn as_role(url: &str, role: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let host = rest.split_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://{role}@{host}")
}
