//! Latest values' LISTEN connection: one per outbox, opened by its first stream and closed at
//! shutdown; when it is killed, streams still get every value (the table is read again after
//! the reconnect).

mod common;

use std::time::Duration;

use common::TestDb;
use futures::StreamExt;
use ordo::{Error, Latest, LatestStream, Outbox, OutboxConfig};
use sqlx::PgPool;
use tokio::time::timeout;

const PATIENCE: Duration = Duration::from_secs(30);

/// The latest-value LISTEN connections of the test's database.
const LATEST_PIDS: &str = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
    AND application_name = 'ordo.latest' AND query LIKE 'LISTEN%'";

async fn latest_pids(pool: &PgPool) -> Vec<i32> {
    let pids = sqlx::query_scalar(LATEST_PIDS).fetch_all(pool).await;
    pids.expect("backends")
}

async fn outbox(pool: &PgPool) -> Outbox<serde_json::Value> {
    Outbox::new(pool.clone(), OutboxConfig::default())
        .await
        .expect("start the outbox")
}

/// The next item of `stream` within `limit`, which must be a value.
async fn next_within<T>(stream: &mut LatestStream<T>, limit: Duration) -> Latest<T> {
    timeout(limit, stream.next())
        .await
        .expect("a latest value in time")
        .expect("the stream ended early")
        .expect("a value, not an error")
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
            let mut live = latest_pids(&db.pool).await;
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
    assert!(latest_pids(&db.pool).await.is_empty());
    assert!(matches!(
        outbox.latest::<u32>(Vec::<String>::new()),
        Err(Error::InvalidConfig { .. })
    ));
    let mut first = outbox.latest::<u32>(["flags"]).expect("stream");
    let mut second = outbox.latest::<u32>(["fx.rate"]).expect("stream");
    outbox.publish_latest("flags", &1).await.expect("publish");
    next_within(&mut first, PATIENCE).await;
    assert_eq!(latest_pids(&db.pool).await.len(), 1, "one per outbox");

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
            latest_pids(&db.pool).await.is_empty()
        })
        .await,
        "the LISTEN connection is closed"
    );
}
