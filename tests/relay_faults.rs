//! A relay against a broker that stops answering (black-holed by a TCP proxy in the test), then
//! one whose connection is cut: the acks time out and the sink's probe goes unanswered, or the
//! batch fails as a whole, the sink's connection is rebuilt, the batch is released without an attempt counted against its
//! events, and once the broker answers again everything arrives,
//! exactly once after the stream's deduplication, in order per key. Its own test binary: it
//! reads the relay's counters through a process-wide metrics recorder.
#![cfg(all(feature = "nats", feature = "rabbitmq"))]

mod common;

use std::time::Duration;

use common::brokers::{NATS_ADDR, TestStream, addr, nats_url};
use common::counters::Counters;
use common::keyed::{Parcel, publish};
use common::relays::{assert_stream_holds_each_once_in_key_order, config, keys, parcels, relayed};
use common::subscribers::PATIENCE;
use common::tcp_fault::{Fault, TcpFault};
use common::{TestDb, eventually};
use metrics_util::debugging::DebuggingRecorder;
use ordo::relay::nats::NatsSink;
use ordo::{Outbox, OutboxConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_or_cut_broker_costs_no_attempt_and_loses_nothing() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).expect("the only recorder of this binary");
    let mut counters = Counters::default();

    let db = TestDb::new().await;
    let outbox = Outbox::<Parcel>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let stream = TestStream::new().await;
    let proxy = TcpFault::start(addr(NATS_ADDR)).await;
    let sink = NatsSink::builder(nats_url(proxy.addr()))
        .subject_prefix(&stream.prefix)
        .build()
        .expect("sink");
    // One attempt only: a deadline expiry that counted one would park the event for good.
    let relay = outbox
        .relay(config("to-nats").max_attempts(1), sink, keys)
        .await
        .expect("relay");
    publish(&outbox, parcels(0, 60)).await;
    relayed(&relay, &db.pool, 60).await;

    proxy.set(Fault::BlackHole);
    publish(&outbox, parcels(60, 60)).await;
    // Wait until a batch sent into the black hole has its verdict: released (or, were the
    // expiry blamed on its events, parked).
    let settled = |counters: &Counters| {
        counters.get("ordo_relay_events_total", Some("released"))
            + counters.get("ordo_relay_events_total", Some("parked"))
    };
    let expired = eventually(PATIENCE, || {
        counters.add(&snapshotter);
        let seen = settled(&counters) > 0;
        async move { seen }
    })
    .await;
    assert!(
        expired,
        "no batch deadline expired while the broker was black-holed"
    );
    assert_eq!(
        counters.get("ordo_relay_events_total", Some("parked")),
        0,
        "an expired deadline was blamed on its events"
    );
    // Another deadline or two, with the reset bounded too.
    tokio::time::sleep(Duration::from_millis(800)).await;
    proxy.set(Fault::Pass);
    relayed(&relay, &db.pool, 120).await;
    counters.add(&snapshotter);
    assert_eq!(counters.get("ordo_relay_events_total", Some("parked")), 0);
    let released = counters.get("ordo_relay_events_total", Some("released"));
    assert!(released > 0);

    // Then the connection is cut (and new ones refused) while events keep coming.
    proxy.set(Fault::Cut);
    publish(&outbox, parcels(120, 60)).await;
    let cut_seen = eventually(PATIENCE, || {
        counters.add(&snapshotter);
        let seen = settled(&counters) > released;
        async move { seen }
    })
    .await;
    assert!(cut_seen, "no batch failed while the connection was cut");
    proxy.set(Fault::Pass);
    relayed(&relay, &db.pool, 180).await;
    counters.add(&snapshotter);
    assert_eq!(
        counters.get("ordo_relay_events_total", Some("parked")),
        0,
        "a cut connection was blamed on its events"
    );
    assert_eq!(
        counters.get("ordo_relay_events_total", Some("delivered")),
        180
    );
    assert!(relay.status().stalled.is_empty(), "{:?}", relay.status());
    relay.shutdown().await;
    assert_stream_holds_each_once_in_key_order(&stream, &db.pool).await;
}
