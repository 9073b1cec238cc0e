//! A relay to an HTTP endpoint (a server the test runs) that answers 500, 503 and 500 before it
//! answers 200: the failures are retried with backoff and counted, every event reaches the
//! endpoint with a 2xx exactly once, each key's events in order, every request signed.
#![cfg(all(feature = "nats", feature = "rabbitmq", feature = "http"))]

mod common;

use std::collections::{HashMap, HashSet};

use common::TestDb;
use common::http_responder::{Reply, Responder};
use common::keyed::{Parcel, publish};
use common::relays::{config, keys, parcels, relayed};
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
