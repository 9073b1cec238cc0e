//! Routing without code in the standalone relay: one `ordo relay run` process fans three event
//! types to three Kafka topics by a destination template over a payload field and the type,
//! places a chosen field in a header, and parks only the one event that lacks the field; a bad
//! template is refused at start-up, pointing at the mistake, before anything is created.
#![cfg(all(
    feature = "cli",
    feature = "kafka",
    feature = "nats",
    feature = "rabbitmq"
))]

use crate::common;

use std::collections::HashSet;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::kafka::{MockKafka, Record, count, read_topic};
use common::{KillOnDrop, TestDb, eventually};
use sqlx::PgPool;

const ORDO_BIN: &str = env!("CARGO_BIN_EXE_ordo");
const PATIENCE: Duration = Duration::from_secs(30);
const TYPES: [&str; 3] = ["placed", "shipped", "billed"];

/// One event written by plain SQL, as a program in another language writes it.
async fn insert(pool: &PgPool, event_type: &str, payload: serde_json::Value) {
    sqlx::query("INSERT INTO ordo.events (payload, event_type) VALUES ($1::jsonb, $2)")
        .bind(payload.to_string())
        .bind(event_type)
        .execute(pool)
        .await
        .expect("insert an event");
}

fn run_args<'a>(bootstrap: &'a str, extra: &[&'a str]) -> Vec<String> {
    let mut args: Vec<&str> = vec![
        "relay",
        "run",
        "fan-out",
        "--sink",
        "kafka",
        "--url",
        bootstrap,
        "--key-from",
        "payload:/customer",
        "--batch-size",
        "20",
        "--per-event-budget",
        "25ms",
        "--batch-deadline",
        "2s",
        "--lease",
        "3s",
        "--max-attempts",
        "3",
        "--backoff-initial",
        "5ms",
        "--backoff-max",
        "50ms",
    ];
    args.extend_from_slice(extra);
    args.into_iter().map(str::to_owned).collect()
}

async fn topic_records(kafka: &Arc<MockKafka>, topic: &str) -> Vec<Record> {
    let (kafka, topic) = (Arc::clone(kafka), topic.to_owned());
    tokio::task::spawn_blocking(move || read_topic(&kafka.bootstrap, &topic))
        .await
        .expect("read a topic")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_standalone_relay_fans_three_types_to_three_topics_and_parks_only_an_unroutable_event()
{
    let kafka = Arc::new(MockKafka::start(1));
    let db = TestDb::new().await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let aggregate = |kind: &str| format!("{kind}-{run}");
    // Each type goes to "{aggregate}.{type}": three topics.
    let topics: Vec<String> = TYPES
        .iter()
        .map(|kind| {
            format!(
                "{}.{kind}",
                aggregate(if *kind == "billed" {
                    "billing"
                } else {
                    "orders"
                })
            )
        })
        .collect();
    for topic in &topics {
        kafka.topic(topic, 2);
    }
    for n in 0..30u32 {
        let kind = TYPES[(n % 3) as usize];
        let owner = if kind == "billed" {
            "billing"
        } else {
            "orders"
        };
        let mut payload = serde_json::json!({
            "n": n,
            "customer": format!("c{}", n % 4),
            "aggregate": aggregate(owner),
            "tenant": format!("t{}", n % 2),
        });
        if n == 13 {
            // The one event its template cannot route: no aggregate. (A key of its own: a
            // parked event holds its key, and this test is about the other events.)
            if let Some(fields) = payload.as_object_mut() {
                fields.remove("aggregate");
                fields.insert("customer".to_owned(), serde_json::json!("lonely"));
            }
        }
        insert(&db.pool, kind, payload).await;
    }
    let args = run_args(
        &kafka.bootstrap,
        &[
            "--destination",
            "{payload:/aggregate}.{event_type}",
            "--header",
            "tenant={payload:/tenant}",
        ],
    );
    let _relay = KillOnDrop(
        Command::new(ORDO_BIN)
            .args(&args)
            .env("DATABASE_URL", &db.url)
            .env_remove("ORDO_RELAY_URL")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("ordo relay run"),
    );

    // Every event but the unroutable one reaches its type's topic; that one is parked.
    let all_sent = eventually(PATIENCE, || async {
        let mut total = 0;
        for topic in &topics {
            let (kafka, topic) = (Arc::clone(&kafka), topic.clone());
            total += tokio::task::spawn_blocking(move || count(&kafka.bootstrap, &topic))
                .await
                .expect("count");
        }
        total >= 29
    })
    .await;
    assert!(all_sent, "29 events reached their topics");
    let parked = eventually(PATIENCE, || async {
        let (_, out, _) = db.ordo(&["relay", "parked", "fan-out", "--json"]);
        out.lines().count() == 1 && out.contains("/aggregate")
    })
    .await;
    let (_, out, err) = db.ordo(&["relay", "parked", "fan-out", "--json"]);
    assert!(
        parked,
        "only the event without an aggregate is parked: {out}{err}"
    );
    assert!(
        out.contains("lonely"),
        "the parked event holds its key: {out}"
    );

    let mut seen = HashSet::new();
    for (kind, topic) in TYPES.iter().zip(&topics) {
        for record in topic_records(&kafka, topic).await {
            let event: serde_json::Value =
                serde_json::from_slice(&record.payload).expect("a JSON payload");
            let n = event["n"].as_u64().expect("n");
            assert_eq!(TYPES[(n % 3) as usize], *kind, "event {n} in {topic}");
            assert_eq!(
                record.headers.get("ordo-event-type").map(String::as_str),
                Some(*kind)
            );
            assert_eq!(record.headers.get("tenant"), Some(&format!("t{}", n % 2)));
            assert_eq!(record.key.as_deref(), event["customer"].as_str(), "the key");
            assert_eq!(record.headers.get("ordo-route"), Some(topic));
            seen.insert(n);
        }
    }
    let expected: HashSet<u64> = (0..30).filter(|n| *n != 13).collect();
    assert_eq!(seen, expected, "every routable event, in its type's topic");
}

/// Runs `ordo` with `args`, which must be refused: its stderr.
fn refused(db: &TestDb, args: &[String]) -> String {
    let output: Output = Command::new(ORDO_BIN)
        .args(args)
        .env("DATABASE_URL", &db.url)
        .env_remove("ORDO_RELAY_URL")
        .stdin(Stdio::null())
        .output()
        .expect("run ordo relay run");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "accepted: {args:?}: {stderr}");
    stderr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_template_is_refused_at_start_up_pointing_at_the_mistake() {
    let db = TestDb::new().await;
    let bootstrap = "kafka://127.0.0.1:9";
    let unknown = refused(
        &db,
        &run_args(bootstrap, &["--destination", "orders.{evnt_type}"]),
    );
    assert!(
        unknown.contains("--destination") && unknown.contains("unknown field `evnt_type`"),
        "{unknown}"
    );
    assert!(
        unknown.contains(r#"at character 9 (after "orders.{")"#),
        "it points at the field: {unknown}"
    );
    let unclosed = refused(
        &db,
        &run_args(bootstrap, &["--header", "tenant={payload:/t"]),
    );
    assert!(
        unclosed.contains("--header") && unclosed.contains("never closed"),
        "{unclosed}"
    );
    let reserved = refused(&db, &run_args(bootstrap, &["--header", "Ordo-Position=1"]));
    assert!(
        reserved.contains("the sinks write themselves"),
        "{reserved}"
    );
    let relays: i64 = sqlx::query_scalar("SELECT count(*) FROM ordo.subscriptions")
        .fetch_one(&db.pool)
        .await
        .expect("count relays");
    assert_eq!(relays, 0, "a refused relay creates nothing");
}
