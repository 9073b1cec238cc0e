//! A relay to Kafka (librdkafka's mock cluster in a process of its own) killed mid-stream, then
//! its broker's connections cut, then its broker silent: the successor takes over, the cut and
//! the silence are outages (nothing parked, no attempt), the relay resumes by itself, and the
//! topic holds every event once after deduplication by `ordo-event-id`, each key's events in
//! one partition, in order. Its own test binary: it reads the relay's counters through a
//! process-wide metrics recorder.
#![cfg(all(feature = "kafka", feature = "nats", feature = "rabbitmq"))]

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::counters::Counters;
use common::kafka::{MockKafka, assert_each_once_in_key_order, count, read_topic, topic_name};
use common::keyed::{Parcel, publish};
use common::relays::{keys, parcels, relayed};
use common::subscribers::PATIENCE;
use common::{TestDb, eventually, run_then_kill};
use metrics_util::debugging::DebuggingRecorder;
use ordo::relay::RelayConfig;
use ordo::relay::kafka::KafkaSink;
use ordo::{Outbox, OutboxConfig};
use sqlx::PgPool;

const RELAY: &str = "to-kafka";

/// Short timing, with a delivery timeout (half the deadline) that a mock broker meets.
fn config() -> RelayConfig {
    common::relays::config(RELAY)
        .batch_deadline(Duration::from_secs(2))
        .lease(Duration::from_secs(3))
}

fn sink(kafka: &MockKafka, topic: &str) -> KafkaSink {
    KafkaSink::builder(&kafka.bootstrap)
        .topic(topic)
        .build()
        .expect("sink")
}

async fn in_topic(kafka: &Arc<MockKafka>, topic: &str) -> i64 {
    let (kafka, topic) = (Arc::clone(kafka), topic.to_owned());
    tokio::task::spawn_blocking(move || count(&kafka.bootstrap, &topic))
        .await
        .expect("count")
}

async fn event_ids(pool: &PgPool) -> HashSet<String> {
    sqlx::query_scalar::<_, String>("SELECT id::text FROM ordo.events WHERE payload IS NOT NULL")
        .fetch_all(pool)
        .await
        .expect("event ids")
        .into_iter()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_relay_delivers_each_event_once_in_key_order_across_a_kill_a_cut_and_silence() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).expect("the only recorder of this binary");
    let mut counters = Counters::default();
    let kafka = Arc::new(MockKafka::start(1));
    let topic = topic_name("parcels");
    kafka.topic(&topic, 4);
    let db = TestDb::new().await;
    let outbox = Outbox::<Parcel>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    publish(&outbox, parcels(0, 200)).await;

    // The first relay, killed once the topic holds 60 records: mid-stream.
    let (url, victim_kafka, victim_topic) = (db.url.clone(), Arc::clone(&kafka), topic.clone());
    tokio::task::spawn_blocking(move || {
        run_then_kill(move || async move {
            let pool = PgPool::connect(&url).await.expect("victim pool");
            let outbox = Outbox::<Parcel>::new(pool, OutboxConfig::default())
                .await
                .expect("victim outbox");
            let _relay = outbox
                .relay(config(), sink(&victim_kafka, &victim_topic), keys)
                .await
                .expect("relay");
            let sent = eventually(PATIENCE, || async {
                in_topic(&victim_kafka, &victim_topic).await >= 60
            })
            .await;
            assert!(sent, "the first relay sent 60 records");
        });
    })
    .await
    .expect("the killed relay");

    // Its successor takes over once the lease expires.
    let relay = outbox
        .relay(config(), sink(&kafka, &topic), keys)
        .await
        .expect("relay");
    relayed(&relay, &db.pool, 200).await;

    // The broker's connections cut, new ones refused, while events keep coming.
    let settled = |counters: &Counters| {
        counters.get("ordo_relay_events_total", Some("released"))
            + counters.get("ordo_relay_events_total", Some("parked"))
    };
    counters.add(&snapshotter);
    let before = settled(&counters);
    kafka.down();
    publish(&outbox, parcels(200, 60)).await;
    let cut_seen = eventually(PATIENCE, || {
        counters.add(&snapshotter);
        let seen = settled(&counters) > before;
        async move { seen }
    })
    .await;
    assert!(cut_seen, "no batch failed while the broker was down");
    kafka.up();
    relayed(&relay, &db.pool, 260).await;

    // A broker that stops answering: every answer delayed past the deadline.
    counters.add(&snapshotter);
    let before = settled(&counters);
    kafka.silent_for(Duration::from_secs(10));
    publish(&outbox, parcels(260, 60)).await;
    let down = eventually(PATIENCE, || async {
        relay
            .status()
            .last_error
            .is_some_and(|error| error.contains("sink down"))
    })
    .await;
    assert!(
        down,
        "the silent broker shows as the sink down: {:?}",
        relay.status()
    );
    counters.add(&snapshotter);
    assert!(
        settled(&counters) > before,
        "the deadline released the batch"
    );
    kafka.up();
    relayed(&relay, &db.pool, 320).await;
    counters.add(&snapshotter);
    assert_eq!(
        counters.get("ordo_relay_events_total", Some("parked")),
        0,
        "an outage was blamed on its events"
    );
    assert!(relay.status().stalled.is_empty(), "{:?}", relay.status());
    relay.shutdown().await;

    let ids = event_ids(&db.pool).await;
    assert_eq!(ids.len(), 320);
    let (reader, read_from) = (Arc::clone(&kafka), topic.clone());
    let records = tokio::task::spawn_blocking(move || read_topic(&reader.bootstrap, &read_from))
        .await
        .expect("read the topic");
    assert_each_once_in_key_order(&records, &ids, |payload| {
        serde_json::from_slice::<Parcel>(payload)
            .expect("a parcel")
            .id
    });
    assert!(records.iter().all(|r| r.key.is_some()));
}
