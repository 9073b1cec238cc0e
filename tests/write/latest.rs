//! Latest values: one row per event type, newest wins, delivered to every process's streams,
//! a late stream gets the current value first, nothing enters the lanes' history. The LISTEN
//! connection's lifecycle and loss: `tests/write/latest_listen.rs`; privileges:
//! `tests/write/latest_roles.rs`.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::TestDb;
use futures::StreamExt;
use ordo::{Error, Latest, LatestStream, Outbox, OutboxConfig};
use sqlx::PgPool;
use tokio::time::timeout;

const PATIENCE: Duration = Duration::from_secs(30);

/// A latest value as the tests publish it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Rate {
    writer: u32,
    n: u32,
}

async fn outbox(pool: &PgPool) -> Outbox<serde_json::Value> {
    Outbox::new(pool.clone(), OutboxConfig::default())
        .await
        .expect("start the outbox")
}

/// The next item of `stream`, which must be a value.
async fn next<T>(stream: &mut LatestStream<T>) -> Latest<T> {
    timeout(PATIENCE, stream.next())
        .await
        .expect("a latest value in time")
        .expect("the stream ended early")
        .expect("a value, not an error")
}

/// Items until one of `event_type` at `version` (every item must be a value).
async fn until<T>(stream: &mut LatestStream<T>, event_type: &str, version: u64) -> Vec<Latest<T>> {
    let mut items = Vec::new();
    loop {
        let item = next(stream).await;
        let done = item.event_type == event_type && item.version >= version;
        items.push(item);
        if done {
            return items;
        }
    }
}

/// Publishes `Rate { writer, n }` as `event_type` through `outbox`; returns the version.
async fn put(outbox: &Outbox<serde_json::Value>, event_type: &str, writer: u32, n: u32) -> u64 {
    outbox
        .publish_latest(event_type, &Rate { writer, n })
        .await
        .expect("publish")
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(pool)
        .await
        .expect("count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_outboxes_on_different_pools_see_each_others_values() {
    let db = TestDb::new().await;
    let a = outbox(&db.pool).await;
    let b = outbox(&db.another_pool(4).await).await;
    let mut at_a = a.latest::<Rate>(["fx.rate"]).expect("stream");
    let mut at_b = b.latest::<Rate>(["fx.rate"]).expect("stream");

    let v1 = put(&a, "fx.rate", 1, 1).await;
    assert_eq!(v1, 1);
    for stream in [&mut at_a, &mut at_b] {
        let got = next(stream).await;
        assert_eq!((got.version, &*got.payload), (1, &Rate { writer: 1, n: 1 }));
        assert_eq!(got.event_type, "fx.rate");
    }

    let v2 = put(&b, "fx.rate", 2, 1).await;
    assert_eq!(v2, 2);
    for stream in [&mut at_a, &mut at_b] {
        let got = next(stream).await;
        assert_eq!((got.version, &*got.payload), (2, &Rate { writer: 2, n: 1 }));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_listener_gets_the_current_value_first_then_newer_ones() {
    let db = TestDb::new().await;
    let writer = outbox(&db.pool).await;
    for n in 1..=3 {
        put(&writer, "fx.rate", 0, n).await;
    }
    let reader = outbox(&db.another_pool(4).await).await;
    let mut rates = reader.latest::<Rate>(["fx.rate"]).expect("stream");
    let first = next(&mut rates).await;
    assert_eq!((first.version, first.payload.n), (3, 3));

    let mut headers = ordo::Headers::new();
    headers.insert("source".to_owned(), "ecb".into());
    writer
        .publish_latest_with_headers("fx.rate", &Rate { writer: 0, n: 4 }, &headers)
        .await
        .expect("publish");
    let second = next(&mut rates).await;
    assert_eq!((second.version, second.payload.n), (4, 4));
    assert_eq!(second.headers, headers);
    let stored = reader
        .latest_value::<Rate>("fx.rate")
        .await
        .expect("read")
        .expect("a value");
    assert_eq!((stored.version, stored.payload.n), (4, 4));
    let never = reader.latest_value::<Rate>("never").await.expect("read");
    assert!(never.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_of_several_types_gets_each_and_no_other() {
    let db = TestDb::new().await;
    let outbox = outbox(&db.pool).await;
    for event_type in ["fx.rate", "flags", "other"] {
        put(&outbox, event_type, 0, 1).await;
    }
    let mut selected = outbox.latest::<Rate>(["fx.rate", "flags"]).expect("stream");
    let mut current: Vec<String> = Vec::new();
    for _ in 0..2 {
        current.push(next(&mut selected).await.event_type);
    }
    current.sort();
    assert_eq!(current, ["flags", "fx.rate"]);

    // Another type moves first: the stream passes it over.
    put(&outbox, "other", 0, 2).await;
    put(&outbox, "flags", 0, 2).await;
    let items = until(&mut selected, "flags", 2).await;
    assert!(
        items.iter().all(|item| item.event_type == "flags"),
        "only flags moved among the selected types: {:?}",
        items.iter().map(|i| &i.event_type).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_publishers_converge_every_listener_on_the_final_value() {
    const TYPES: [&str; 2] = ["fx.rate", "flags"];
    const PUBLISHERS: u32 = 4;
    const EACH: u32 = 40;
    let db = TestDb::new().await;
    let a = outbox(&db.pool).await;
    let b = outbox(&db.another_pool(6).await).await;
    // Every publisher publishes each type EACH / 2 times: that many versions per type.
    let final_version = u64::from(PUBLISHERS * EACH / 2);

    let streams = vec![
        a.latest::<Rate>(TYPES).expect("stream"),
        a.latest::<Rate>(TYPES).expect("stream"),
        b.latest::<Rate>(TYPES).expect("stream"),
    ];
    let listeners: Vec<_> = streams
        .into_iter()
        .map(|stream| tokio::spawn(follow(stream, final_version)))
        .collect();

    let publishers: Vec<_> = (0..PUBLISHERS)
        .map(|writer| {
            let outbox = if writer % 2 == 0 {
                a.clone()
            } else {
                b.clone()
            };
            tokio::spawn(async move {
                for n in 0..EACH {
                    let event_type = TYPES[(n % 2) as usize];
                    let value = Rate { writer, n };
                    if n % 3 == 0 {
                        // Some in a transaction with other writes, committed.
                        let mut tx = outbox.begin().await.expect("begin");
                        tx.publish_latest(event_type, &value)
                            .await
                            .expect("publish");
                        tx.commit().await.expect("commit");
                    } else {
                        outbox
                            .publish_latest(event_type, &value)
                            .await
                            .expect("publish");
                    }
                }
            })
        })
        .collect();
    for publisher in publishers {
        publisher.await.expect("publisher");
    }

    let mut table = HashMap::new();
    for event_type in TYPES {
        let stored = a
            .latest_value::<Rate>(event_type)
            .await
            .expect("read")
            .expect("a value");
        assert_eq!(stored.version, final_version, "{event_type}");
        table.insert(event_type.to_owned(), stored.payload);
    }
    for listener in listeners {
        let last = listener.await.expect("listener");
        for event_type in TYPES {
            let seen = &last[event_type];
            assert_eq!(seen.version, final_version, "{event_type}");
            assert_eq!(seen.payload, table[event_type], "{event_type}");
        }
    }
}

/// Follows `stream` until every type reached `final_version`, checking that versions only
/// grow per type; returns the last item of each type.
async fn follow(
    mut stream: LatestStream<Rate>,
    final_version: u64,
) -> HashMap<String, Latest<Rate>> {
    let mut last: HashMap<String, Latest<Rate>> = HashMap::new();
    while last.len() < 2 || last.values().any(|item| item.version < final_version) {
        let item = next(&mut stream).await;
        if let Some(before) = last.get(&item.event_type) {
            assert!(
                item.version > before.version,
                "{}: version went {} -> {}",
                item.event_type,
                before.version,
                item.version
            );
        }
        last.insert(item.event_type.clone(), item);
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_in_a_rolled_back_transaction_is_never_seen() {
    let db = TestDb::new().await;
    let outbox = outbox(&db.pool).await;
    let mut flags = outbox.latest::<Rate>(["flags"]).expect("stream");

    let mut tx = outbox.begin().await.expect("begin");
    tx.publish_latest("flags", &Rate { writer: 9, n: 9 })
        .await
        .expect("publish");
    tx.rollback().await.expect("rollback");
    let mut dropped = outbox.begin().await.expect("begin");
    let rate = Rate { writer: 9, n: 9 };
    dropped
        .publish_latest("flags", &rate)
        .await
        .expect("publish");
    drop(dropped);
    let mut own = db.pool.begin().await.expect("begin");
    outbox
        .publish_latest_in(&mut own, "flags", &Rate { writer: 9, n: 9 })
        .await
        .expect("publish");
    own.rollback().await.expect("rollback");

    // A caller-owned transaction that commits is seen, as version 1: rollbacks took none.
    let mut own = db.pool.begin().await.expect("begin");
    let version = outbox
        .publish_latest_in(&mut own, "flags", &Rate { writer: 1, n: 1 })
        .await
        .expect("publish");
    own.commit().await.expect("commit");
    assert_eq!(version, 1);
    let got = next(&mut flags).await;
    assert_eq!((got.version, &*got.payload), (1, &Rate { writer: 1, n: 1 }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_values_never_enter_the_events_or_the_commit_log() {
    let db = TestDb::new().await;
    let outbox = outbox(&db.pool).await;
    let mut flags = outbox.latest::<Rate>(["flags"]).expect("stream");
    for n in 1..=5 {
        put(&outbox, "flags", 0, n).await;
    }
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish_latest("flags", &Rate { writer: 0, n: 6 })
        .await
        .expect("publish");
    tx.commit().await.expect("commit");
    until(&mut flags, "flags", 6).await;

    for (table, rows) in [("events", 0), ("commit_log", 0), ("latest_values", 1)] {
        let sql = format!("SELECT count(*) FROM ordo.{table}");
        assert_eq!(count(&db.pool, &sql).await, rows, "ordo.{table}");
    }
    assert_eq!(outbox.insert_frontier().get(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_value_is_an_error_item_and_the_stream_goes_on() {
    let db = TestDb::new().await;
    let outbox = outbox(&db.pool).await;
    let mut rates = outbox.latest::<Rate>(["fx.rate"]).expect("stream");
    outbox
        .publish_latest("fx.rate", &"not a rate")
        .await
        .expect("publish");
    let error = timeout(PATIENCE, rates.next())
        .await
        .expect("an item in time")
        .expect("the stream goes on")
        .expect_err("an undecodable value");
    assert!(
        matches!(&error, Error::UndecodableLatest { event_type, version: 1, .. } if event_type == "fx.rate"),
        "{error:?}"
    );
    put(&outbox, "fx.rate", 0, 2).await;
    let got = next(&mut rates).await;
    assert_eq!((got.version, got.payload.n), (2, 2));
}
