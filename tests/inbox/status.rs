//! `ordo status` on the receiving side and its closing words, run as a real process: an
//! inbox's failed messages, a mark held by a failing position (named as failing, never as a
//! gap to skip), a gap shown only once it outlived a few redeliveries, and one line per stuck
//! thing, "nothing is stuck" only when nothing is.
#![cfg(feature = "cli")]

use crate::common;

use common::TestDb;
use common::inbox::{Recording, effects_table};
use ordo::inbox::{Inbox, InboxConfig, InboxMessage, InboxMode, Receipt};

/// A watermark consumer `replica` of source `orders`, with position 1 handled (the database
/// given its handler's `effects` table).
async fn replica(db: &TestDb) -> Inbox {
    effects_table(&db.pool).await;
    let config = InboxConfig::new("replica")
        .mode(InboxMode::Watermark)
        .max_attempts(5);
    let inbox = Inbox::new(db.pool.clone(), config).expect("inbox");
    let first = InboxMessage::new("o-1", "{}").with_source("orders", 1);
    let receipt = inbox.receive(&first, &Recording::default()).await;
    assert_eq!(receipt.expect("receive"), Receipt::Handled);
    inbox
}

/// `ordo ARGS`, which must succeed: its stdout.
fn ordo_ok(db: &TestDb, args: &[&str]) -> String {
    let (ok, out, err) = db.ordo(args);
    assert!(ok, "ordo {args:?}: {err}");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_failed_messages_and_names_a_failing_position_as_failing() {
    let db = TestDb::new().await;
    let replica = replica(&db).await;
    let failing = Recording::failing(u32::MAX);
    let billing =
        Inbox::new(db.pool.clone(), InboxConfig::new("billing").max_attempts(1)).expect("inbox");
    let receipt = billing
        .receive(&InboxMessage::new("m-1", "{}"), &failing)
        .await;
    assert!(matches!(receipt.expect("receive"), Receipt::Failed { .. }));

    // Position 2 arrives and its handler fails; 3 comes meanwhile and is refused behind it.
    let second = InboxMessage::new("o-2", "{}").with_source("orders", 2);
    let receipt = replica.receive(&second, &failing).await.expect("receive");
    assert!(matches!(receipt, Receipt::Retry { .. }), "{receipt:?}");
    let third = InboxMessage::new("o-3", "{}").with_source("orders", 3);
    let receipt = replica.receive(&third, &failing).await.expect("receive");
    assert_eq!(receipt, Receipt::Gap { expected: 2 });

    let table = ordo_ok(&db, &["status"]);
    assert!(
        table.contains("inbox consumer \"billing\": 1 failed message(s)"),
        "{table}"
    );
    let stuck: Vec<&str> = table
        .lines()
        .filter(|line| line.starts_with("STUCK inbox consumer \"replica\""))
        .collect();
    assert_eq!(stuck.len(), 1, "{table}");
    assert!(stuck[0].contains("position 2 is failing"), "{table}");
    assert!(stuck[0].contains("3 was refused"), "{table}");
    for wrong in ["has not arrived", "set-watermark", "nothing is stuck"] {
        assert!(!table.contains(wrong), "{wrong:?} in:\n{table}");
    }
    let marks = ordo_ok(&db, &["inbox", "watermarks"]);
    assert!(marks.contains("position 2 is failing"), "{marks}");
    assert!(!marks.contains("has not arrived"), "{marks}");

    let json: serde_json::Value =
        serde_json::from_str(&ordo_ok(&db, &["status", "--json"])).expect("one JSON object");
    assert_eq!(json["inbox"]["failed"][0]["consumer"], "billing");
    assert_eq!(json["inbox"]["failed"][0]["count"], 1);
    let wait = &json["inbox"]["marks"][0]["waits_on"];
    assert_eq!(
        (&wait["kind"], &wait["position"]),
        (&"failing".into(), &2.into())
    );

    let prometheus = ordo_ok(&db, &["status", "--prometheus"]);
    for sample in [
        "ordo_inbox_failed_messages{consumer=\"billing\"} 1",
        "ordo_inbox_watermark_position{consumer=\"replica\",source=\"orders\",route=\"\"} 1",
        "ordo_inbox_watermark_failing_attempts{consumer=\"replica\",source=\"orders\",route=\"\"} 1",
    ] {
        assert!(prometheus.contains(sample), "{sample} in:\n{prometheus}");
    }
    assert!(prometheus.contains("ordo_inbox_oldest_failed_seconds{consumer=\"billing\"}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_is_shown_once_it_outlived_a_few_redeliveries_with_what_ends_it() {
    let db = TestDb::new().await;
    let replica = replica(&db).await;
    let third = InboxMessage::new("o-3", "{}").with_source("orders", 3);
    let receipt = replica.receive(&third, &Recording::default()).await;
    assert_eq!(receipt.expect("receive"), Receipt::Gap { expected: 2 });

    // Just refused: a catch-up in progress, not shown.
    let table = ordo_ok(&db, &["status"]);
    assert!(table.contains("nothing is stuck"), "{table}");
    let marks = ordo_ok(&db, &["inbox", "watermarks"]);
    assert!(!marks.contains("waiting on a gap"), "{marks}");
    let prometheus = ordo_ok(&db, &["status", "--prometheus"]);
    assert!(
        !prometheus.contains("ordo_inbox_gap_seconds{"),
        "{prometheus}"
    );

    // A minute later (the wait's start moved back rather than waited out).
    sqlx::query("UPDATE ordo.inbox_watermarks SET gap_since = gap_since - interval '1 minute'")
        .execute(&db.pool)
        .await
        .expect("age the gap");
    let table = ordo_ok(&db, &["status"]);
    let stuck: Vec<&str> = table
        .lines()
        .filter(|line| line.starts_with("STUCK inbox consumer \"replica\" from \"orders\""))
        .collect();
    assert_eq!(stuck.len(), 1, "{table}");
    assert!(stuck[0].contains("position 2 has not arrived"), "{table}");
    assert!(
        stuck[0].contains("`ordo inbox set-watermark replica orders 2`"),
        "{table}"
    );
    let marks = ordo_ok(&db, &["inbox", "watermarks"]);
    assert!(marks.contains("waiting on a gap since"), "{marks}");
    let prometheus = ordo_ok(&db, &["status", "--prometheus"]);
    let waited: Option<f64> = prometheus
        .lines()
        .find_map(|line| {
            line.strip_prefix(
                "ordo_inbox_gap_seconds{consumer=\"replica\",source=\"orders\",route=\"\"} ",
            )
        })
        .and_then(|value| value.parse().ok());
    assert!(waited.is_some_and(|s| s >= 60.0), "{prometheus}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_each_stuck_thing_on_a_line_and_nothing_stuck_only_when_nothing_is() {
    let db = TestDb::new().await;
    let table = ordo_ok(&db, &["status"]);
    assert!(
        table.contains("nothing is stuck: no lane stall, no halted subscription or relay"),
        "{table}"
    );

    sqlx::query(
        "INSERT INTO ordo.subscriptions (name, lane, position, kind, status, last_error, sink_down_since, sink_down_reason) VALUES \
         ('notify', 'insert', 0, 'subscription', 'active', NULL, NULL, NULL), \
         ('mailer', 'commit', 0, 'relay', 'active', NULL, now(), 'connection refused'), \
         ('ledger', 'insert', 4, 'subscription', 'halted', 'boom', NULL, NULL)",
    )
    .execute(&db.pool)
    .await
    .expect("subscriptions");
    sqlx::query(
        "INSERT INTO ordo.subscription_progress (subscription, position, keys, state, attempts, last_error) VALUES \
         ('notify', 3, ARRAY['alice'], 'stalled', 5, 'no such recipient'), \
         ('mailer', 7, ARRAY['bob'], 'stalled', 10, 'the endpoint answered 400')",
    )
    .execute(&db.pool)
    .await
    .expect("a stalled key and a parked event");

    let table = ordo_ok(&db, &["status"]);
    let stuck: Vec<&str> = table.lines().filter(|l| l.starts_with("STUCK ")).collect();
    assert_eq!(stuck.len(), 4, "one line per stuck thing:\n{table}");
    for expected in [
        "STUCK subscription \"notify\": 1 stalled key(s)",
        "STUCK relay \"mailer\": 1 parked event(s) hold their keys",
        "STUCK relay \"mailer\": its sink is down",
        "STUCK subscription \"ledger\" is halted at insert position 4: boom",
    ] {
        assert!(
            stuck.iter().any(|line| line.starts_with(expected)),
            "{expected:?} in:\n{table}"
        );
    }
    assert!(!table.contains("no stalls"), "{table}");
    assert!(!table.contains("nothing is stuck"), "{table}");
}

/// The inbox's own log says the same as status: a wait behind a position that arrived and
/// fails is a failing message, with no advice to move the mark past it; and nothing is logged
/// while a wait is younger than a few redeliveries. (One thread: the inbox logs where the
/// recorder is installed.)
#[tokio::test(flavor = "current_thread")]
async fn a_wait_behind_a_failing_message_is_logged_as_such_never_as_a_gap() {
    use tracing_subscriber::layer::SubscriberExt;

    let recorder = common::logs::Recorder::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(recorder.clone()));
    let db = TestDb::new().await;
    let replica = replica(&db).await;
    let failing = Recording::failing(u32::MAX);
    let at = |position: u64| {
        InboxMessage::new(format!("o-{position}"), "{}").with_source("orders", position)
    };
    let receipt = replica.receive(&at(2), &failing).await.expect("receive");
    assert!(matches!(receipt, Receipt::Retry { .. }), "{receipt:?}");
    let receipt = replica.receive(&at(3), &failing).await.expect("receive");
    assert_eq!(receipt, Receipt::Gap { expected: 2 });
    let waits = || -> Vec<String> {
        recorder
            .events()
            .into_iter()
            .filter(|event| event.level == tracing::Level::WARN && event.fields.contains("waits"))
            .map(|event| event.fields)
            .collect()
    };
    assert!(waits().is_empty(), "a young wait is logged: {:?}", waits());

    sqlx::query("UPDATE ordo.inbox_watermarks SET gap_since = gap_since - interval '1 minute'")
        .execute(&db.pool)
        .await
        .expect("age the wait");
    let receipt = replica.receive(&at(3), &failing).await.expect("receive");
    assert_eq!(receipt, Receipt::Gap { expected: 2 });
    let waits = waits();
    assert_eq!(waits.len(), 1, "{waits:#?}");
    assert!(
        waits[0].contains("waits on a failing message") && waits[0].contains("failing=2"),
        "{waits:#?}"
    );
    assert!(
        !waits[0].contains("has not arrived") && !waits[0].contains("set-watermark"),
        "{waits:#?}"
    );
}
