//! A relay to a real RabbitMQ queue through a TCP proxy that first black-holes the broker's
//! answers (its confirms never come: the batch deadline fires, the connection is rebuilt) and
//! then cuts the connection mid-stream (new ones refused): the batches are released without an
//! attempt counted against their events, nothing is parked, and once the broker is reachable
//! again every event is in the queue at least once, exactly once after the consumer's
//! deduplication by `message_id`, in order per key. Its own test binary: it reads the relay's
//! counters through a process-wide metrics recorder.
#![cfg(all(feature = "nats", feature = "rabbitmq"))]

mod common;

use std::collections::{HashMap, HashSet};

use common::brokers::{RABBIT_ADDR, TestQueue, addr, amqp_uri};
use common::counters::Counters;
use common::keyed::{Parcel, publish};
use common::relays::{config, keys, parcels, relayed};
use common::subscribers::PATIENCE;
use common::tcp_fault::{Fault, TcpFault};
use common::{TestDb, eventually};
use metrics_util::debugging::{DebuggingRecorder, Snapshotter};
use ordo::relay::rabbitmq::RabbitSink;
use ordo::{Outbox, OutboxConfig};

/// Waits until the relay released (or parked) more events than `before`: a batch's verdict
/// came back from the fault.
async fn settled_past(counters: &mut Counters, snapshotter: &Snapshotter, before: u64) -> bool {
    eventually(PATIENCE, || {
        counters.add(snapshotter);
        let settled = counters.get("ordo_relay_events_total", Some("released"))
            + counters.get("ordo_relay_events_total", Some("parked"));
        async move { settled > before }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_then_cut_rabbitmq_link_loses_nothing_and_blames_no_event() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).expect("the only recorder of this binary");
    let mut counters = Counters::default();

    let db = TestDb::new().await;
    let outbox = Outbox::<Parcel>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let queue = TestQueue::new().await;
    let proxy = TcpFault::start(addr(RABBIT_ADDR)).await;
    let sink = RabbitSink::builder(amqp_uri(proxy.addr()))
        .exchange(&queue.exchange)
        .build()
        .expect("sink");
    // One attempt only: a fault that counted one would park the event for good.
    let relay = outbox
        .relay(config("to-rabbit").max_attempts(1), sink, keys)
        .await
        .expect("relay");
    publish(&outbox, parcels(0, 60)).await;
    relayed(&relay, &db.pool, 60).await;

    // The broker's confirms are swallowed while its queue still takes the publishes.
    proxy.set(Fault::BlackHole);
    publish(&outbox, parcels(60, 60)).await;
    assert!(
        settled_past(&mut counters, &snapshotter, 0).await,
        "no batch deadline expired while the confirms were black-holed"
    );
    assert_eq!(
        counters.get("ordo_relay_events_total", Some("parked")),
        0,
        "an expired deadline was blamed on its events"
    );
    proxy.set(Fault::Pass);
    relayed(&relay, &db.pool, 120).await;
    counters.add(&snapshotter);
    let released = counters.get("ordo_relay_events_total", Some("released"));

    // Mid-stream, the connection is cut and new ones refused.
    let writer = {
        let outbox = outbox.clone();
        tokio::spawn(async move { publish(&outbox, parcels(120, 120)).await })
    };
    assert!(
        eventually(PATIENCE, || async { relay.status().position.get() >= 130 }).await,
        "the relay did not go on after the black hole"
    );
    proxy.set(Fault::Cut);
    assert!(
        settled_past(&mut counters, &snapshotter, released).await,
        "no batch failed while the connection was cut"
    );
    proxy.set(Fault::Pass);
    writer.await.expect("the writer");
    relayed(&relay, &db.pool, 240).await;

    counters.add(&snapshotter);
    assert_eq!(counters.get("ordo_relay_events_total", Some("parked")), 0);
    assert_eq!(
        counters.get("ordo_relay_events_total", Some("retried")),
        0,
        "a blameless failure counted an attempt"
    );
    assert_eq!(
        counters.get("ordo_relay_events_total", Some("delivered")),
        240
    );
    let status = relay.status();
    assert!(status.stalled.is_empty(), "{status:?}");
    relay.shutdown().await;
    let failing: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM ordo.subscription_progress WHERE subscription = 'to-rabbit' AND state <> 'done'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("progress rows");
    assert_eq!(failing, 0, "an event has attempts or is parked");

    // At least once in the queue; exactly once, in key order, after dedup by message_id.
    let deliveries = queue.drain().await;
    let mut seen = HashSet::new();
    let mut last_of_key: HashMap<String, u32> = HashMap::new();
    for delivery in &deliveries {
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .expect("a message_id")
            .to_string();
        if !seen.insert(id) {
            continue;
        }
        let parcel: Parcel = serde_json::from_slice(&delivery.data).expect("a parcel");
        let key = parcel.keys[0].clone();
        if let Some(before) = last_of_key.insert(key.clone(), parcel.id) {
            assert!(
                before < parcel.id,
                "key {key}: parcel {} after {before}",
                parcel.id
            );
        }
    }
    assert_eq!(seen.len(), 240, "every event, once after dedup");
    assert!(deliveries.len() >= 240);
    // The queue took publishes whose confirms were lost, and the relay sent them again.
    assert!(
        deliveries.len() > 240,
        "no redelivery reached the queue: the fault did not bite"
    );
}
