//! A relay to NATS JetStream over a slow link (a TCP proxy that holds every chunk, both ways):
//! the timeouts behave as `docs/relays.md` says.
//!
//! - A link slower than the **batch deadline** (the sink's ack timeout derived from it, half
//!   the deadline): no ack comes back, nothing is delivered and the sink's probe goes
//!   unanswered, so it is an **outage**: the events are released with no attempt counted (a relay allowed one attempt parks nothing);
//!   once the link is merely slow, everything arrives.
//! - A link slower than the sink's **ack timeout** (set shorter than the deadline): each ack
//!   times out on its own, well inside the deadline, but the sink's probe (its stream's
//!   information, asked over the same link within the ack timeout) does not answer either, so
//!   it is an outage too: released, no attempt counted (a sink that does not answer is down;
//!   a message is blamed when the sink answers); the stream's deduplication absorbs the
//!   copies whose acks came late.
//!
//! Either way every event is in the stream exactly once after deduplication, in key order.
//! Its own test binary: it reads the relay's counters through a process-wide metrics recorder.
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
use metrics_util::debugging::{DebuggingRecorder, Snapshotter};
use ordo::relay::nats::NatsSink;
use ordo::{Outbox, OutboxConfig};

const EVENTS: &str = "ordo_relay_events_total";

/// Waits until counter `result` passes `before`.
async fn counted_past(
    counters: &mut Counters,
    snapshotter: &Snapshotter,
    result: &str,
    before: u64,
) -> bool {
    eventually(PATIENCE, || {
        counters.add(snapshotter);
        let now = counters.get(EVENTS, Some(result));
        async move { now > before }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_link_meets_the_batch_deadline_and_the_ack_timeout_as_documented() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).expect("the only recorder of this binary");
    let mut counters = Counters::default();

    // A link slower than the batch deadline (600 ms); the ack timeout is derived (300 ms).
    {
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
        // One attempt only: a deadline that counted one would park the event.
        let relay = outbox
            .relay(config("past-the-deadline").max_attempts(1), sink, keys)
            .await
            .expect("relay");
        publish(&outbox, parcels(0, 40)).await;
        relayed(&relay, &db.pool, 40).await;

        proxy.set(Fault::Slow(Duration::from_secs(1)));
        publish(&outbox, parcels(40, 40)).await;
        assert!(
            counted_past(&mut counters, &snapshotter, "released", 0).await,
            "no batch deadline expired on a link slower than it"
        );
        // Slow, but within the deadline: the relay catches up.
        proxy.set(Fault::Slow(Duration::from_millis(5)));
        publish(&outbox, parcels(80, 40)).await;
        relayed(&relay, &db.pool, 120).await;
        counters.add(&snapshotter);
        assert_eq!(counters.get(EVENTS, Some("parked")), 0, "a deadline parked");
        assert_eq!(
            counters.get(EVENTS, Some("retried")),
            0,
            "an expired deadline counted an attempt"
        );
        assert!(relay.status().stalled.is_empty());
        relay.shutdown().await;
        assert_stream_holds_each_once_in_key_order(&stream, &db.pool).await;
        outbox.shutdown().await;
    }

    // A link slower than the ack timeout, which is shorter than the deadline.
    let db = TestDb::new().await;
    let outbox = Outbox::<Parcel>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let stream = TestStream::new().await;
    let proxy = TcpFault::start(addr(NATS_ADDR)).await;
    let sink = NatsSink::builder(nats_url(proxy.addr()))
        .subject_prefix(&stream.prefix)
        .ack_timeout(Duration::from_millis(100))
        .build()
        .expect("sink");
    // One event a batch: its ack times out (100 ms) far inside the batch deadline (2 s).
    // One attempt only: an outage that counted one would park the event.
    let relay = outbox
        .relay(
            config("past-the-ack-timeout")
                .batch_size(1)
                .batch_deadline(Duration::from_secs(2))
                .max_attempts(1),
            sink,
            keys,
        )
        .await
        .expect("relay");
    publish(&outbox, parcels(0, 20)).await;
    relayed(&relay, &db.pool, 20).await;

    counters.add(&snapshotter);
    let (retried, released) = (
        counters.get(EVENTS, Some("retried")),
        counters.get(EVENTS, Some("released")),
    );
    // A chunk takes 400 ms each way: no ack can come back within 100 ms.
    proxy.set(Fault::Slow(Duration::from_millis(400)));
    publish(&outbox, parcels(20, 20)).await;
    assert!(
        counted_past(&mut counters, &snapshotter, "released", released).await,
        "no ack timed out on a link slower than the ack timeout"
    );
    proxy.set(Fault::Pass);
    relayed(&relay, &db.pool, 40).await;
    counters.add(&snapshotter);
    assert_eq!(counters.get(EVENTS, Some("parked")), 0);
    assert_eq!(
        counters.get(EVENTS, Some("retried")),
        retried,
        "a link that delivered nothing was blamed on its events"
    );
    let status = relay.status();
    assert!(status.stalled.is_empty(), "{status:?}");
    relay.shutdown().await;
    assert_stream_holds_each_once_in_key_order(&stream, &db.pool).await;
}
