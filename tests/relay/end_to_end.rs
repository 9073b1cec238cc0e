//! Relays end to end against the real NATS JetStream: every event delivered and, after the
//! stream's deduplication by message id, exactly once, in order per key, across a relay killed
//! mid-stream with a standby taking over, and a permanently failing key parked while the others
//! go on. The broker faults are in `tests/relay_faults.rs`.
#![cfg(all(feature = "nats", feature = "rabbitmq"))]

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::Duration;

use common::brokers::{NATS_ADDR, TestStream};
use common::keyed::{Parcel, publish};
use common::relays::{assert_stream_holds_each_once_in_key_order, config, keys, parcels, relayed};
use common::subscribers::PATIENCE;
use common::{TestDb, eventually, run_then_kill};
use ordo::relay::OnParked;
use ordo::relay::nats::NatsSink;
use ordo::{Error, Outbox, OutboxConfig};
use sqlx::PgPool;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_failure_parks_its_key_only_until_requeued() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Parcel>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let stream = TestStream::new().await;
    let broken = Arc::new(AtomicBool::new(true));
    let prefix = stream.prefix.clone();
    let flag = Arc::clone(&broken);
    let sink = NatsSink::builder(NATS_ADDR)
        .subject(move |message| {
            if message.key.as_deref() == Some("k3") && flag.load(AtomicOrdering::SeqCst) {
                // Not a valid subject: the sink calls it permanent.
                "no spaces allowed".to_owned()
            } else {
                format!("{prefix}.{}", message.type_or_untyped())
            }
        })
        .build()
        .expect("sink");
    let relay = outbox
        .relay(config("to-nats"), sink, keys)
        .await
        .expect("relay");
    publish(&outbox, parcels(0, 70)).await;
    let (status, parked) = relay.wait_for(PATIENCE, |s| s.stalled.len() == 1).await;
    assert!(parked, "{status:?}");
    assert_eq!(status.stalled[0].key, "k3");
    assert_eq!(
        status.stalled[0].attempts, 1,
        "a permanent error parks at once"
    );
    // Every other key is delivered; k3 waits at its first event.
    assert!(eventually(PATIENCE, || async { stream.len().await == 60 }).await);
    let listed = ordo::admin::list_stalled_keys(&db.pool, "to-nats")
        .await
        .expect("parked");
    assert_eq!(listed.len(), 1);

    broken.store(false, AtomicOrdering::SeqCst);
    requeue(&db, "to-nats", "k3").await;
    relayed(&relay, &db.pool, 70).await;
    relay.shutdown().await;
    assert_stream_holds_each_once_in_key_order(&stream, &db.pool).await;
}

/// `OnParked::Continue`: the later events of a parked event's key are delivered, in order,
/// while it stays parked (holding the watermark); requeued, it is delivered last of its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_continue_a_parked_event_lets_the_later_events_of_its_key_go_on() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Parcel>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let stream = TestStream::new().await;
    let broken = Arc::new(AtomicBool::new(true));
    let prefix = stream.prefix.clone();
    let flag = Arc::clone(&broken);
    let sink = NatsSink::builder(NATS_ADDR)
        .subject(move |message| {
            let parcel: Parcel = serde_json::from_slice(&message.payload).expect("a parcel");
            if parcel.id == 3 && flag.load(AtomicOrdering::SeqCst) {
                "no spaces allowed".to_owned() // permanent: parked at once
            } else {
                format!("{prefix}.{}", message.type_or_untyped())
            }
        })
        .build()
        .expect("sink");
    let config = config("to-nats").on_parked(OnParked::Continue);
    let relay = outbox.relay(config, sink, keys).await.expect("relay");
    publish(&outbox, parcels(0, 70)).await;
    // Everything but parcel 3 arrives, k3's later parcels (10, 17, ...) included.
    assert!(eventually(PATIENCE, || async { stream.len().await == 69 }).await);
    let (status, parked) = relay.wait_for(PATIENCE, |s| s.stalled.len() == 1).await;
    assert!(parked, "{status:?}");
    assert_eq!(status.stalled[0].key, "k3");
    let parked_at = status.stalled[0].position;
    // The parked event waits in the backlog, alone: it holds neither its key nor the watermark.
    let (status, passed) = relay
        .wait_for(PATIENCE, |s| s.position.get() > parked_at.get())
        .await;
    assert!(
        passed,
        "the watermark moves past the parked event: {status:?}"
    );
    assert_stream_order_of_k3(&stream, &[10, 17, 24, 31, 38, 45, 52, 59, 66]).await;

    broken.store(false, AtomicOrdering::SeqCst);
    requeue(&db, "to-nats", "k3").await;
    relayed(&relay, &db.pool, 70).await;
    let status = relay.status();
    assert!(status.stalled.is_empty(), "{status:?}");
    relay.shutdown().await;
    // Each once; parcel 3 last of its key, the others of k3 still in order.
    assert_stream_order_of_k3(&stream, &[10, 17, 24, 31, 38, 45, 52, 59, 66, 3]).await;
    assert_eq!(stream.len().await, 70);
}

/// The ids of key k3's parcels in the stream, in stream order.
async fn assert_stream_order_of_k3(stream: &TestStream, expected: &[u32]) {
    let k3: Vec<u32> = stream
        .messages()
        .await
        .iter()
        .map(|message| serde_json::from_slice::<Parcel>(&message.payload).expect("a parcel"))
        .filter(|parcel| parcel.keys[0] == "k3")
        .map(|parcel| parcel.id)
        .collect();
    assert_eq!(k3, expected);
}

/// An operator's requeue: `ordo relay parked` shows the key and `ordo relay requeue` asks for
/// it (the API when the CLI is not built).
#[cfg(feature = "cli")]
async fn requeue(db: &TestDb, relay: &str, key: &str) {
    let ordo = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_ordo"))
            .args(args)
            .env("DATABASE_URL", &db.url)
            .output()
            .expect("run ordo")
    };
    let parked = ordo(&["relay", "parked", relay]);
    let table = String::from_utf8_lossy(&parked.stdout);
    assert!(
        parked.status.success() && table.lines().any(|l| l.starts_with(key)),
        "{table}"
    );
    let asked = ordo(&["relay", "requeue", relay, key]);
    let said = String::from_utf8_lossy(&asked.stderr);
    assert!(
        asked.status.success() && said.contains("1 parked events"),
        "{said}"
    );
}

#[cfg(not(feature = "cli"))]
async fn requeue(db: &TestDb, relay: &str, key: &str) {
    ordo::admin::retry_stalled_keys(&db.pool, relay, Some(key))
        .await
        .expect("requeue");
}

/// Runs the relay on its own runtime until the stream holds `at_least` messages, then drops
/// the runtime: a killed process, its lease left to expire.
fn run_until_then_kill(url: String, prefix: String, at_least: u64, stream: &TestStream) {
    let name = stream.name.clone();
    run_then_kill(move || async move {
        let pool = PgPool::connect(&url).await.expect("victim pool");
        let outbox = Outbox::<Parcel>::new(pool, OutboxConfig::default())
            .await
            .expect("outbox");
        let sink = NatsSink::builder(NATS_ADDR)
            .subject_prefix(&prefix)
            .build()
            .expect("sink");
        let _relay = outbox
            .relay(config("to-nats"), sink, keys)
            .await
            .expect("relay");
        let client = async_nats::connect(NATS_ADDR).await.expect("nats");
        let js = async_nats::jetstream::new(client);
        let counted = eventually(PATIENCE, || async {
            let Ok(mut stream) = js.get_stream(&name).await else {
                return false;
            };
            stream
                .info()
                .await
                .map(|info| info.state.messages >= at_least)
                .unwrap_or(false)
        })
        .await;
        assert!(counted);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_relay_takes_over_when_the_first_dies() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Parcel>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let stream = TestStream::new().await;
    publish(&outbox, parcels(0, 400)).await;
    run_until_then_kill(db.url.clone(), stream.prefix.clone(), 40, &stream);
    assert!(
        stream.len().await < 400,
        "the first relay finished before it was killed"
    );
    let sink = NatsSink::builder(NATS_ADDR)
        .subject_prefix(&stream.prefix)
        .build()
        .expect("sink");
    let relay = outbox
        .relay(config("to-nats"), sink, keys)
        .await
        .expect("relay");
    relayed(&relay, &db.pool, 400).await;
    relay.shutdown().await;
    assert_stream_holds_each_once_in_key_order(&stream, &db.pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timing_that_cannot_hold_is_refused_naming_the_settings() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Parcel>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    for (config, setting) in [
        (
            config("r").batch_size(100),
            "batch_size/per_event_budget/batch_deadline",
        ),
        (
            config("r").batch_deadline(Duration::from_secs(3)),
            "batch_deadline/lease",
        ),
        // Shorter than the lease, but a batch started late in it could outlive it: the lease
        // must also hold the margin and a renewal interval (the issue's 25 s of 30 s passes,
        // 28 s does not).
        (
            config("r")
                .batch_deadline(Duration::from_millis(2_800))
                .lease(Duration::from_secs(3)),
            "batch_deadline/lease",
        ),
        (config("r").batch_size(0), "batch_size"),
        (config("r").max_attempts(0), "max_attempts"),
    ] {
        let sink = NatsSink::builder(NATS_ADDR).build().expect("sink");
        let refused = outbox.relay(config, sink, keys).await;
        assert!(
            matches!(&refused, Err(Error::InvalidConfig { setting: s, .. }) if *s == setting),
            "{refused:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_duplicate_window_is_shorter_than_the_resend_span_is_reported() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Parcel>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let short = TestStream::with_duplicate_window(Duration::from_secs(1)).await;
    // The span of the common configuration: batches of 20 (5 halvings) and 10 attempts under a
    // 600 ms deadline, 5 pauses of 100 ms, 9 backoffs of at most 50 ms.
    let span = ordo::relay::SinkTiming::of(&config("strict")).resend_span;
    assert_eq!(span, Duration::from_millis(15 * 600 + 5 * 100 + 9 * 50));
    let strict = NatsSink::builder(NATS_ADDR)
        .subject_prefix(&short.prefix)
        .require_duplicate_window(true)
        .build()
        .expect("sink");
    match outbox.relay(config("strict"), strict, keys).await {
        Err(Error::InvalidConfig { setting, reason }) => {
            assert_eq!(setting, "nats duplicate_window/relay timing");
            assert!(reason.contains(&short.name), "{reason}");
            assert!(
                reason.contains("1s") && reason.contains(&format!("{span:?}")),
                "{reason}"
            );
        }
        other => panic!("a short window was accepted: {:?}", other.map(|_| ())),
    }
    // By default a warning only: the relay runs, and delivers.
    let lenient = NatsSink::builder(NATS_ADDR)
        .subject_prefix(&short.prefix)
        .build()
        .expect("sink");
    let relay = outbox
        .relay(config("lenient"), lenient, keys)
        .await
        .expect("a short window only warns by default");
    publish(&outbox, parcels(0, 5)).await;
    relayed(&relay, &db.pool, 5).await;
    relay.shutdown().await;
    // A window as long as the span is accepted under the strict check.
    let long = TestStream::with_duplicate_window(span).await;
    let strict = NatsSink::builder(NATS_ADDR)
        .subject_prefix(&long.prefix)
        .require_duplicate_window(true)
        .build()
        .expect("sink");
    let relay = outbox
        .relay(config("strict-long"), strict, keys)
        .await
        .expect("a window as long as the span");
    relay.shutdown().await;
}
