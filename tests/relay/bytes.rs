//! Relays forward bytes : a relay of a typed outbox sends each
//! payload's stored text unchanged and never parks a row for not decoding, passes over rows of
//! types its payload type does not have, and holds a window bounded by bytes behind a parked
//! event. Against an HTTP server the test runs, which records every request.
#![cfg(feature = "http")]

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::http_responder::{Reply, Request, Responder};
use common::relays::{config, head};
use common::subscribers::PATIENCE;
use common::{TestDb, eventually};
use ordo::relay::RelayConfig;
use ordo::relay::http::WebhookSink;
use ordo::{Envelope, Keys, Outbox, OutboxConfig, SubscriptionHandle};
use sqlx::PgPool;

const SECRET: &[u8] = b"a webhook secret";

/// An orders service's one event enum: its only type is `Placed`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
enum Orders {
    Placed {
        id: u32,
        customer: String,
        total: f64,
    },
}

fn by_customer(event: &Envelope<Orders>) -> Keys {
    let Orders::Placed { customer, .. } = &event.payload;
    Keys::one(customer.clone())
}

fn placed(id: u32, customer: &str) -> Orders {
    Orders::Placed {
        id,
        customer: customer.to_owned(),
        total: 10.0,
    }
}

/// Publishes `payload` in a transaction of its own.
async fn publish_one<P>(outbox: &Outbox<P>, payload: P)
where
    P: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(payload).expect("publish");
    tx.commit().await.expect("commit");
}

async fn insert(pool: &PgPool, payload: &str, event_type: Option<&str>) {
    sqlx::query("INSERT INTO ordo.events (payload, event_type) VALUES ($1::jsonb, $2)")
        .bind(payload)
        .bind(event_type)
        .execute(pool)
        .await
        .expect("plain-SQL row");
}

/// Each stored event's payload text, by event id.
async fn stored_texts(pool: &PgPool) -> HashMap<String, String> {
    let rows: Vec<(uuid::Uuid, String)> =
        sqlx::query_as("SELECT id, payload::text FROM ordo.events WHERE payload IS NOT NULL")
            .fetch_all(pool)
            .await
            .expect("stored payloads");
    rows.into_iter()
        .map(|(id, text)| (id.to_string(), text))
        .collect()
}

/// Waits until the commit lane holds `events` and the relay has delivered them all.
async fn delivered(relay: &SubscriptionHandle, pool: &PgPool, events: u64) {
    assert!(eventually(PATIENCE, || async { head(pool).await >= events }).await);
    let (status, done) = relay
        .wait_for(PATIENCE, |status| status.position.get() >= events)
        .await;
    assert!(
        done,
        "the relay did not reach the head ({events}): {status:?}"
    ); // A stuck key's events wait in its backlog, behind the watermark: delivered means that is
    // empty too.
    let drained = eventually(PATIENCE, || async {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM ordo.key_backlogs")
            .fetch_one(pool)
            .await
            .expect("backlog");
        left == 0
    })
    .await;
    assert!(drained, "a stuck key's backlog was not delivered");
}

fn event_id(request: &Request) -> String {
    request
        .header("Ordo-Event-Id")
        .expect("an event id")
        .to_owned()
}

/// A typed library relay: fields `Orders` does not know, and `1.10` as written,
/// reach the receiver exactly as stored; the relay never re-encodes through `Orders`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_relay_sends_each_payload_as_stored() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Orders>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    insert(
        &db.pool,
        r#"{"Placed": {"id": 1, "customer": "c1", "total": 1.10, "coupon": "SPRING"}}"#,
        Some("Placed"),
    )
    .await;
    publish_one(&outbox, placed(2, "c2")).await;
    let endpoint = Responder::start(Vec::new()).await;
    let sink = WebhookSink::builder(endpoint.url("/orders"), SECRET)
        .build()
        .expect("sink");
    let relay = outbox
        .relay(config("as-stored"), sink, by_customer)
        .await
        .expect("relay");
    delivered(&relay, &db.pool, 2).await;

    let stored = stored_texts(&db.pool).await;
    let requests = endpoint.requests();
    assert_eq!(requests.len(), 2, "one POST per event");
    for request in &requests {
        let body = std::str::from_utf8(&request.body).expect("UTF-8 body");
        assert_eq!(
            Some(body),
            stored.get(&event_id(request)).map(String::as_str),
            "the body is the stored text"
        );
    }
    let first = requests
        .iter()
        .map(|request| String::from_utf8_lossy(&request.body).into_owned())
        .find(|body| body.contains("\"id\": 1"))
        .expect("the plain-SQL row was sent");
    assert!(
        first.contains("1.10") && first.contains("\"coupon\": \"SPRING\""),
        "{first}"
    );
    relay.shutdown().await;
    outbox.shutdown().await;
}

/// A typed library relay and a foreign row: a row of another service's type
/// is passed over by default (never sent, never parked), and a row of `Orders`' own type whose
/// payload does not decode as `Orders` is sent as stored (its key cannot be known, so it is
/// ordered with every event) instead of parking and holding every key behind it. With
/// `all_types()` the foreign row is sent too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_row_is_passed_over_and_a_row_that_does_not_decode_is_sent() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Orders>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    for id in 1..=10 {
        publish_one(&outbox, placed(id, &format!("c{id}"))).await;
    }
    insert(&db.pool, r#"{"invoice": 7}"#, Some("billing.Invoiced")).await;
    insert(&db.pool, r#"{"Placed": {"id": 11}}"#, Some("Placed")).await;
    for id in 12..=21 {
        publish_one(&outbox, placed(id, &format!("c{}", id - 11))).await;
    }
    let endpoint = Responder::start(Vec::new()).await;
    let sink = |path: &str| {
        WebhookSink::builder(endpoint.url(path), SECRET)
            .build()
            .expect("sink")
    };
    let relay = outbox
        .relay(
            config("own-types").max_attempts(1),
            sink("/own"),
            by_customer,
        )
        .await
        .expect("relay");
    delivered(&relay, &db.pool, 22).await;
    assert!(relay.status().stalled.is_empty(), "{:?}", relay.status());
    let charged: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM ordo.subscription_progress WHERE subscription = 'own-types' AND attempts > 0",
    )
    .fetch_one(&db.pool)
    .await
    .expect("progress");
    assert_eq!(charged, 0, "no event was charged an attempt");
    let own: Vec<Request> = endpoint
        .requests()
        .into_iter()
        .filter(|request| request.path == "/own")
        .collect();
    let bodies: Vec<String> = own
        .iter()
        .map(|request| String::from_utf8_lossy(&request.body).into_owned())
        .collect();
    assert_eq!(
        own.len(),
        21,
        "every Orders row once, the foreign one never: {bodies:?}"
    );
    assert!(!bodies.iter().any(|body| body.contains("invoice")));
    assert!(
        bodies
            .iter()
            .any(|body| body == r#"{"Placed": {"id": 11}}"#)
    );
    // Per customer, in order: the undecodable row waited for every event before it, and
    // every event after it waited for it.
    let position_of = |needle: &str| {
        bodies
            .iter()
            .position(|body| body.contains(needle))
            .expect("sent")
    };
    let barrier = position_of("\"id\": 11}");
    assert!((1..=10).all(|id| position_of(&format!("\"id\": {id},")) < barrier));
    assert!((12..=21).all(|id| position_of(&format!("\"id\": {id},")) > barrier));
    relay.shutdown().await;

    let every = outbox
        .relay(
            config("every-type").all_types().max_attempts(1),
            sink("/every"),
            by_customer,
        )
        .await
        .expect("relay of every type");
    delivered(&every, &db.pool, 22).await;
    let every_bodies: Vec<String> = endpoint
        .requests()
        .into_iter()
        .filter(|request| request.path == "/every")
        .map(|request| String::from_utf8_lossy(&request.body).into_owned())
        .collect();
    assert_eq!(every_bodies.len(), 22);
    assert!(every_bodies.iter().any(|body| body == r#"{"invoice": 7}"#));
    every.shutdown().await;
    outbox.shutdown().await;
}

/// A document large enough that a few fill a small window.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Document {
    key: String,
    id: u32,
    body: String,
}

fn by_key(event: &Envelope<Document>) -> Keys {
    Keys::one(event.payload.key.clone())
}

/// Behind a parked event of key `a`, 40 documents of 64 KB of the same key would fill a
/// 256 KiB window, and once did: an event of key `b` written after them was not even read
/// while the parked one held them. Now they wait in key `a`'s backlog, out of the window, and
/// `b` is delivered at once. Once the parked event is requeued and delivered, everything is,
/// each once, in key order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_behind_a_parked_one_wait_in_its_keys_backlog_not_in_the_window() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Document>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let refuse_first = Arc::new(AtomicBool::new(true));
    let refusing = Arc::clone(&refuse_first);
    let endpoint = Responder::with_rule(move |request| {
        let first = String::from_utf8_lossy(&request.body).contains("\"id\": 0,");
        (first && refusing.load(Ordering::SeqCst)).then(|| Reply::status(422))
    })
    .await;
    let sink = WebhookSink::builder(endpoint.url("/documents"), SECRET)
        .build()
        .expect("sink");
    let window = 256 * 1024;
    let relay = outbox
        .relay(
            config("bounded-window").window(10_000, window),
            sink,
            by_key,
        )
        .await
        .expect("relay");
    let document = |key: &str, id: u32, size: usize| Document {
        key: key.to_owned(),
        id,
        body: "x".repeat(size),
    };
    publish_one(&outbox, document("a", 0, 10)).await;
    let (status, parked) = relay
        .wait_for(PATIENCE, |status| !status.stalled.is_empty())
        .await;
    assert!(parked, "the first event was not parked: {status:?}");
    for id in 1..=40 {
        publish_one(&outbox, document("a", id, 64 * 1024)).await;
    }
    publish_one(&outbox, document("b", 41, 10)).await;
    let b_sent = || {
        endpoint
            .requests()
            .iter()
            .any(|request| String::from_utf8_lossy(&request.body).contains("\"id\": 41,"))
    };
    assert!(
        eventually(PATIENCE, || async { b_sent() }).await,
        "an event of another key waited behind the parked key's events"
    );
    let backlog: i64 = sqlx::query_scalar("SELECT count(*) FROM ordo.key_backlogs")
        .fetch_one(&db.pool)
        .await
        .expect("backlog");
    assert_eq!(
        backlog, 41,
        "the parked event and its key's 40 later events wait aside"
    );

    refuse_first.store(false, Ordering::SeqCst);
    let requeued = ordo::admin::retry_stalled_keys(&db.pool, "bounded-window", None)
        .await
        .expect("requeue");
    assert_eq!(requeued, 1);
    delivered(&relay, &db.pool, 42).await;
    let sends = endpoint.sends_per_event();
    assert_eq!(sends.len(), 42, "every event was sent");
    let ids: Vec<u32> = endpoint
        .requests()
        .iter()
        .filter_map(|request| serde_json::from_slice::<Document>(&request.body).ok())
        .filter(|document| document.key == "a")
        .map(|document| document.id)
        .collect();
    let delivered_a: Vec<u32> = ids.iter().copied().skip_while(|id| *id == 0).collect();
    assert_eq!(
        delivered_a,
        (1..=40).collect::<Vec<_>>(),
        "key a's events after its first, once each, in order"
    );
    assert!(sends.values().all(|&count| count <= 2), "{sends:?}");
    relay.shutdown().await;
    outbox.shutdown().await;
}

/// The settings that bound a window are checked.
#[tokio::test]
async fn a_window_that_cannot_hold_is_refused_naming_it() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Document>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let endpoint = Responder::start(Vec::new()).await;
    for bad in [
        RelayConfig::new("tiny").window(10, 100),
        RelayConfig::new("empty").window(0, 1 << 20),
    ] {
        let sink = WebhookSink::builder(endpoint.url("/x"), SECRET)
            .build()
            .expect("sink");
        let refused = outbox.relay(bad, sink, by_key).await;
        let error = refused
            .err()
            .map(|error| error.to_string())
            .unwrap_or_default();
        assert!(error.contains("window"), "{error}");
    }
    outbox.shutdown().await;
}
