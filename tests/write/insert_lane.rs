//! The insert-ordered lane: every committed event once, in order, none missing, across
//! concurrent writers, rollbacks, held-open gaps, lag, plain-SQL writers and lost connections.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::{Note, TestDb};
use futures::StreamExt;
use ordo::{Envelope, Error, EventSequence, EventStream, Outbox, OutboxConfig, Start};
use rand::Rng;
use tokio::time::timeout;

const PATIENCE: Duration = Duration::from_secs(30);

async fn outbox(pool: &sqlx::PgPool, config: OutboxConfig) -> Outbox<Note> {
    Outbox::new(pool.clone(), config)
        .await
        .expect("start the outbox")
}

/// Takes `count` events (errors fail the test), checking strictly increasing sequences.
async fn take(stream: &mut EventStream<Note>, count: usize) -> Vec<Arc<Envelope<Note>>> {
    let mut out: Vec<Arc<Envelope<Note>>> = Vec::with_capacity(count);
    while out.len() < count {
        let item = timeout(PATIENCE, stream.next())
            .await
            .unwrap_or_else(|_| panic!("only {} of {count} events arrived", out.len()))
            .expect("the stream ended early")
            .expect("an event, not an error");
        if let Some(last) = out.last() {
            assert!(
                item.sequence > last.sequence,
                "sequence went {} -> {}",
                last.sequence,
                item.sequence
            );
        }
        out.push(item);
    }
    out
}

/// Asserts that nothing arrives within `wait`.
async fn assert_quiet(stream: &mut EventStream<Note>, wait: Duration) {
    if let Ok(item) = timeout(wait, stream.next()).await {
        panic!("expected nothing yet, got {item:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_with_rollbacks_deliver_every_commit_once_in_order() {
    let db = TestDb::new().await;
    let local = outbox(&db.pool, OutboxConfig::default()).await;
    let remote = outbox(&db.another_pool(5).await, OutboxConfig::default()).await;
    let mut local_events = local.listen_inserted(Start::Beginning);
    let mut remote_events = remote.listen_inserted(Start::Beginning);

    let mut writers = Vec::new();
    for writer in 0..8u32 {
        let outbox = local.clone();
        writers.push(tokio::spawn(async move {
            let mut committed = Vec::new();
            for n in 0..40u32 {
                let (events, outcome) = {
                    let mut rng = rand::rng();
                    (rng.random_range(1..=3u32), rng.random_range(0..4u32))
                };
                let mut tx = outbox.begin().await.expect("begin");
                for k in 0..events {
                    tx.publish(Note {
                        writer,
                        n: n * 10 + k,
                    })
                    .expect("publish");
                }
                match outcome {
                    0 => tx.rollback().await.expect("rollback"),
                    1 => drop(tx),
                    _ => {
                        tx.commit().await.expect("commit");
                        committed.extend((0..events).map(|k| (writer, n * 10 + k)));
                    }
                }
            }
            committed
        }));
    }
    let mut expected = BTreeSet::new();
    for writer in writers {
        expected.extend(writer.await.expect("writer task"));
    }
    for events in [&mut local_events, &mut remote_events] {
        let got = take(events, expected.len()).await;
        let seen: BTreeSet<(u32, u32)> = got
            .iter()
            .map(|e| (e.payload.writer, e.payload.n))
            .collect();
        assert_eq!(seen.len(), got.len(), "an event was delivered twice");
        assert_eq!(
            seen, expected,
            "delivered set differs from the committed set"
        );
        assert_quiet(events, Duration::from_millis(200)).await;
    }
    // Per writer, commit order is publish order, so sequences must follow it too.
    let got_again: Vec<_> =
        take(&mut local.listen_inserted(Start::Beginning), expected.len()).await;
    for writer in 0..8u32 {
        let ns: Vec<u32> = got_again
            .iter()
            .filter(|e| e.payload.writer == writer)
            .map(|e| e.payload.n)
            .collect();
        assert!(
            ns.windows(2).all(|w| w[0] < w[1]),
            "writer {writer} out of order: {ns:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_held_open_across_a_gap_is_delivered_when_it_commits_and_the_lane_never_skips_it() {
    let db = TestDb::new().await;
    let config = OutboxConfig::default()
        .gap_grace(Duration::from_millis(20))
        .gap_fill_timeout(Duration::from_millis(300));
    let outbox = outbox(&db.pool, config).await;
    let mut events = outbox.listen_inserted(Start::Beginning);

    // A plain-SQL writer takes a sequence and holds its transaction open.
    let mut held = db.pool.begin().await.expect("begin");
    sqlx::query(r#"INSERT INTO ordo.events (payload) VALUES ('{"writer": 1, "n": 1}')"#)
        .execute(&mut *held)
        .await
        .expect("held insert");
    // A later writer commits above the hole.
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(Note { writer: 2, n: 2 }).expect("publish");
    tx.commit().await.expect("commit");

    // Well past the grace and the fill timeout, the lane must still be waiting.
    assert_quiet(&mut events, Duration::from_millis(1_000)).await;
    held.commit().await.expect("commit the held writer");
    let got = take(&mut events, 2).await;
    assert_eq!(got[0].payload, Note { writer: 1, n: 1 });
    assert_eq!(got[1].payload, Note { writer: 2, n: 2 });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_writer_held_across_a_gap_is_never_delivered() {
    let db = TestDb::new().await;
    let config = OutboxConfig::default().gap_grace(Duration::from_millis(20));
    let outbox = outbox(&db.pool, config).await;
    let mut events = outbox.listen_inserted(Start::Beginning);

    let mut held = db.pool.begin().await.expect("begin");
    sqlx::query(r#"INSERT INTO ordo.events (payload) VALUES ('{"writer": 1, "n": 1}')"#)
        .execute(&mut *held)
        .await
        .expect("held insert");
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(Note { writer: 2, n: 2 }).expect("publish");
    tx.commit().await.expect("commit");

    assert_quiet(&mut events, Duration::from_millis(300)).await;
    held.rollback().await.expect("roll back the held writer");
    let got = take(&mut events, 1).await;
    assert_eq!(got[0].payload, Note { writer: 2, n: 2 });
    let placeholders: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM ordo.events WHERE payload IS NULL AND commit_xid IS NULL",
    )
    .fetch_one(&db.pool)
    .await
    .expect("count placeholders");
    assert_eq!(
        placeholders, 1,
        "the rolled-back sequence is resolved by one placeholder"
    );
    assert_quiet(&mut events, Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_from_the_beginning_receives_more_history_than_the_cache_holds() {
    let db = TestDb::new().await;
    let config = OutboxConfig::default().cache_capacity(64).page_size(100);
    let outbox = outbox(&db.pool, config).await;
    for batch in 0..10u32 {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish_all((0..100).map(|n| Note { writer: batch, n }))
            .expect("publish");
        tx.commit().await.expect("commit");
    }
    let got = take(&mut outbox.listen_inserted(Start::Beginning), 1_000).await;
    assert_eq!(got.first().map(|e| e.sequence), Some(EventSequence::new(1)));
    assert_eq!(
        got.last().map(|e| e.sequence),
        Some(EventSequence::new(1_000))
    );

    let from_middle = take(
        &mut outbox.listen_inserted(Start::After(EventSequence::new(500))),
        500,
    )
    .await;
    assert_eq!(from_middle[0].sequence, EventSequence::new(501));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_around_the_toast_threshold_and_of_a_megabyte_round_trip() {
    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Blob {
        data: String,
    }
    let db = TestDb::new().await;
    let outbox = Outbox::<Blob>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let remote = Outbox::<Blob>::new(db.another_pool(3).await, OutboxConfig::default())
        .await
        .expect("outbox");
    let mut local_events = outbox.listen_inserted(Start::Beginning);
    let mut remote_events = remote.listen_inserted(Start::Beginning);
    let sizes = [7_999usize, 8_000, 8_001, 1_000_000];
    for size in sizes {
        // `{"data":"…"}` is 11 bytes around the string.
        let blob = Blob {
            data: "x".repeat(size - 11),
        };
        assert_eq!(serde_json::to_string(&blob).expect("json").len(), size);
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish(blob).expect("publish");
        tx.commit().await.expect("commit");
    }
    for events in [&mut local_events, &mut remote_events] {
        for size in sizes {
            let event = timeout(PATIENCE, events.next())
                .await
                .expect("in time")
                .expect("open")
                .expect("event");
            assert_eq!(event.payload.data.len(), size - 11);
        }
    }
    let stored: Vec<i32> =
        sqlx::query_scalar("SELECT length(payload::text) FROM ordo.events ORDER BY sequence")
            .fetch_all(&db.pool)
            .await
            .expect("stored sizes");
    assert_eq!(stored.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_sql_inserts_from_another_connection_are_delivered() {
    let db = TestDb::new().await;
    let outbox = outbox(&db.pool, OutboxConfig::default()).await;
    let mut events = outbox.listen_inserted(Start::Now);
    let other = db.another_pool(2).await;
    for n in 0..5 {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            r#"INSERT INTO ordo.events (payload) VALUES ('{{"writer": 9, "n": {n}}}')"#
        )))
        .execute(&other)
        .await
        .expect("plain insert");
    }
    let got = take(&mut events, 5).await;
    assert_eq!(
        got.iter().map(|e| e.payload.n).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4]
    );
    assert!(got.iter().all(|e| e.commit_xid > 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_payload_is_an_error_item_and_the_next_event_still_arrives() {
    let db = TestDb::new().await;
    let outbox = outbox(&db.pool, OutboxConfig::default()).await;
    let mut events = outbox.listen_inserted(Start::Beginning);
    sqlx::query(r#"INSERT INTO ordo.events (payload) VALUES ('{"not": "a note"}')"#)
        .execute(&db.pool)
        .await
        .expect("bad insert");
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(Note { writer: 1, n: 2 }).expect("publish");
    tx.commit().await.expect("commit");

    let first = timeout(PATIENCE, events.next())
        .await
        .expect("in time")
        .expect("open");
    match first {
        Err(Error::UndecodablePayload { sequence, .. }) => {
            assert_eq!(sequence, EventSequence::new(1))
        }
        other => panic!("expected an undecodable-payload error, got {other:?}"),
    }
    let next = take(&mut events, 1).await;
    assert_eq!(next[0].payload, Note { writer: 1, n: 2 });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_listen_connection_loses_nothing() {
    let db = TestDb::new().await;
    // A long resync: after the first events, only wake-ups and reconnects can deliver.
    let config = OutboxConfig::default().resync_interval(Duration::from_secs(60));
    let writer = outbox(&db.pool, OutboxConfig::default()).await;
    let reader = outbox(&db.another_pool(3).await, config).await;
    let mut events = reader.listen_inserted(Start::Beginning);

    for round in 0..5u32 {
        let mut tx = writer.begin().await.expect("begin");
        tx.publish(Note {
            writer: 0,
            n: round * 2,
        })
        .expect("publish");
        tx.commit().await.expect("commit");
        take(&mut events, 1).await;

        let terminated: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND query LIKE 'LISTEN%' AND pid <> pg_backend_pid()",
        )
        .fetch_one(&db.pool)
        .await
        .expect("terminate LISTEN backends");
        assert!(terminated >= 1, "no LISTEN connection found to terminate");
        // Published while the connection is down: only the reconnect's look can find it.
        let mut tx = writer.begin().await.expect("begin");
        tx.publish(Note {
            writer: 0,
            n: round * 2 + 1,
        })
        .expect("publish");
        tx.commit().await.expect("commit");
        let got = take(&mut events, 1).await;
        assert_eq!(got[0].payload.n, round * 2 + 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_and_dropped_transactions_publish_nothing_and_publish_in_does() {
    let db = TestDb::new().await;
    let outbox = outbox(&db.pool, OutboxConfig::default()).await;
    let mut events = outbox.listen_inserted(Start::Now);

    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(Note { writer: 1, n: 1 }).expect("publish");
    tx.rollback().await.expect("rollback");
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(Note { writer: 1, n: 2 }).expect("publish");
    drop(tx);

    let mut own = db.pool.begin().await.expect("begin");
    let sequences = outbox
        .publish_in(
            &mut own,
            [Note { writer: 1, n: 3 }, Note { writer: 1, n: 4 }],
        )
        .await
        .expect("publish_in");
    assert_eq!(sequences.len(), 2);
    own.commit().await.expect("commit");

    let got = take(&mut events, 2).await;
    assert_eq!(
        got.iter().map(|e| e.payload.n).collect::<Vec<_>>(),
        vec![3, 4]
    );
    assert_eq!(
        got[0].commit_xid, got[1].commit_xid,
        "one transaction, one commit_xid"
    );
    let rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM ordo.events WHERE payload IS NOT NULL")
            .fetch_one(&db.pool)
            .await
            .expect("count");
    assert_eq!(rows, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contradictory_configuration_is_refused_naming_the_settings() {
    let db = TestDb::new().await;
    let cases = [
        (OutboxConfig::default().cache_capacity(1), "cache_capacity"),
        (OutboxConfig::default().cache_bytes(10), "cache_bytes"),
        (OutboxConfig::default().page_size(0), "page_size"),
        (
            OutboxConfig::default()
                .gap_poll(Duration::from_secs(1))
                .resync_interval(Duration::from_millis(10)),
            "gap_poll/resync_interval",
        ),
        (
            OutboxConfig::default()
                .gap_grace(Duration::from_secs(10))
                .gap_fill_timeout(Duration::from_secs(1)),
            "gap_fill_timeout/gap_grace",
        ),
        (
            OutboxConfig::default().notify_channel("no spaces; please"),
            "notify_channel",
        ),
        (
            OutboxConfig::default().notify_channel("ordo_latest"),
            "notify_channel",
        ),
        (
            OutboxConfig::default().fold_interval(Duration::from_secs(5)),
            "fold_interval",
        ),
        (
            OutboxConfig::default().unwatched_append_spacing(Duration::from_secs(61)),
            "unwatched_append_spacing",
        ),
    ];
    for (config, expected) in cases {
        match Outbox::<Note>::new(db.pool.clone(), config).await {
            Err(Error::InvalidConfig { setting, reason }) => {
                assert_eq!(setting, expected, "{reason}");
                assert!(!reason.is_empty());
            }
            Err(other) => panic!("{expected}: expected an invalid config, got {other}"),
            Ok(_) => panic!("{expected}: expected an invalid config, got a running outbox"),
        }
    }
    // Nothing was started: no background task holds a LISTEN connection.
    let listening: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("count");
    assert_eq!(listening, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_and_small_events_under_a_small_byte_budget_arrive_once_in_order_live_and_late() {
    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Blob {
        n: u32,
        data: String,
    }
    // Small events fit many to the budget, medium ones two at a time, large ones not at all.
    const BUDGET: usize = 16_384;
    let sizes = [10usize, 40_000, 6_000, 10, 6_000, 40_000, 40_000, 10, 6_000];
    let blob = |n: usize| Blob {
        n: n as u32,
        data: "x".repeat(sizes[n % sizes.len()]),
    };
    let db = TestDb::new().await;
    let config = || {
        OutboxConfig::default()
            .cache_capacity(64)
            .cache_bytes(BUDGET)
    };
    let outbox = Outbox::<Blob>::new(db.pool.clone(), config())
        .await
        .expect("outbox");
    let remote = Outbox::<Blob>::new(db.another_pool(3).await, config())
        .await
        .expect("outbox");
    let mut live = outbox.listen_inserted(Start::Beginning);
    let mut live_committed = outbox.listen_committed(Start::Beginning);
    let mut live_remote = remote.listen_inserted(Start::Beginning);

    let total = 45;
    for first in (0..total).step_by(3) {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish_all((first..first + 3).map(blob))
            .expect("publish");
        tx.commit().await.expect("commit");
    }

    let check = |who: &str, got: &[Arc<Envelope<Blob>>]| {
        let ns: Vec<u32> = got.iter().map(|e| e.payload.n).collect();
        assert_eq!(ns, (0..total as u32).collect::<Vec<_>>(), "{who}");
        for event in got {
            assert_eq!(event.payload, blob(event.payload.n as usize), "{who}");
        }
    };
    async fn take_all<T, F: Fn(&T) -> Arc<Envelope<Blob>>>(
        stream: &mut futures::stream::BoxStream<'static, ordo::Result<T>>,
        count: usize,
        envelope: F,
    ) -> Vec<Arc<Envelope<Blob>>> {
        let mut out = Vec::new();
        while out.len() < count {
            let item = timeout(PATIENCE, stream.next())
                .await
                .unwrap_or_else(|_| panic!("only {} of {count} events arrived", out.len()))
                .expect("the stream ended early")
                .expect("an event, not an error");
            out.push(envelope(&item));
        }
        out
    }
    let got = take_all(&mut live, total, Arc::clone).await;
    check("live", &got);
    // A payload larger than the whole budget is not kept by the lane: the listener holds the
    // only reference to it.
    for event in got.iter().filter(|e| e.payload.data.len() > BUDGET) {
        assert_eq!(
            Arc::strong_count(event),
            1,
            "event {} ({} bytes) is still held by the lane",
            event.sequence,
            event.payload.data.len()
        );
    }
    check(
        "live, commit lane",
        &take_all(&mut live_committed, total, |item| Arc::clone(&item.event)).await,
    );
    check(
        "live, other process",
        &take_all(&mut live_remote, total, Arc::clone).await,
    );
    for (who, source) in [("late", &outbox), ("late, other process", &remote)] {
        let mut late = source.listen_inserted(Start::Beginning);
        check(who, &take_all(&mut late, total, Arc::clone).await);
        let mut late_committed = source.listen_committed(Start::Beginning);
        let got = take_all(&mut late_committed, total, |item| Arc::clone(&item.event)).await;
        check(who, &got);
    }
}
