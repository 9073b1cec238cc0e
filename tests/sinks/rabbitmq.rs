//! RabbitMQ: a real exchange and queue per test; faults through the TCP proxy.

use ordo::relay::rabbitmq::RabbitSink;
use ordo::relay::{Message, Outcomes, Sink};

use super::common::brokers::{RABBIT_ADDR, TestQueue, addr, amqp_uri};
use super::common::tcp_fault::{Fault, TcpFault};
use super::{LIMIT, STALL, all_transient, batch, delivered, send};

#[tokio::test]
async fn rabbit_queue_gets_persistent_confirmed_messages_with_the_event_id() {
    let queue = TestQueue::new().await;
    let mut sink = RabbitSink::builder(amqp_uri(addr(RABBIT_ADDR)))
        .exchange(queue.exchange.as_str())
        .pipeline_depth(3)
        .build()
        .expect("valid settings");
    let batch = batch(10);
    let result = send(&mut sink, &batch).await;
    assert!(delivered(&result, 10), "{result:?}");

    let deliveries = queue.drain().await;
    assert_eq!(deliveries.len(), 10);
    for (message, delivery) in batch.iter().zip(&deliveries) {
        let properties = &delivery.properties;
        let id = properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str().to_owned());
        assert_eq!(id, Some(message.id.to_string()));
        assert_eq!(*properties.delivery_mode(), Some(2), "persistent");
        let content_type = properties.content_type().as_ref().map(|t| t.as_str());
        assert_eq!(content_type, Some("application/json"));
        assert_eq!(delivery.routing_key.as_str(), message.type_or_untyped());
        assert_eq!(delivery.data, message.payload.to_vec());
    }
}

#[tokio::test]
async fn rabbit_unroutable_message_is_confirmed_because_mandatory_is_not_set() {
    // The default exchange routes by queue name; no queue has this one.
    let nowhere = format!("ordo_no_queue_{}", uuid::Uuid::new_v4().simple());
    let mut sink = RabbitSink::builder(amqp_uri(addr(RABBIT_ADDR)))
        .route(move |_| (String::new(), nowhere.clone()))
        .build()
        .expect("valid settings");
    assert!(delivered(&send(&mut sink, &batch(2)).await, 2));
}

#[tokio::test]
async fn rabbit_missing_exchange_is_transient_and_the_channel_is_reopened() {
    let queue = TestQueue::new().await;
    let missing = format!("ordo_missing_{}", uuid::Uuid::new_v4().simple());
    let exchange = queue.exchange.clone();
    let mut sink = RabbitSink::builder(amqp_uri(addr(RABBIT_ADDR)))
        .route(move |message: &Message| {
            let to = if message.key.as_deref() == Some("lost") {
                &missing
            } else {
                &exchange
            };
            (to.clone(), "placed".to_owned())
        })
        .build()
        .expect("valid settings");
    let lost = [Message::new(&b"{}"[..]).with_key(Some("lost"))];
    let result = send(&mut sink, &lost).await;
    let results = result.expect("a channel error blames messages, not the connection");
    assert!(
        matches!(&results[0], Err(error) if !error.is_permanent()),
        "{results:?}"
    );

    assert!(delivered(&send(&mut sink, &batch(2)).await, 2));
    assert_eq!(queue.drain().await.len(), 2);
}

#[tokio::test]
async fn rabbit_black_hole_stalls_send_until_reset_builds_a_new_connection() {
    let queue = TestQueue::new().await;
    let proxy = TcpFault::start(addr(RABBIT_ADDR)).await;
    let mut sink = RabbitSink::builder(amqp_uri(proxy.addr()))
        .exchange(queue.exchange.as_str())
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
        "send finished while confirms were black-holed: {outcome:?}"
    );

    proxy.set(Fault::Pass);
    tokio::time::timeout(LIMIT, sink.reset())
        .await
        .expect("reset within the limit")
        .expect("reset connects");
    assert!(delivered(&send(&mut sink, &stalled).await, 3));

    // At least once: the first batch, and the stalled one once or twice.
    let mut ids: Vec<String> = queue.drain_ids().await;
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 5);
}

#[tokio::test]
async fn rabbit_cut_connection_fails_send_transiently_and_the_sink_recovers() {
    let queue = TestQueue::new().await;
    let proxy = TcpFault::start(addr(RABBIT_ADDR)).await;
    let mut sink = RabbitSink::builder(amqp_uri(proxy.addr()))
        .exchange(queue.exchange.as_str())
        .build()
        .expect("valid settings");
    assert!(delivered(&send(&mut sink, &batch(1)).await, 1));

    proxy.set(Fault::Cut);
    let result = send(&mut sink, &batch(2)).await;
    assert!(all_transient(&result), "{result:?}");
    // Refused while cut: a transient batch error, not a hang.
    let refused = send(&mut sink, &batch(1)).await;
    assert!(
        matches!(&refused, Err(error) if !error.is_permanent()),
        "{refused:?}"
    );

    proxy.set(Fault::Pass);
    assert!(delivered(&send(&mut sink, &batch(1)).await, 1));
}

#[tokio::test]
async fn rabbit_wedged_connection_is_replaced_by_reset() {
    let queue = TestQueue::new().await;
    let proxy = TcpFault::start(addr(RABBIT_ADDR)).await;
    let mut sink = RabbitSink::builder(amqp_uri(proxy.addr()))
        .exchange(queue.exchange.as_str())
        .build()
        .expect("valid settings");
    assert!(delivered(&send(&mut sink, &batch(1)).await, 1));

    // The broker is fine; this one connection stopped confirming, for good.
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
}

#[tokio::test]
async fn rabbit_send_after_a_cancelled_send_rebuilds_the_connection_itself() {
    let queue = TestQueue::new().await;
    let proxy = TcpFault::start(addr(RABBIT_ADDR)).await;
    let mut sink = RabbitSink::builder(amqp_uri(proxy.addr()))
        .exchange(queue.exchange.as_str())
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
}

#[tokio::test]
async fn rabbit_slow_link_delays_delivery_without_failing_it() {
    let queue = TestQueue::new().await;
    let proxy = TcpFault::start(addr(RABBIT_ADDR)).await;
    proxy.set(Fault::Slow(std::time::Duration::from_millis(50)));
    let mut sink = RabbitSink::builder(amqp_uri(proxy.addr()))
        .exchange(queue.exchange.as_str())
        .pipeline_depth(2)
        .build()
        .expect("valid settings");
    let batch = batch(6);
    let result = send(&mut sink, &batch).await;
    assert!(delivered(&result, 6), "{result:?}");
    let ids: Vec<String> = queue
        .drain()
        .await
        .iter()
        .filter_map(|delivery| {
            delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.to_string())
        })
        .collect();
    let sent: Vec<String> = batch.iter().map(|message| message.id.to_string()).collect();
    assert_eq!(ids, sent, "in batch order");
}
