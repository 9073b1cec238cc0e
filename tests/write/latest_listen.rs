//! An outbox's one LISTEN connection: the latest values' channel joins the wake-ups' connection
//! (or opens it, where cross-process wake-ups are off) with the first stream, and it is closed
//! at shutdown; when it is killed, streams and listeners still get everything (each table is
//! read again after the reconnect).

use crate::common;

use std::time::Duration;

use common::TestDb;
use futures::StreamExt;
use ordo::{Envelope, Error, EventStream, Latest, LatestStream, Outbox, OutboxConfig, Start};
use sqlx::PgPool;
use tokio::time::timeout;

const PATIENCE: Duration = Duration::from_secs(30);

/// The outboxes' LISTEN connections on the test's database.
const LISTEN_PIDS: &str = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
    AND application_name = 'ordo.listen' AND query LIKE 'LISTEN%'";

async fn listen_pids(pool: &PgPool) -> Vec<i32> {
    let pids = sqlx::query_scalar(LISTEN_PIDS).fetch_all(pool).await;
    pids.expect("backends")
}

async fn outbox_with(pool: &PgPool, config: OutboxConfig) -> Outbox<serde_json::Value> {
    Outbox::new(pool.clone(), config)
        .await
        .expect("start the outbox")
}

/// An outbox without cross-process wake-ups: its only LISTEN channel is the latest values'.
async fn outbox(pool: &PgPool) -> Outbox<serde_json::Value> {
    outbox_with(pool, OutboxConfig::default().cross_process_wakeups(false)).await
}

/// The next item of `stream` within `limit`, which must be a value.
async fn next_within<T>(stream: &mut LatestStream<T>, limit: Duration) -> Latest<T> {
    timeout(limit, stream.next())
        .await
        .expect("a latest value in time")
        .expect("the stream ended early")
        .expect("a value, not an error")
}

/// The next event of `events` within `limit`.
async fn next_event(
    events: &mut EventStream<serde_json::Value>,
    limit: Duration,
) -> std::sync::Arc<Envelope<serde_json::Value>> {
    timeout(limit, events.next())
        .await
        .expect("the event in time")
        .expect("the stream goes on")
        .expect("an event, not an error")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_listen_connection_is_followed_by_a_read_of_the_table() {
    let db = TestDb::new().await;
    let writer = outbox(&db.pool).await;
    let reader = outbox(&db.another_pool(4).await).await;
    let mut flags = reader.latest::<u32>(["flags"]).expect("stream");
    // Shorter than the periodic resync (30 s): only the reconnect's read can deliver in time.
    let limit = Duration::from_secs(10);

    let mut gone: Vec<i32> = Vec::new();
    for round in 1..=4u32 {
        // The one LISTEN backend: at first, or the new one after the last round's termination
        // (a terminated backend may still be listed for a moment while it exits).
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let pid = loop {
            let mut live = listen_pids(&db.pool).await;
            live.retain(|pid| !gone.contains(pid));
            if let [pid] = live[..] {
                break pid;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "round {round}: {live:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(&db.pool)
            .await
            .expect("terminate");
        assert!(killed, "round {round}: terminate the LISTEN connection");
        gone.push(pid);
        // Published while the connection is down (it reconnects after a backoff).
        writer
            .publish_latest("flags", &round)
            .await
            .expect("publish");
        let got = next_within(&mut flags, limit).await;
        assert_eq!((got.version, *got.payload), (u64::from(round), round));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listen_connection_starts_with_the_first_stream_and_ends_with_shutdown() {
    let db = TestDb::new().await;
    let outbox = outbox(&db.pool).await;
    assert!(listen_pids(&db.pool).await.is_empty());
    assert!(matches!(
        outbox.latest::<u32>(Vec::<String>::new()),
        Err(Error::InvalidConfig { .. })
    ));
    let mut first = outbox.latest::<u32>(["flags"]).expect("stream");
    let mut second = outbox.latest::<u32>(["fx.rate"]).expect("stream");
    outbox.publish_latest("flags", &1).await.expect("publish");
    next_within(&mut first, PATIENCE).await;
    assert_eq!(listen_pids(&db.pool).await.len(), 1, "one per outbox");

    outbox.shutdown().await;
    for stream in [&mut first, &mut second] {
        let end = timeout(PATIENCE, stream.next())
            .await
            .expect("the end in time");
        assert!(end.is_none(), "the stream ends at shutdown");
    }
    assert!(matches!(
        outbox.latest::<u32>(["flags"]),
        Err(Error::Shutdown)
    ));
    assert!(matches!(
        outbox.publish_latest("flags", &1).await,
        Err(Error::Shutdown)
    ));
    assert!(
        common::eventually(PATIENCE, || async {
            listen_pids(&db.pool).await.is_empty()
        })
        .await,
        "the LISTEN connection is closed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_listen_connection_per_outbox_carries_the_wake_ups_and_the_latest_values() {
    let db = TestDb::new().await;
    // Resyncs longer than the limit below: only notifications, and the reads that follow a
    // reconnect, can deliver in time.
    let limit = Duration::from_secs(10);
    let writer = outbox_with(&db.pool, OutboxConfig::default()).await;
    let reader_config = OutboxConfig::default().resync_interval(Duration::from_secs(60));
    let reader = outbox_with(&db.another_pool(4).await, reader_config).await;
    let mut events = reader.listen_inserted(Start::Now);
    let two = || async { listen_pids(&db.pool).await.len() == 2 };
    assert!(
        common::eventually(PATIENCE, two).await,
        "each outbox listens for wake-ups on a connection of its own"
    );

    let mut flags = reader.latest::<u32>(["flags"]).expect("stream");
    for round in 1..=3u32 {
        writer
            .publish_latest("flags", &round)
            .await
            .expect("publish");
        let got = next_within(&mut flags, limit).await;
        assert_eq!((got.version, *got.payload), (u64::from(round), round));
        let mut tx = writer.begin().await.expect("begin");
        tx.publish(serde_json::json!({ "round": round }))
            .expect("publish");
        tx.commit().await.expect("commit");
        let event = next_event(&mut events, limit).await;
        assert_eq!(event.payload["round"], round);
        // Still one connection each: the latest values joined the reader's wake-up connection.
        // Never more than one each; after the last round's kill, the writer's may still be
        // reconnecting when the reader already has both, so wait for it.
        let pids = listen_pids(&db.pool).await;
        assert!(pids.len() <= 2, "round {round}: {pids:?}");
        assert!(
            common::eventually(PATIENCE, two).await,
            "round {round}: each outbox listens again on a connection of its own"
        );

        // Both channels lost at once; what is sent while they are down arrives by the reads
        // that follow the reconnect.
        let killed: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name = 'ordo.listen'",
        )
        .fetch_one(&db.pool)
        .await
        .expect("terminate");
        assert_eq!(killed, 2, "round {round}");
    }
    writer.publish_latest("flags", &4).await.expect("publish");
    let got = next_within(&mut flags, limit).await;
    assert_eq!(*got.payload, 4);
    let mut tx = writer.begin().await.expect("begin");
    tx.publish(serde_json::json!({ "round": 4 }))
        .expect("publish");
    tx.commit().await.expect("commit");
    let event = next_event(&mut events, limit).await;
    assert_eq!(event.payload["round"], 4);
}
