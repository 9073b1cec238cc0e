//! NATS JetStream: a real stream per test; faults through the TCP proxy.

use std::time::Duration;

use ordo::relay::nats::NatsSink;
use ordo::relay::{Outcomes, Sink};

use super::common::brokers::{NATS_ADDR, TestStream, addr, nats_url};
use super::common::tcp_fault::{Fault, TcpFault};
use super::{LIMIT, STALL, all_transient, batch, delivered, send};

#[tokio::test]
async fn nats_stream_acknowledges_a_batch_with_event_ids_as_message_ids() {
    let stream = TestStream::new().await;
    let mut sink = NatsSink::builder(nats_url(addr(NATS_ADDR)))
        .subject_prefix(stream.prefix.as_str())
        .build()
        .expect("valid settings");
    let batch = batch(6);
    let result = send(&mut sink, &batch).await;
    assert!(delivered(&result, 6), "{result:?}");

    let stored = stream.messages().await;
    assert_eq!(stored.len(), 6);
    for (message, stored) in batch.iter().zip(&stored) {
        let id = stored
            .headers
            .get("Nats-Msg-Id")
            .map(|value| value.as_str().to_owned());
        assert_eq!(id, Some(message.id.to_string()));
        let subject = format!("{}.{}", stream.prefix, message.type_or_untyped());
        assert_eq!(stored.subject.as_str(), subject);
        assert_eq!(stored.payload, message.payload);
    }
}

#[tokio::test]
async fn nats_headers_are_the_lean_set_unless_detail_headers_is_on() {
    let stream = TestStream::new().await;
    let message = ordo::relay::Message::new(br#"{"order_id":1}"#.as_slice())
        .with_event_type(Some("placed"))
        .with_key(Some("customer-7"))
        .with_origin(Some("shop"), ordo::Ordering::Commit, 41)
        .with_sequence(ordo::EventSequence::new(97));
    let mut lean = NatsSink::builder(nats_url(addr(NATS_ADDR)))
        .subject_prefix(stream.prefix.as_str())
        .build()
        .expect("valid settings");
    assert!(delivered(
        &send(&mut lean, std::slice::from_ref(&message)).await,
        1
    ));
    let mut detailed = NatsSink::builder(nats_url(addr(NATS_ADDR)))
        .subject_prefix(stream.prefix.as_str())
        .detail_headers(true)
        .build()
        .expect("valid settings");
    let again = message.clone().with_id(uuid::Uuid::now_v7());
    assert!(delivered(
        &send(&mut detailed, std::slice::from_ref(&again)).await,
        1
    ));

    let stored = stream.messages().await;
    assert_eq!(stored.len(), 2);
    let header = |at: usize, name: &str| {
        stored[at]
            .headers
            .get(name)
            .map(|value| value.as_str().to_owned())
    };
    for at in [0, 1] {
        assert_eq!(header(at, "Ordo-Position").as_deref(), Some("41"));
        assert_eq!(header(at, "Ordo-Lane").as_deref(), Some("commit"));
        assert_eq!(header(at, "Ordo-Source").as_deref(), Some("shop"));
        assert_eq!(header(at, "Ordo-Event-Type").as_deref(), Some("placed"));
        assert_eq!(header(at, "Ordo-Key").as_deref(), Some("customer-7"));
    }
    assert_eq!(header(0, "Nats-Msg-Id"), Some(message.id.to_string()));
    for name in ["Ordo-Sequence", "Ordo-Recorded-At", "Content-Type"] {
        assert_eq!(header(0, name), None, "{name} is a detail header");
    }
    assert_eq!(header(1, "Ordo-Sequence").as_deref(), Some("97"));
    assert_eq!(
        header(1, "Ordo-Recorded-At"),
        Some(again.recorded_at.to_rfc3339())
    );
    assert_eq!(
        header(1, "Content-Type").as_deref(),
        Some("application/json")
    );
}

#[tokio::test]
async fn nats_stream_deduplicates_a_resent_batch_by_message_id() {
    let stream = TestStream::new().await;
    let mut sink = NatsSink::builder(nats_url(addr(NATS_ADDR)))
        .subject_prefix(stream.prefix.as_str())
        // Fewer than the batch: publishing waits for earlier acks instead of deadlocking.
        .max_in_flight(2)
        .build()
        .expect("valid settings");
    let batch = batch(5);
    assert!(delivered(&send(&mut sink, &batch).await, 5));
    // A redelivery (a lost mark, an expired deadline): the stream acks it as a duplicate,
    // which the sink counts as delivered, and stores nothing new.
    assert!(delivered(&send(&mut sink, &batch).await, 5));
    assert_eq!(stream.len().await, 5);
}

#[tokio::test]
async fn nats_subject_without_a_stream_is_unavailable_and_a_bad_subject_permanent() {
    let mut unbound = NatsSink::builder(nats_url(addr(NATS_ADDR)))
        .subject_prefix(format!("ordo_unbound_{}", uuid::Uuid::new_v4().simple()))
        .build()
        .expect("valid settings");
    let result = send(&mut unbound, &batch(2)).await;
    let results = result.expect("the connection is fine");
    for result in results {
        let error = result.expect_err("no stream acknowledges");
        assert!(error.is_unavailable(), "an outage of the subject: {error}");
        assert!(error.message().contains("no responders"), "{error}");
    }

    let mut bad = NatsSink::builder(nats_url(addr(NATS_ADDR)))
        .subject(|_| "has a space".to_owned())
        .build()
        .expect("valid settings");
    let results = send(&mut bad, &batch(1))
        .await
        .expect("per-message results");
    assert!(
        matches!(&results[0], Err(error) if error.is_permanent()),
        "{results:?}"
    );
}

#[tokio::test]
async fn nats_black_hole_stalls_send_until_reset_builds_a_new_connection() {
    let stream = TestStream::new().await;
    let proxy = TcpFault::start(addr(NATS_ADDR)).await;
    let mut sink = NatsSink::builder(nats_url(proxy.addr()))
        .subject_prefix(stream.prefix.as_str())
        // Far beyond STALL: only the test's deadline can end the stalled send.
        .ack_timeout(Duration::from_secs(120))
        .build()
        .expect("valid settings");
    assert!(delivered(&send(&mut sink, &batch(2)).await, 2));

    proxy.set(Fault::BlackHole);
    let stalled = batch(3);
    let outcome = tokio::time::timeout(
        STALL,
        sink.send(&stalled, &mut Outcomes::new(stalled.len())),
    )
    .await;
    assert!(
        outcome.is_err(),
        "send finished while acks were black-holed: {outcome:?}"
    );

    proxy.set(Fault::Pass);
    tokio::time::timeout(LIMIT, sink.reset())
        .await
        .expect("reset within the limit")
        .expect("reset connects");
    assert!(delivered(&send(&mut sink, &stalled).await, 3));
    // The stalled publishes may have reached the stream too; the ids dedup them.
    assert_eq!(stream.len().await, 5);
}

#[tokio::test]
async fn nats_cut_connection_fails_send_transiently_and_the_sink_recovers() {
    let stream = TestStream::new().await;
    let proxy = TcpFault::start(addr(NATS_ADDR)).await;
    let mut sink = NatsSink::builder(nats_url(proxy.addr()))
        .subject_prefix(stream.prefix.as_str())
        .ack_timeout(Duration::from_secs(2))
        .build()
        .expect("valid settings");
    assert!(delivered(&send(&mut sink, &batch(1)).await, 1));

    proxy.set(Fault::Cut);
    let result = send(&mut sink, &batch(2)).await;
    assert!(all_transient(&result), "{result:?}");

    proxy.set(Fault::Pass);
    // The client may still be between reconnect attempts: wait for a delivery, with a limit.
    let deadline = tokio::time::Instant::now() + LIMIT;
    let mut recovered = false;
    while !recovered && tokio::time::Instant::now() < deadline {
        recovered = delivered(&send(&mut sink, &batch(1)).await, 1);
        if !recovered {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(
        recovered,
        "the sink did not deliver again after the cut ended"
    );
}

#[tokio::test]
async fn nats_wedged_connection_is_replaced_by_reset() {
    let stream = TestStream::new().await;
    let proxy = TcpFault::start(addr(NATS_ADDR)).await;
    let mut sink = NatsSink::builder(nats_url(proxy.addr()))
        .subject_prefix(stream.prefix.as_str())
        .ack_timeout(Duration::from_secs(120))
        .build()
        .expect("valid settings");
    assert!(delivered(&send(&mut sink, &batch(1)).await, 1));

    // The server is fine; this one connection stopped acknowledging, for good.
    proxy.wedge();
    let stalled = batch(2);
    let outcome = tokio::time::timeout(
        STALL,
        sink.send(&stalled, &mut Outcomes::new(stalled.len())),
    )
    .await;
    assert!(
        outcome.is_err(),
        "send finished on a wedged connection: {outcome:?}"
    );

    tokio::time::timeout(LIMIT, sink.reset())
        .await
        .expect("reset does not wait on the wedged connection")
        .expect("reset connects");
    assert!(delivered(&send(&mut sink, &stalled).await, 2));
    assert_eq!(stream.len().await, 3);
}

#[tokio::test]
async fn nats_send_after_a_cancelled_send_rebuilds_the_connection_itself() {
    let stream = TestStream::new().await;
    let proxy = TcpFault::start(addr(NATS_ADDR)).await;
    let mut sink = NatsSink::builder(nats_url(proxy.addr()))
        .subject_prefix(stream.prefix.as_str())
        .ack_timeout(Duration::from_secs(120))
        .build()
        .expect("valid settings");
    assert!(delivered(&send(&mut sink, &batch(1)).await, 1));

    proxy.wedge();
    let stalled = batch(2);
    let outcome = tokio::time::timeout(
        STALL,
        sink.send(&stalled, &mut Outcomes::new(stalled.len())),
    )
    .await;
    assert!(
        outcome.is_err(),
        "send finished on a wedged connection: {outcome:?}"
    );
    // No reset: the sink knows its last send was dropped midway.
    assert!(delivered(&send(&mut sink, &stalled).await, 2));
    assert_eq!(stream.len().await, 3);
}
