//! Secrets do not outlive delivery: payload keys named in `ordo.secret_keys` are removed from
//! the stored events once every subscription and relay has passed them (the outbox's
//! maintainer does it), a relay's parked event keeps them until it is requeued and delivered,
//! and a reader that has not passed an event (on either lane) holds its secrets. The scrub
//! rewrites only rows that hold a secret key, and only object payloads.
#![cfg(all(feature = "nats", feature = "rabbitmq"))]

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::Duration;

use common::brokers::{NATS_ADDR, TestStream};
use common::relays::config;
use common::subscribers::PATIENCE;
use common::subscribers::fast_retries;
use common::{TestDb, eventually};
use ordo::relay::OnParked;
use ordo::relay::nats::NatsSink;
use ordo::{
    Delivery, Envelope, HandlerError, JobConfig, Keys, OnExhaustion, Outbox, OutboxConfig,
    Subscriber,
};
use serde_json::{Value, json};
use sqlx::PgPool;

const SECRET: &str = "password_reset_url";

fn user(event: &Envelope<Value>) -> Keys {
    Keys::one(
        event.payload["user"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

fn reset(user: &str, n: u32) -> Value {
    json!({ "user": user, "n": n, SECRET: format!("https://example.test/reset/{user}/{n}") })
}

async fn publish(outbox: &Outbox<Value>, events: impl IntoIterator<Item = Value>) {
    for event in events {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish(event).expect("publish");
        tx.commit().await.expect("commit");
    }
}

/// The `n` of the stored events that still hold the secret key, in sequence order.
async fn holding_secret(pool: &PgPool) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT (payload->>'n')::bigint FROM ordo.events WHERE payload ? $1 ORDER BY sequence",
    )
    .bind(SECRET)
    .fetch_all(pool)
    .await
    .expect("events")
}

/// An outbox whose maintainer scrubs every `interval` (and once at start).
async fn outbox(db: &TestDb, interval: Duration) -> Outbox<Value> {
    let config = OutboxConfig::default().maintenance_interval(interval);
    Outbox::<Value>::new(db.pool.clone(), config)
        .await
        .expect("outbox")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_keys_are_removed_after_delivery_and_a_parked_event_keeps_them_until_delivered() {
    parked_event_keeps_its_secrets(OnParked::HoldKeys).await;
}

/// With `OnParked::Continue` the parked event has left its key's lane; in the backlog, it
/// still keeps its secrets until delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_event_keeps_its_secrets_when_its_key_goes_on() {
    parked_event_keeps_its_secrets(OnParked::Continue).await;
}

async fn parked_event_keeps_its_secrets(on_parked: OnParked) {
    let db = TestDb::new().await;
    ordo::admin::add_secret_keys(&db.pool, None, &[SECRET])
        .await
        .expect("secret");
    let outbox = outbox(&db, Duration::from_millis(100)).await;
    let stream = TestStream::new().await;
    let broken = Arc::new(AtomicBool::new(true));
    let (prefix, flag) = (stream.prefix.clone(), Arc::clone(&broken));
    let sink = NatsSink::builder(NATS_ADDR)
        .subject(move |message| {
            let event: Value = serde_json::from_slice(&message.payload).expect("json");
            if event["user"] == "carol" && flag.load(AtomicOrdering::SeqCst) {
                "no spaces allowed".to_owned() // permanent: parked at once
            } else {
                format!("{prefix}.{}", message.type_or_untyped())
            }
        })
        .build()
        .expect("sink");
    let relay = outbox
        .relay(config("mailer").on_parked(on_parked), sink, user)
        .await
        .expect("relay");
    // 0..4 before carol's event (4), 5..9 after it, on other keys.
    let users = [
        "alice", "bob", "alice", "bob", "carol", "alice", "bob", "dave", "dave", "bob",
    ];
    publish(&outbox, users.iter().zip(0..).map(|(u, n)| reset(u, n))).await;
    assert!(eventually(PATIENCE, || async { stream.len().await == 9 }).await);
    let (status, parked) = relay.wait_for(PATIENCE, |s| s.stalled.len() == 1).await;
    assert!(parked, "{status:?}");

    // The receiver got the secrets; the stored rows below the relay's watermark lost them. The
    // parked event waits in its key's backlog, undelivered: it keeps its own.
    let delivered = stream.messages().await;
    assert!(delivered.iter().all(|m| {
        let event: Value = serde_json::from_slice(&m.payload).expect("json");
        event[SECRET].is_string()
    }));
    let scrubbed = eventually(PATIENCE, || async { holding_secret(&db.pool).await == [4] }).await;
    assert!(scrubbed, "holding: {:?}", holding_secret(&db.pool).await);
    let other: i64 = sqlx::query_scalar("SELECT count(*) FROM ordo.events WHERE payload ? 'user'")
        .fetch_one(&db.pool)
        .await
        .expect("count");
    assert_eq!(other, 10, "only the secret key goes");

    broken.store(false, AtomicOrdering::SeqCst);
    ordo::admin::retry_stalled_keys(&db.pool, "mailer", Some("carol"))
        .await
        .expect("requeue");
    assert!(eventually(PATIENCE, || async { stream.len().await == 10 }).await);
    let carol = stream.messages().await.into_iter().find_map(|m| {
        let event: Value = serde_json::from_slice(&m.payload).expect("json");
        (event["user"] == "carol").then_some(event)
    });
    assert!(
        carol.is_some_and(|event| event[SECRET].is_string()),
        "the requeued event is delivered whole"
    );
    let scrubbed = eventually(PATIENCE, || async {
        holding_secret(&db.pool).await.is_empty()
    })
    .await;
    assert!(scrubbed, "holding: {:?}", holding_secret(&db.pool).await);
    relay.shutdown().await;
    outbox.shutdown().await;
}

/// A reader that has not passed an event holds its secrets: a commit-lane subscription at the
/// start of the log, then an insert-lane one part-way (positions mapped to event sequences
/// through the commit log, as retention maps them). Keys of one type leave other types alone;
/// arrays and plain SQL inserts are handled as the table holds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_has_not_passed_an_event_holds_its_secrets() {
    let db = TestDb::new().await;
    ordo::admin::add_secret_keys(&db.pool, Some("Invited"), &["token"])
        .await
        .expect("secret");
    ordo::admin::add_secret_keys(&db.pool, None, &[SECRET, "pin"])
        .await
        .expect("secret");
    assert_eq!(
        ordo::admin::add_secret_keys(&db.pool, None, &[SECRET])
            .await
            .expect("again"),
        0,
        "already secret"
    );
    sqlx::query(
        "INSERT INTO ordo.subscriptions (name, lane, position) VALUES ('slow', 'commit', 0)",
    )
    .execute(&db.pool)
    .await
    .expect("a commit-lane reader at the start");
    let outbox = outbox(&db, Duration::from_secs(3600)).await;
    // Plain SQL, as another language's writer would, in two transactions that interleave: the
    // first draws sequences 1 and 3, the second 2. The log orders groups by their lowest
    // sequence: commit sequences 1, 2 are events 1, 3; commit sequence 3 is event 2.
    let insert = "INSERT INTO ordo.events (payload, event_type) VALUES ($1, $2)";
    let mut first = db.pool.begin().await.expect("begin");
    let mut second = db.pool.begin().await.expect("begin");
    for (which, payload, event_type) in [
        (0, json!({"n": 0, "token": "t0", "pin": 1}), Some("Invited")),
        (
            1,
            json!({"n": 1, "token": "t1", SECRET: "u1"}),
            Some("Other"),
        ),
        (0, json!(["n", SECRET]), None),
    ] {
        let tx = if which == 0 { &mut first } else { &mut second };
        sqlx::query(insert)
            .bind(payload)
            .bind(event_type)
            .execute(&mut **tx)
            .await
            .expect("insert");
    }
    second.commit().await.expect("commit");
    first.commit().await.expect("commit");
    sqlx::query("INSERT INTO ordo.events (payload) VALUES ('{\"n\": 3, \"pin\": 7}')")
        .execute(&db.pool)
        .await
        .expect("plain insert");
    let logged = eventually(PATIENCE, || async {
        let logged: i64 = sqlx::query_scalar("SELECT last_commit_seq FROM ordo.sequencer_state")
            .fetch_one(&db.pool)
            .await
            .expect("log");
        logged == 4
    })
    .await;
    assert!(logged);
    ordo::admin::scrub_secrets(&db.pool).await.expect("scrub");
    let untouched = payloads(&db.pool).await;
    assert_eq!(
        untouched[0],
        json!({"n": 0, "token": "t0", "pin": 1}),
        "the reader needs it"
    );
    assert_eq!(untouched[3], json!({"n": 3, "pin": 7}));

    // Past commit sequence 2 (events 1 and 3): event 2 is still needed, so only event 1 goes.
    reader_at(&db.pool, 2).await;
    let stored = payloads(&db.pool).await;
    assert_eq!(
        stored[0],
        json!({"n": 0}),
        "its type's keys and every type's"
    );
    assert_eq!(
        stored[1],
        json!({"n": 1, "token": "t1", SECRET: "u1"}),
        "still needed"
    );
    // Past commit sequence 3: events 1 to 3.
    reader_at(&db.pool, 3).await;
    let stored = payloads(&db.pool).await;
    assert_eq!(stored[1], json!({"n": 1, "token": "t1"}), "not its type's");
    assert_eq!(stored[2], json!(["n", SECRET]), "an array is no object");
    assert_eq!(stored[3], json!({"n": 3, "pin": 7}), "still needed");

    sqlx::query("UPDATE ordo.subscriptions SET lane = 'insert', position = 4 WHERE name = 'slow'")
        .execute(&db.pool)
        .await
        .expect("an insert-lane reader past everything");
    let report = ordo::admin::scrub_secrets(&db.pool).await.expect("scrub");
    assert_eq!(report.scrubbed_below, Some(5));
    assert_eq!(payloads(&db.pool).await[3], json!({"n": 3}));
    outbox.shutdown().await;
}

/// Moves the commit-lane reader to `position`, then scrubs.
async fn reader_at(pool: &PgPool, position: i64) {
    sqlx::query("UPDATE ordo.subscriptions SET position = $1 WHERE name = 'slow'")
        .bind(position)
        .execute(pool)
        .await
        .expect("move");
    ordo::admin::scrub_secrets(pool).await.expect("scrub");
}

async fn payloads(pool: &PgPool) -> Vec<Value> {
    sqlx::query_scalar(
        "SELECT payload FROM ordo.events WHERE payload IS NOT NULL ORDER BY sequence",
    )
    .fetch_all(pool)
    .await
    .expect("payloads")
}

/// A row is rewritten only when it holds a secret key: never twice for the same key, and not
/// at all without one, even when a new key sends the scrubber over the history again (which
/// does remove that key from the events already passed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_is_rewritten_only_while_it_holds_a_secret() {
    let db = TestDb::new().await;
    let outbox = outbox(&db, Duration::from_secs(3600)).await;
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(json!({"n": 0, SECRET: "u"})).expect("publish");
    tx.publish(json!({"n": 1, "plain": true})).expect("publish");
    tx.publish(json!({"n": 2, "pin": 4})).expect("publish");
    tx.commit().await.expect("commit");
    assert!(eventually(PATIENCE, || async { logged(&db.pool).await == 3 }).await);
    let none = ordo::admin::scrub_secrets(&db.pool).await.expect("scrub");
    assert_eq!(
        none.scrubbed_below, None,
        "no key configured: nothing looked at"
    );

    ordo::admin::add_secret_keys(&db.pool, None, &[SECRET])
        .await
        .expect("secret");
    ordo::admin::scrub_secrets(&db.pool).await.expect("scrub");
    assert_eq!(payloads(&db.pool).await[0], json!({"n": 0}));
    let versions = row_versions(&db.pool).await;
    ordo::admin::scrub_secrets(&db.pool).await.expect("scrub");
    assert_eq!(
        row_versions(&db.pool).await,
        versions,
        "nothing left to rewrite"
    );
    // A new key: the history is walked again, and only the row holding it is rewritten.
    ordo::admin::add_secret_keys(&db.pool, None, &["pin"])
        .await
        .expect("secret");
    ordo::admin::scrub_secrets(&db.pool).await.expect("scrub");
    let after = row_versions(&db.pool).await;
    assert_eq!(after[0], versions[0], "scrubbed once, not again");
    assert_eq!(after[1], versions[1], "no secret, never rewritten");
    assert_ne!(after[2], versions[2]);
    assert_eq!(payloads(&db.pool).await[2], json!({"n": 2}));
    let listed = ordo::admin::list_secret_keys(&db.pool).await.expect("list");
    assert_eq!(listed.len(), 2);
    assert_eq!(
        ordo::admin::remove_secret_keys(&db.pool, None, &["pin"])
            .await
            .expect("remove"),
        1
    );
    outbox.shutdown().await;
}

async fn logged(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT last_commit_seq FROM ordo.sequencer_state")
        .fetch_one(pool)
        .await
        .expect("log")
}

/// Each real event's row version (`xmin` changes when a row is rewritten), in sequence order.
async fn row_versions(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT xmin::text FROM ordo.events WHERE payload IS NOT NULL ORDER BY sequence",
    )
    .fetch_all(pool)
    .await
    .expect("versions")
}

/// The scrub runs periodically with its statements planned inside a function, out of EXPLAIN's
/// view (`tests/ops/plans.rs` sees only the call): the function turns JIT off for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scrub_is_never_jit_compiled() {
    let db = TestDb::new().await;
    let settings: Vec<String> = sqlx::query_scalar(
        "SELECT unnest(proconfig) FROM pg_proc WHERE oid = 'ordo.scrub_secrets(bigint, boolean)'::regprocedure",
    )
    .fetch_all(&db.pool)
    .await
    .expect("proconfig");
    assert!(settings.iter().any(|s| s == "jit=off"), "{settings:?}");
}

/// `ordo secrets add|list|remove|scrub`: the operator's way to the same table.
#[cfg(feature = "cli")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_names_lists_removes_and_scrubs_secret_keys() {
    let db = TestDb::new().await;
    let ordo = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_ordo"))
            .args(args)
            .env("DATABASE_URL", &db.url)
            .output()
            .expect("run ordo");
        assert!(output.status.success(), "{args:?}: {output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    ordo(&["secrets", "add", SECRET, "pin"]);
    ordo(&["secrets", "add", "token", "--type", "Invited"]);
    let listed = ordo(&["secrets", "list", "--json"]);
    let listed: Vec<Value> = listed
        .lines()
        .map(|line| serde_json::from_str(line).expect("json"))
        .collect();
    assert_eq!(
        listed,
        [
            json!({"event_type": null, "key": SECRET}),
            json!({"event_type": null, "key": "pin"}),
            json!({"event_type": "Invited", "key": "token"}),
        ]
    );
    ordo(&["secrets", "remove", "pin"]);
    let table = ordo(&["secrets", "list"]);
    assert_eq!(table.lines().count(), 3, "a heading and two keys: {table}");
    ordo(&["secrets", "scrub"]);
}

/// Fails on carol's events while `broken` is set.
struct FailsForCarol {
    broken: Arc<AtomicBool>,
}

impl Subscriber<Value> for FailsForCarol {
    async fn handle(
        &self,
        _tx: &mut sqlx::PgConnection,
        event: &Delivery<Value>,
    ) -> Result<(), HandlerError> {
        if event.payload["user"] == "carol" && self.broken.load(AtomicOrdering::SeqCst) {
            return Err("carol's mailbox is gone".into());
        }
        Ok(())
    }
}

/// A dead letter is a subscription's parked event: its event keeps its secrets (a retry reads
/// it again) until the dead letter is retried, then loses them at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_event_keeps_its_secrets_until_retried() {
    let db = TestDb::new().await;
    ordo::admin::add_secret_keys(&db.pool, None, &[SECRET])
        .await
        .expect("secret");
    let outbox = outbox(&db, Duration::from_millis(100)).await;
    let broken = Arc::new(AtomicBool::new(true));
    let config = JobConfig::new("mails")
        .retry(fast_retries(2))
        .on_exhaustion(OnExhaustion::DeadLetter);
    let broken_handler = FailsForCarol {
        broken: Arc::clone(&broken),
    };
    let handle = outbox
        .subscribe(config, broken_handler)
        .await
        .expect("subscribe");
    let users = ["alice", "carol", "bob", "dave"];
    publish(&outbox, users.iter().zip(0..).map(|(u, n)| reset(u, n))).await;
    let (status, done) = handle.wait_for(PATIENCE, |s| s.position.get() >= 4).await;
    assert!(done, "{status:?}");
    let kept = eventually(PATIENCE, || async { holding_secret(&db.pool).await == [1] }).await;
    assert!(kept, "holding: {:?}", holding_secret(&db.pool).await);

    broken.store(false, AtomicOrdering::SeqCst);
    ordo::admin::retry_dead_letters(&db.pool, "mails")
        .await
        .expect("retry");
    let retried = eventually(PATIENCE, || async {
        ordo::admin::list_dead_letters(&db.pool, Some("mails"))
            .await
            .expect("list")
            .is_empty()
    })
    .await;
    assert!(retried);
    assert!(
        holding_secret(&db.pool).await.is_empty(),
        "scrubbed with the retry's commit"
    );
    handle.shutdown().await;
    outbox.shutdown().await;
}
