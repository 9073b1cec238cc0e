//! A relay to an HTTP endpoint (a server the test runs) that answers 500, 503 and 500 before it
//! answers 200: the failures are retried with backoff and counted, every event reaches the
//! endpoint with a 2xx exactly once, each key's events in order, every request signed.
#![cfg(all(feature = "nats", feature = "rabbitmq", feature = "http"))]

use crate::common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::http_responder::{Reply, Responder};
use common::keyed::{Parcel, publish};
use common::relays::{config, keys, parcels, relayed};
use common::subscribers::PATIENCE;
use common::{TestDb, eventually};
use ordo::relay::RelayConfig;
use ordo::relay::http::{WebhookSink, verify_signature};
use ordo::{Outbox, OutboxConfig};

const SECRET: &[u8] = b"a webhook secret";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_answering_500_then_200_gets_every_event_once_in_key_order() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Parcel>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let failures = [500, 503, 500];
    let responder = Responder::start(failures.iter().map(|s| Reply::status(*s)).collect()).await;
    let sink = WebhookSink::builder(responder.url("/events"), SECRET)
        .build()
        .expect("sink");
    let relay = outbox
        .relay(config("to-webhook").max_attempts(5), sink, keys)
        .await
        .expect("relay");
    publish(&outbox, parcels(0, 50)).await;
    relayed(&relay, &db.pool, 50).await;
    relay.shutdown().await;

    let requests = responder.requests();
    assert!(
        requests.len() >= 50 + failures.len(),
        "{} requests",
        requests.len()
    );
    let mut delivered = HashSet::new();
    let mut last_of_key: HashMap<String, u32> = HashMap::new();
    // The first requests were answered from the script; every later one with 200.
    for request in &requests[failures.len()..] {
        let timestamp = request.header("Ordo-Timestamp").expect("a timestamp");
        let signature = request.header("Ordo-Signature").expect("a signature");
        assert!(verify_signature(
            SECRET,
            timestamp,
            &request.body,
            signature
        ));
        let id = request
            .header("Ordo-Event-Id")
            .expect("an event id")
            .to_owned();
        assert!(delivered.insert(id), "an event answered 200 twice");
        let parcel: Parcel = serde_json::from_slice(&request.body).expect("a parcel");
        let key = parcel.keys[0].clone();
        if let Some(before) = last_of_key.insert(key.clone(), parcel.id) {
            assert!(
                before < parcel.id,
                "key {key}: parcel {} after {before}",
                parcel.id
            );
        }
    }
    assert_eq!(delivered.len(), 50);
}

/// One recipient's endpoint takes longer than the test's whole patience to answer. With two
/// sinks (two batches in flight), every other recipient's events arrive meanwhile: the slow one
/// holds only the batch it is in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_recipient_holds_one_batch_while_the_others_are_delivered() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Parcel>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let slow = Responder::start(vec![Reply::status(200).after(PATIENCE * 2)]).await;
    let fast = Responder::start(Vec::new()).await;
    let sink = || {
        let (slow, fast) = (slow.url("/slow"), fast.url("/fast"));
        WebhookSink::builder(fast.clone(), SECRET)
            .route(move |message| {
                if message.key.as_deref() == Some("slow") {
                    slow.clone()
                } else {
                    fast.clone()
                }
            })
            .timeout(PATIENCE * 3)
            .build()
            .expect("sink")
    };
    let config = RelayConfig::new("to-webhooks")
        .batch_size(10)
        .per_event_budget(PATIENCE / 3)
        .batch_deadline(PATIENCE * 4)
        .lease(PATIENCE * 10)
        .backoff(Duration::from_millis(5), Duration::from_millis(50));
    let relay = outbox
        .relay_with_sinks(config, vec![sink(), sink()], keys)
        .await
        .expect("relay");
    publish(&outbox, [Parcel::new(0, &["slow"])]).await;
    assert!(eventually(PATIENCE, || async { slow.requests().len() == 1 }).await);
    publish(
        &outbox,
        (1..=40).map(|id| Parcel::new(id, &[&format!("k{}", id % 5)])),
    )
    .await;
    let others = eventually(PATIENCE, || async { fast.requests().len() >= 40 }).await;
    assert!(
        others,
        "{} of 40 other events arrived while one recipient was slow",
        fast.requests().len()
    );
    assert_eq!(
        slow.requests().len(),
        1,
        "the slow recipient got its next event before answering"
    );
    // The slow request is still open: the test ends without waiting for it.
    relay.detach();
}
