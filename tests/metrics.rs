//! Every documented metric is emitted, with the values the scenario implies. One test binary
//! with one global recorder (recorders are process-wide), one test.

mod common;

use std::time::Duration;

use common::{Note, TestDb, eventually};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

/// A label a sample must carry, if any.
type Label = Option<(&'static str, &'static str)>;

/// One snapshot (the debugging recorder resets counters and histograms as it takes one).
type Snapshot = Vec<(
    metrics_util::CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
)>;
use ordo::{
    Delivery, HandlerError, JobConfig, OnExhaustion, Outbox, OutboxConfig, RetryPolicy, Start,
    metrics as names,
};
use sqlx::PgConnection;

struct FailsOnWriterOne;

impl ordo::Subscriber<Note> for FailsOnWriterOne {
    async fn handle(
        &self,
        _tx: &mut PgConnection,
        event: &Delivery<Note>,
    ) -> Result<(), HandlerError> {
        if event.payload.writer == 1 {
            return Err("writer one always fails".into());
        }
        Ok(())
    }
}

/// The sum of a counter, the last value of a gauge, or the count of a histogram's samples,
/// over every label set of `name` whose labels include `label` (when given).
fn value(snapshot: &Snapshot, name: &str, label: Option<(&str, &str)>) -> Option<f64> {
    let mut found = None;
    for (key, _, _, value) in snapshot {
        if key.key().name() != name {
            continue;
        }
        if let Some((k, v)) = label
            && !key.key().labels().any(|l| l.key() == k && l.value() == v)
        {
            continue;
        }
        let v = match value {
            DebugValue::Counter(c) => *c as f64,
            DebugValue::Gauge(g) => g.into_inner(),
            DebugValue::Histogram(samples) => samples.len() as f64,
        };
        *found.get_or_insert(0.0) += v;
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_metric_is_emitted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).expect("the only recorder of this binary");

    let db = TestDb::new().await;
    let config = OutboxConfig::default().gap_grace(Duration::from_millis(10));
    let outbox = Outbox::<Note>::new(db.pool.clone(), config)
        .await
        .expect("outbox");
    four_events_and_a_hole_read_on_both_lanes(&db, &outbox).await;
    three_subscriptions_retry_dead_letter_halt_and_skip(&outbox).await;
    a_relay_delivers_every_event(&outbox).await;
    an_inbox_receives_one_message_twice(&db).await;

    let ready = eventually(Duration::from_secs(10), || async {
        outbox.commit_head().get() >= 4
    })
    .await;
    assert!(ready);
    let snapshot: Snapshot = snapshotter.snapshot().into_vec();
    assert_every_metric_has_the_scenarios_values(&snapshot);
}

/// A rolled-back plain-SQL writer leaves a hole below a committed event: a gap wait and a
/// placeholder. Four events, read on both lanes.
async fn four_events_and_a_hole_read_on_both_lanes(db: &TestDb, outbox: &Outbox<Note>) {
    let mut inserted = outbox.listen_inserted(Start::Beginning);
    let mut committed = outbox.listen_committed(Start::Beginning);
    let mut doomed = db.pool.begin().await.expect("begin");
    sqlx::query(r#"INSERT INTO ordo.events (payload) VALUES ('{"writer": 9, "n": 9}')"#)
        .execute(&mut *doomed)
        .await
        .expect("doomed insert");
    for writer in 0..2u32 {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish_all([Note { writer, n: 0 }, Note { writer, n: 1 }])
            .expect("publish");
        tx.commit().await.expect("commit");
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    doomed.rollback().await.expect("rollback");
    use futures::StreamExt;
    for _ in 0..4 {
        inserted.next().await.expect("open").expect("event");
        committed.next().await.expect("open").expect("event");
    }
}

/// A subscription that retries writer one's events and dead-letters them, one that halts on
/// them, and one that selects none of these events and passes over every one.
async fn three_subscriptions_retry_dead_letter_halt_and_skip(outbox: &Outbox<Note>) {
    let retry = RetryPolicy {
        max_attempts: 2,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(2),
    };
    let job = JobConfig::new("metered")
        .retry(retry)
        .on_exhaustion(OnExhaustion::DeadLetter);
    let handle = outbox
        .subscribe(job, FailsOnWriterOne)
        .await
        .expect("subscribe");
    let (_, done) = handle
        .wait_for(Duration::from_secs(20), |s| s.position.get() >= 5)
        .await;
    assert!(done, "the subscription went through");
    handle.shutdown().await;
    let halting = JobConfig::new("halting").retry(retry);
    let halted = outbox
        .subscribe(halting, FailsOnWriterOne)
        .await
        .expect("subscribe");
    let (_, stopped) = halted
        .wait_for(Duration::from_secs(20), |s| {
            s.state == ordo::SubscriptionState::Halted
        })
        .await;
    assert!(stopped);
    halted.shutdown().await;
    // A subscription that selects none of these events passes over every one.
    let selective = JobConfig::new("selective")
        .event_types(["NoSuchType"])
        .skip_untyped(true);
    let skipping = outbox
        .subscribe(selective, FailsOnWriterOne)
        .await
        .expect("subscribe");
    let (_, passed) = skipping
        .wait_for(Duration::from_secs(20), |s| s.position.get() >= 5)
        .await;
    assert!(passed, "the selective subscription passed over everything");
    skipping.shutdown().await;
}

/// A relay delivers every event to a sink that takes them all: its gauges and counters are
/// labelled `relay`, never `subscription`.
async fn a_relay_delivers_every_event(outbox: &Outbox<Note>) {
    let relay = outbox
        .relay(
            ordo::relay::RelayConfig::new("metered-relay"),
            common::recording_sink::Recording::default(),
            |_| ordo::Keys::none(),
        )
        .await
        .expect("relay");
    let (_, relayed) = relay
        .wait_for(Duration::from_secs(20), |s| s.position.get() >= 4)
        .await;
    assert!(relayed, "the relay delivered everything");
    assert!(
        relay.status().lease_owner.is_some(),
        "a running relay's status names the owner of its lease (the core notes every claim)"
    );
    relay.shutdown().await;
}

/// An inbox consumer receives one message twice.
async fn an_inbox_receives_one_message_twice(db: &TestDb) {
    sqlx::query("CREATE TABLE effects (message_id TEXT NOT NULL, payload TEXT NOT NULL)")
        .execute(&db.pool)
        .await
        .expect("effects table");
    let inbox =
        ordo::Inbox::new(db.pool.clone(), ordo::InboxConfig::new("metered-inbox")).expect("inbox");
    let message = ordo::InboxMessage::new("m-1", "{}");
    for _ in 0..2 {
        let handler = common::inbox::Recording::default();
        inbox.receive(&message, &handler).await.expect("receive");
    }
}

/// Every documented metric of the scenario, at least at the value it implies.
fn assert_every_metric_has_the_scenarios_values(snapshot: &Snapshot) {
    let sub = Some(("subscription", "metered"));
    let expectations: &[(&str, Label, f64)] = &[
        (names::EVENTS_PUBLISHED, None, 4.0),
        (names::INSERT_FRONTIER, None, 5.0),
        (names::INSERT_KNOWN_HEAD, None, 5.0),
        (names::COMMIT_HEAD, None, 4.0),
        (names::FOLD_EVENTS, None, 4.0),
        (names::FOLD_GROUPS, None, 2.0),
        (names::FOLD_APPENDS, Some(("result", "appended")), 1.0),
        (names::FOLD_LAG, None, 0.0),
        (names::DELIVERY_LATENCY, Some(("lane", "insert")), 4.0),
        (names::DELIVERY_LATENCY, Some(("lane", "commit")), 4.0),
        (names::GAP_WAITS, None, 1.0),
        (names::PLACEHOLDERS, None, 1.0),
        (names::SUBSCRIPTION_LAG, sub, 0.0),
        (names::SUBSCRIPTION_EVENTS, sub, 4.0),
        (names::SUBSCRIPTION_RETRIES, sub, 2.0),
        (names::DEAD_LETTERS, sub, 2.0),
        (
            names::SUBSCRIPTION_SKIPPED,
            Some(("subscription", "selective")),
            4.0,
        ),
        (
            names::SUBSCRIPTION_HALTS,
            Some(("subscription", "halting")),
            1.0,
        ),
        (names::RELAY_LAG, Some(("relay", "metered-relay")), 0.0),
        (names::RELAY_EVENTS, Some(("relay", "metered-relay")), 4.0),
        (names::INBOX_RECEIPTS, Some(("receipt", "handled")), 1.0),
        (names::INBOX_RECEIPTS, Some(("receipt", "duplicate")), 1.0),
    ];
    for (name, label, at_least) in expectations {
        let got = value(snapshot, name, *label);
        assert!(got.is_some(), "{name} {label:?} was never emitted");
        assert!(
            got.unwrap_or(0.0) >= *at_least,
            "{name} {label:?} is {got:?}, expected at least {at_least}"
        );
    }
    assert_eq!(
        value(snapshot, names::EVENTS_PUBLISHED, None),
        Some(4.0),
        "plain-SQL writes are not ordo's publishes"
    );
    assert_eq!(value(snapshot, names::COMMIT_HEAD, None), Some(4.0));
    assert_eq!(
        value(
            snapshot,
            names::SUBSCRIPTION_LAG,
            Some(("subscription", "metered-relay"))
        ),
        None,
        "a relay's lag is ordo_relay_lag, not a subscription's"
    );
}

/// Records what `describe_*!` tells a recorder: each name with its unit and description.
#[derive(Default)]
struct Descriptions(std::sync::Mutex<Vec<(String, Option<metrics::Unit>, String)>>);

impl Descriptions {
    fn push(
        &self,
        key: metrics::KeyName,
        unit: Option<metrics::Unit>,
        text: metrics::SharedString,
    ) {
        if let Ok(mut all) = self.0.lock() {
            all.push((key.as_str().to_owned(), unit, text.to_string()));
        }
    }
}

impl metrics::Recorder for Descriptions {
    fn describe_counter(
        &self,
        key: metrics::KeyName,
        unit: Option<metrics::Unit>,
        text: metrics::SharedString,
    ) {
        self.push(key, unit, text);
    }
    fn describe_gauge(
        &self,
        key: metrics::KeyName,
        unit: Option<metrics::Unit>,
        text: metrics::SharedString,
    ) {
        self.push(key, unit, text);
    }
    fn describe_histogram(
        &self,
        key: metrics::KeyName,
        unit: Option<metrics::Unit>,
        text: metrics::SharedString,
    ) {
        self.push(key, unit, text);
    }
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::noop()
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

#[test]
fn every_documented_metric_is_described_with_its_unit() {
    let documented: Vec<String> = include_str!("../src/telemetry/metrics.rs")
        .lines()
        .filter_map(|line| line.strip_prefix("//! | `"))
        .filter_map(|rest| rest.split('`').next())
        .filter(|name| name.starts_with("ordo_"))
        .map(str::to_owned)
        .collect();
    assert!(documented.len() > 20, "read the table: {documented:?}");
    let recorder = Descriptions::default();
    metrics::with_local_recorder(&recorder, ordo::metrics::describe);
    let described = recorder.0.lock().map(|all| all.clone()).unwrap_or_default();
    for name in &documented {
        let Some((_, unit, text)) = described.iter().find(|(described, _, _)| described == name)
        else {
            panic!("{name} is documented but not described: {described:?}");
        };
        let want = if name.ends_with("_seconds") {
            metrics::Unit::Seconds
        } else {
            metrics::Unit::Count
        };
        assert_eq!(*unit, Some(want), "{name}");
        assert!(!text.is_empty(), "{name}");
    }
    assert_eq!(
        described.len(),
        documented.len(),
        "described but not documented: {described:?}"
    );
}
