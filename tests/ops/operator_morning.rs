//! An operator's morning in a shared database: rows nobody planned for leave every
//! reader moving and are counted, dead letters show in every status output, a watermark inbox
//! waiting on a gap says so and a command ends the wait, and PostgreSQL's C source line never
//! reaches a stored error.
#![cfg(feature = "cli")]

use crate::common;

use std::time::Duration;

use common::TestDb;
use common::logs::Recorder;
use common::recording_sink::Recording;
use ordo::inbox::{self, Inbox, InboxConfig, InboxMessage, InboxMode, Receipt};
use ordo::relay::RelayConfig;
use ordo::{
    Delivery, Envelope, HandlerError, JobConfig, Keys, OnExhaustion, Outbox, OutboxConfig,
    RetryPolicy, Subscriber, SubscriptionHandle, SubscriptionState, admin,
};
use serde_json::Value;
use sqlx::{PgConnection, PgPool};

const PATIENCE: Duration = Duration::from_secs(30);

/// The orders service's events: each variant is a type.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
enum Orders {
    Placed { id: i32 },
}

impl Orders {
    fn id(&self) -> i32 {
        match self {
            Orders::Placed { id } => *id,
        }
    }
}

/// Records each id under its reader's name; fails with a real PostgreSQL error (division by
/// zero) on id 13.
struct Project(&'static str);

impl Subscriber<Orders> for Project {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        event: &Delivery<Orders>,
    ) -> Result<(), HandlerError> {
        if event.payload.id() == 13 {
            sqlx::query("SELECT 1 / 0").execute(&mut *tx).await?;
        }
        sqlx::query("INSERT INTO handled (reader, id) VALUES ($1, $2)")
            .bind(self.0)
            .bind(event.payload.id())
            .execute(&mut *tx)
            .await?;
        Ok(())
    }

    fn keys(&self, event: &Envelope<Orders>) -> Keys {
        Keys::one(event.payload.id().to_string())
    }
}

async fn setup() -> (TestDb, Outbox<Orders>) {
    let db = TestDb::new().await;
    sqlx::query("CREATE TABLE handled (reader TEXT NOT NULL, id INT NOT NULL)")
        .execute(&db.pool)
        .await
        .expect("handled table");
    let outbox = Outbox::<Orders>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    (db, outbox)
}

async fn publish(outbox: &Outbox<Orders>, id: i32) {
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(Orders::Placed { id }).expect("publish");
    tx.commit().await.expect("commit");
}

/// A row written by plain SQL, as another service sharing the database writes one.
async fn plain_row(pool: &PgPool, payload: &str, event_type: Option<&str>) {
    sqlx::query("INSERT INTO ordo.events (payload, event_type) VALUES ($1::jsonb, $2)")
        .bind(payload)
        .bind(event_type)
        .execute(pool)
        .await
        .expect("plain-SQL insert");
}

async fn handled(pool: &PgPool, reader: &str) -> Vec<i32> {
    sqlx::query_scalar("SELECT id FROM handled WHERE reader = $1 ORDER BY id")
        .bind(reader)
        .fetch_all(pool)
        .await
        .expect("read handled")
}

/// Waits until the handle's position reaches `position`, and fails with its status if it
/// halts or stops short.
async fn reaches(handle: &SubscriptionHandle, position: u64) {
    let (status, reached) = handle
        .wait_for(PATIENCE, |s| {
            s.state == SubscriptionState::Halted || s.position.get() >= position
        })
        .await;
    assert!(
        reached && status.state != SubscriptionState::Halted && status.stalled.is_empty(),
        "expected position {position}, moving: {status:?}"
    );
}

async fn dead_letter_errors(pool: &PgPool, subscription: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT error FROM ordo.dead_letters WHERE subscription = $1 ORDER BY id")
        .bind(subscription)
        .fetch_all(pool)
        .await
        .expect("dead letters")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_and_undecodable_rows_leave_a_default_a_keyed_subscription_and_a_relay_moving() {
    let (db, outbox) = setup().await;
    publish(&outbox, 1).await; // 1
    // Another service's row, typed as the README advises.
    plain_row(&db.pool, r#"{"invoice": 7}"#, Some("billing.Invoiced")).await; // 2
    // A row of this service's own type that does not decode as `Orders`.
    plain_row(&db.pool, r#"{"Placed": {"id": "seven"}}"#, Some("Placed")).await; // 3
    // The README's untyped row, which does not decode either.
    plain_row(&db.pool, r#"{"k": 1}"#, None).await; // 4
    publish(&outbox, 5).await; // 5

    // Every setting left at its default (the exhaustion policy is Halt).
    let projection = outbox
        .subscribe(JobConfig::new("projection"), Project("projection"))
        .await
        .expect("subscribe");
    let keyed = outbox
        .subscribe(JobConfig::new("keyed").keyed(4), Project("keyed"))
        .await
        .expect("keyed subscribe");
    let sink = Recording::default();
    let relay_config = RelayConfig::new("to-broker")
        .ordering(ordo::Ordering::Insert)
        .max_attempts(1);
    let relay = outbox
        .relay(relay_config, sink.clone(), |event: &Envelope<Orders>| {
            Keys::one(event.payload.id().to_string())
        })
        .await
        .expect("relay");

    reaches(&projection, 5).await;
    reaches(&keyed, 5).await;
    reaches(&relay, 5).await;
    assert_eq!(handled(&db.pool, "projection").await, [1, 5]);
    assert_eq!(handled(&db.pool, "keyed").await, [1, 5]);
    // The foreign row is skipped before decoding: neither handled nor a dead letter. The two
    // rows that do not decode are dead letters, each with its decoding error, counted.
    for subscription in ["projection", "keyed"] {
        let errors = dead_letter_errors(&db.pool, subscription).await;
        assert_eq!(errors.len(), 2, "{subscription}: {errors:?}");
        assert!(
            errors.iter().all(|error| error.contains("does not decode")),
            "{errors:?}"
        );
    }
    let status = admin::status(&db.pool).await.expect("status");
    for subscription in ["projection", "keyed"] {
        let row = status
            .subscriptions
            .iter()
            .find(|row| row.name == subscription)
            .expect("listed");
        assert_eq!(row.dead_letters.map(|dead| dead.count), Some(2), "{row:?}");
    }
    // The relay sends what it cannot decode as stored, and passes the foreign row over.
    let mut sent = sink.positions();
    sent.sort_unstable();
    assert_eq!(sent, [1, 3, 4, 5], "sent positions");
    // Halting on an undecodable event is still there for whoever asks for it.
    let halting = outbox
        .subscribe(
            JobConfig::new("halts").on_undecodable(OnExhaustion::Halt),
            Project("halts"),
        )
        .await
        .expect("subscribe");
    let (status, halted) = halting
        .wait_for(PATIENCE, |s| s.state == SubscriptionState::Halted)
        .await;
    assert!(halted, "{status:?}");
    let error = status.last_error.clone().unwrap_or_default();
    assert!(
        status.position.get() < 3 && error.contains("sequence 3 does not decode"),
        "halted at the undecodable row: {status:?}"
    );
    outbox.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_and_the_oldest_unhandled_event_show_in_every_status_output() {
    let (db, outbox) = setup().await;
    for id in [1, 13, 3] {
        publish(&outbox, id).await;
    }
    // A subscription nobody runs, behind by three events.
    sqlx::query(
        "INSERT INTO ordo.subscriptions (name, lane, position) VALUES ('idle', 'insert', 0)",
    )
    .execute(&db.pool)
    .await
    .expect("idle subscription");
    let config = JobConfig::new("billing")
        .retry(RetryPolicy {
            max_attempts: 1,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(1),
        })
        .on_exhaustion(OnExhaustion::DeadLetter);
    let handle = outbox
        .subscribe(config, Project("projection"))
        .await
        .expect("subscribe");
    reaches(&handle, 3).await;

    // The stored error is PostgreSQL's message and SQLSTATE, not sqlx's C source line.
    let errors = dead_letter_errors(&db.pool, "billing").await;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("division by zero [SQLSTATE 22012]") && !errors[0].contains(" at line "),
        "{errors:?}"
    );

    let status = outbox.status().await.expect("Outbox::status");
    assert_eq!(status.dead_letters.count, 1, "{status:#?}");
    assert!(status.dead_letters.oldest_at.is_some());
    let listed = admin::list_subscriptions(&db.pool).await.expect("list");
    let billing = listed
        .iter()
        .find(|s| s.name == "billing")
        .expect("billing");
    assert_eq!(billing.dead_letters.map(|dead| dead.count), Some(1));
    assert_eq!(billing.kind.as_deref(), Some("subscription"));
    let idle = listed.iter().find(|s| s.name == "idle").expect("idle");
    assert!(
        idle.oldest_unprocessed_seconds.is_some(),
        "list_subscriptions measures the oldest unhandled event: {idle:?}"
    );

    let (ok, text, err) = db.ordo(&["status"]);
    assert!(
        ok && text.contains("dead letters: 1, the oldest written"),
        "{text}{err}"
    );
    let (ok, table, err) = db.ordo(&["subscriptions"]);
    assert!(ok, "{err}");
    let line = |name: &str| {
        table
            .lines()
            .find(|line| line.starts_with(name))
            .map(|line| {
                line.split_whitespace()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    // SUBSCRIPTION KIND LANE POSITION LAG OLDEST STATUS ATTEMPTS STALLED DEAD ...
    let billing_line = line("billing");
    assert_eq!(
        billing_line.get(9).map(String::as_str),
        Some("1"),
        "{table}"
    );
    assert!(table.contains("1 dead letter(s)"), "{table}");
    let idle_line = line("idle");
    assert_ne!(
        idle_line.get(5).map(String::as_str),
        Some("-"),
        "OLDEST: {table}"
    );
    let (ok, metrics, err) = db.ordo(&["status", "--prometheus"]);
    assert!(ok, "{err}");
    for sample in [
        "ordo_subscription_dead_letters{subscription=\"billing\",lane=\"insert\"} 1",
        "ordo_subscription_dead_letters{subscription=\"idle\",lane=\"insert\"} 0",
        "ordo_dead_letters 1",
        "ordo_subscription_oldest_dead_letter_seconds{subscription=\"billing\",lane=\"insert\"}",
        "ordo_oldest_dead_letter_seconds ",
    ] {
        assert!(metrics.contains(sample), "{sample} in {metrics}");
    }
    let (ok, json, err) = db.ordo(&["status", "--json"]);
    assert!(ok, "{err}");
    let json: Value = serde_json::from_str(&json).expect("one JSON object");
    assert_eq!(json["dead_letters"]["count"], 1, "{json}");
    let subscriptions = json["subscriptions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        subscriptions
            .iter()
            .any(|s| s["name"] == "billing" && s["dead_letters"]["count"] == 1),
        "{json}"
    );
    // Bare, the dead-letters command lists.
    let (ok, listed, err) = db.ordo(&["dead-letters"]);
    assert!(
        ok && listed.contains("billing") && listed.contains("SQLSTATE 22012"),
        "{listed}{err}"
    );
    outbox.shutdown().await;
}

// One thread: the inbox's statements and its log run where the recorder is installed.
#[tokio::test(flavor = "current_thread")]
async fn a_watermark_inbox_waiting_on_a_gap_says_so_and_set_watermark_ends_the_wait() {
    use tracing_subscriber::layer::SubscriberExt;
    let db = TestDb::new().await;
    common::inbox::effects_table(&db.pool).await;
    let recorder = Recorder::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(recorder.clone()));
    let config = InboxConfig::new("replica").mode(InboxMode::Watermark);
    let inbox = Inbox::new(db.pool.clone(), config).expect("inbox");
    let handler = common::inbox::Recording::default();
    assert_eq!(
        inbox.receive(&at(1), &handler).await.expect("1"),
        Receipt::Handled
    );
    the_mark_notes_the_gap_once_per_position(&db, &inbox, &handler).await;
    the_wait_is_logged_once_it_outlived_a_few_redeliveries(&db, &inbox, &handler, &recorder).await;
    set_watermark_ends_the_wait(&db, &inbox, &handler).await;
}

/// Position `position` of the source `orders`.
fn at(position: u64) -> InboxMessage {
    InboxMessage::new(format!("orders-{position}"), "{}").with_source("orders", position)
}

/// The sender skipped position 2 for good (its relay was moved past it): 3, 4 and 3 again are
/// refused as a gap, the mark notes the higher one, and the repeat writes nothing.
async fn the_mark_notes_the_gap_once_per_position(
    db: &TestDb,
    inbox: &Inbox,
    handler: &common::inbox::Recording,
) {
    let row_version = || async {
        sqlx::query_scalar::<_, String>(
            "SELECT xmin::text FROM ordo.inbox_watermarks WHERE consumer = 'replica'",
        )
        .fetch_one(&db.pool)
        .await
        .expect("the mark's row")
    };
    let mut versions = Vec::new();
    for position in [3, 4, 3] {
        let receipt = inbox.receive(&at(position), handler).await.expect("gap");
        assert_eq!(receipt, Receipt::Gap { expected: 2 });
        versions.push(row_version().await);
    }
    // A redelivery of a position already refused, within the minute, writes nothing.
    assert_ne!(
        versions[0], versions[1],
        "a higher refused position is noted"
    );
    assert_eq!(
        versions[1], versions[2],
        "the repeat left the row as it was"
    );
    let marks = inbox::list_watermarks(&db.pool, Some("replica"))
        .await
        .expect("marks");
    let gap = marks[0].gap.clone().expect("the mark waits on a gap");
    assert_eq!((gap.expected, gap.received), (2, 4), "{gap:?}");
}

/// A wait younger than `GAP_SHOWN_AFTER` is not logged; a minute on, a redelivery logs it, once.
async fn the_wait_is_logged_once_it_outlived_a_few_redeliveries(
    db: &TestDb,
    inbox: &Inbox,
    handler: &common::inbox::Recording,
    recorder: &Recorder,
) {
    let warned = || -> Vec<_> {
        recorder
            .events()
            .into_iter()
            .filter(|event| event.level == tracing::Level::WARN && event.fields.contains("gap"))
            .collect()
    };
    assert!(
        warned().is_empty(),
        "a wait younger than GAP_SHOWN_AFTER is a catch-up, not logged: {:?}",
        warned()
    );
    // A minute on (the wait's start moved back rather than waited out), a redelivery logs it.
    sqlx::query("UPDATE ordo.inbox_watermarks SET gap_since = gap_since - interval '1 minute'")
        .execute(&db.pool)
        .await
        .expect("age the gap");
    for _ in 0..2 {
        let receipt = inbox.receive(&at(3), handler).await.expect("gap");
        assert_eq!(receipt, Receipt::Gap { expected: 2 });
    }
    let warned = warned();
    assert_eq!(
        warned.len(),
        1,
        "logged once the wait outlived a few redeliveries, then not again within the minute: {warned:?}"
    );
    assert!(
        warned[0].fields.contains("expected=2")
            && warned[0].fields.contains("received=3")
            && warned[0].fields.contains("since="),
        "{warned:?}"
    );
}

/// `ordo inbox watermarks` shows the wait; `ordo inbox set-watermark` refuses a typo, moves the
/// real pair (the gap's wait ends), and with `--create` makes a mark for a new source.
async fn set_watermark_ends_the_wait(
    db: &TestDb,
    inbox: &Inbox,
    handler: &common::inbox::Recording,
) {
    let (ok, table, err) = db.ordo(&["inbox", "watermarks"]);
    assert!(
        ok && table.contains("waiting on a gap since")
            && table.contains("position 2 has not arrived"),
        "{table}{err}"
    );
    // A typo is refused, naming what exists; the real pair moves.
    let (ok, _, err) = db.ordo(&["inbox", "set-watermark", "replica", "order", "2"]);
    assert!(
        !ok && err.contains("\"order\"") && err.contains("\"orders\"") && err.contains("--create"),
        "{err}"
    );
    let (ok, _, err) = db.ordo(&["inbox", "set-watermark", "replica", "orders", "2"]);
    assert!(ok, "{err}");
    assert_eq!(
        inbox.receive(&at(3), handler).await.expect("3"),
        Receipt::Handled
    );
    assert_eq!(
        inbox.receive(&at(4), handler).await.expect("4"),
        Receipt::Handled
    );
    let marks = inbox::list_watermarks(&db.pool, Some("replica"))
        .await
        .expect("marks");
    assert_eq!(marks[0].position, 4);
    assert!(marks[0].gap.is_none(), "{:?}", marks[0]);
    // --create makes a mark for a source this consumer has not seen.
    let (ok, _, err) = db.ordo(&[
        "inbox",
        "set-watermark",
        "replica",
        "billing",
        "10",
        "--create",
    ]);
    assert!(ok, "{err}");
    assert_eq!(
        inbox
            .receive(
                &InboxMessage::new("b-11", "{}").with_source("billing", 11),
                handler
            )
            .await
            .expect("11"),
        Receipt::Handled
    );
}
