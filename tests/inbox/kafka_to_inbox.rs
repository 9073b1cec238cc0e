//! End to end between two ordo databases over Kafka (librdkafka's mock cluster in a process of
//! its own): A's relay sends its commit lane to a topic, B's Kafka inbox adapter takes it into
//! B's inbox in watermark mode, whose handler keeps a projection. Writers keep committing (and
//! rolling back) on A while A's relay is killed mid-stream, and B's adapter is killed twice: in
//! its handler before the inbox committed position 20 (offsets committed every 10 ms), then
//! after its inbox committed position 40 and before the group's offset was committed. B's
//! projection must hold A's committed events exactly once, each at its commit position.
#![cfg(all(feature = "kafka", feature = "nats", feature = "rabbitmq"))]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::kafka::{MockKafka, committed, count, topic_name};
use common::projection::{
    Project, SOURCE, a_outbox, assert_projection_is_a_commit_lane, b_inbox, create_projection,
    in_commit_order, start_writers, stop_once_projected, writers_done,
};
use common::relays::config;
use common::{TestDb, eventually, run_then_kill};
use ordo::inbox::{KafkaInbox, Redelivery};
use ordo::relay::kafka::KafkaSink;
use sqlx::PgPool;
use tokio::sync::{Notify, mpsc};

const PATIENCE: Duration = Duration::from_secs(60);
const RELAY: &str = "a-to-kafka";
const GROUP: &str = "b-projection";

/// B's adapter; `commit_interval` how often it commits the offsets it settled.
fn adapter(kafka: &MockKafka, topic: &str, commit_interval: Duration) -> KafkaInbox {
    KafkaInbox::builder(&kafka.bootstrap, GROUP, [topic])
        .commit_interval(commit_interval)
        .session_timeout(Duration::from_secs(6))
        .redelivery(
            Redelivery::default()
                .busy(Duration::from_millis(50))
                .gap(Duration::from_millis(50))
                .retry_backoff(Duration::from_millis(50), Duration::from_millis(200)),
        )
        .build()
        .expect("adapter")
}

fn relay_config() -> ordo::relay::RelayConfig {
    config(RELAY)
        .source(SOURCE)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_over_kafka_into_a_watermark_inbox_projects_each_event_once_across_kills() {
    let kafka = Arc::new(MockKafka::start(1));
    let topic = topic_name("a-commit-lane");
    kafka.topic(&topic, 1);
    let a = TestDb::new().await;
    let b = TestDb::new().await;
    create_projection(&b.pool).await;
    let outbox = a_outbox(a.pool.clone()).await;
    let writers = start_writers(&outbox);

    kill_a_relay_once_the_topic_holds_60(&a, &kafka, &topic).await;
    // Its successor, for the rest of the test (it takes over once the lease expires).
    let relay = outbox
        .relay(relay_config(), sink(&kafka, &topic), in_commit_order)
        .await
        .expect("relay");

    // B's first adapter commits offsets every 10 ms and is killed inside its handler at
    // position 20, before the inbox committed it: the group's offset must not be past it (an
    // offset committed on receipt would lose position 20 for good).
    kill_adapter_at(
        &b.url,
        adapter(&kafka, &topic, Duration::from_millis(10)),
        20,
        false,
    )
    .await;
    let offset = group_offset(&kafka, &topic).await;
    assert!(
        offset.is_some(),
        "the first adapter committed offsets before position 20"
    );
    // B's second adapter commits offsets once an hour and is killed after its inbox committed
    // position 40: between the inbox commit and the offset commit.
    kill_adapter_at(
        &b.url,
        adapter(&kafka, &topic, Duration::from_secs(3600)),
        40,
        true,
    )
    .await;
    assert_eq!(
        group_offset(&kafka, &topic).await,
        offset,
        "the second adapter died before committing an offset"
    );
    let committed = writers_done(writers, &a).await;

    // B's next adapter, until the projection has every committed event: it gets positions
    // 1 to 40 again, which the inbox answers as duplicates.
    let inbox = b_inbox(b.pool.clone());
    let survivor = adapter(&kafka, &topic, Duration::from_millis(200));
    let projecting = Project::default();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (ran, ()) = tokio::join!(
        survivor.run(&inbox, &projecting, async move {
            let _ = stopped.await;
        }),
        stop_once_projected(&b.pool, committed, stop)
    );
    ran.expect("the adapter ran");
    relay.shutdown().await;

    assert_projection_is_a_commit_lane(&a, &b, committed).await;
    // The clean stop committed the survivor's offsets.
    let offset = group_offset(&kafka, &topic).await;
    assert!(offset.is_some_and(|o| o >= committed), "{offset:?}");
    drop(outbox);
}

/// A's relay, killed once the topic holds 60 records.
async fn kill_a_relay_once_the_topic_holds_60(a: &TestDb, kafka: &Arc<MockKafka>, topic: &str) {
    let (url, victim_kafka, victim_topic) = (a.url.clone(), Arc::clone(kafka), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        run_then_kill(move || async move {
            let pool = PgPool::connect(&url).await.expect("victim pool");
            let outbox = a_outbox(pool).await;
            let _relay = outbox
                .relay(
                    relay_config(),
                    sink(&victim_kafka, &victim_topic),
                    in_commit_order,
                )
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
}

async fn group_offset(kafka: &Arc<MockKafka>, topic: &str) -> Option<i64> {
    let (reader, topic) = (Arc::clone(kafka), topic.to_owned());
    tokio::task::spawn_blocking(move || committed(&reader.bootstrap, GROUP, &topic))
        .await
        .expect("the group's offset")
}

/// Runs `victim` on B until its handler reaches `position`, then kills it (drops its runtime):
/// inside the handler, or (`after_commit`) once the inbox committed that position.
async fn kill_adapter_at(b_url: &str, victim: KafkaInbox, position: u64, after_commit: bool) {
    let b_url = b_url.to_owned();
    tokio::task::spawn_blocking(move || {
        run_then_kill(move || async move {
            // The victim's own pool: its connections die with its runtime.
            let b_pool = PgPool::connect(&b_url).await.expect("victim pool on B");
            let inbox = b_inbox(b_pool.clone());
            let (entered, mut entering) = mpsc::unbounded_channel();
            let go = Arc::new(Notify::new());
            let gated = Project {
                gate: Some((position, entered, Arc::clone(&go))),
            };
            let consuming = tokio::spawn(async move {
                let _ = victim.run(&inbox, &gated, std::future::pending()).await;
            });
            let reached = tokio::time::timeout(PATIENCE, entering.recv()).await;
            assert!(reached.is_ok(), "the adapter reached position {position}");
            if after_commit {
                go.notify_one();
                let committed = eventually(PATIENCE, || async {
                    let at: i64 =
                        sqlx::query_scalar("SELECT count(*) FROM projection WHERE position = $1")
                            .bind(i64::try_from(position).unwrap_or(i64::MAX))
                            .fetch_one(&b_pool)
                            .await
                            .expect("the projection");
                    at > 0
                })
                .await;
                assert!(committed, "position {position} committed");
            }
            drop(consuming);
        });
    })
    .await
    .expect("the killed adapter");
}
