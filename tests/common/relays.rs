//! The relay tests' shared parts: parcels keyed over seven keys, a relay configuration whose
//! timing holds with short deadlines, and the check of what reached the JetStream stream.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use ordo::relay::RelayConfig;
use ordo::{Envelope, Keys, SubscriptionHandle};
use sqlx::PgPool;

use super::brokers::TestStream;
use super::eventually;
use super::keyed::Parcel;
use super::subscribers::PATIENCE;

pub fn keys(event: &Envelope<Parcel>) -> Keys {
    event.payload.keys.iter().cloned().collect()
}

pub fn parcels(from: u32, count: u32) -> impl Iterator<Item = Parcel> {
    (from..from + count).map(|id| {
        let key = format!("k{}", id % 7);
        Parcel::new(id, &[key.as_str()])
    })
}

pub fn config(name: &str) -> RelayConfig {
    RelayConfig::new(name)
        .batch_size(20)
        .per_event_budget(Duration::from_millis(25))
        .batch_deadline(Duration::from_millis(600))
        .lease(Duration::from_secs(3))
        .backoff(Duration::from_millis(5), Duration::from_millis(50))
}

pub async fn head(pool: &PgPool) -> u64 {
    let head: i64 = sqlx::query_scalar("SELECT last_commit_seq FROM ordo.sequencer_state")
        .fetch_one(pool)
        .await
        .expect("head");
    head as u64
}

pub async fn relayed(relay: &SubscriptionHandle, pool: &PgPool, events: u64) {
    assert!(eventually(PATIENCE, || async { head(pool).await >= events }).await);
    let (status, done) = relay
        .wait_for(PATIENCE, |s| s.position.get() >= events)
        .await;
    assert!(done, "the relay did not deliver everything: {status:?}");
    // The watermark passes a stuck key's events (they wait in its backlog): delivered means
    // the backlog is empty too.
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

/// Every published event is in the stream exactly once, and each key's events are in the
/// stream in publishing order.
pub async fn assert_stream_holds_each_once_in_key_order(stream: &TestStream, pool: &PgPool) {
    let messages = stream.messages().await;
    let mut seen = HashSet::new();
    let mut last_of_key: HashMap<String, u32> = HashMap::new();
    for message in &messages {
        let parcel: Parcel = serde_json::from_slice(&message.payload).expect("a parcel");
        let id = message
            .headers
            .get("Nats-Msg-Id")
            .expect("a message id")
            .to_string();
        assert!(
            seen.insert(id),
            "event delivered twice into the stream: {parcel:?}"
        );
        let key = parcel.keys[0].clone();
        if let Some(before) = last_of_key.insert(key.clone(), parcel.id) {
            assert!(
                before < parcel.id,
                "key {key}: parcel {} after {before}",
                parcel.id
            );
        }
    }
    let events: i64 =
        sqlx::query_scalar("SELECT count(*) FROM ordo.events WHERE payload IS NOT NULL")
            .fetch_one(pool)
            .await
            .expect("events");
    assert_eq!(messages.len() as i64, events);
}
