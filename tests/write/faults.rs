//! The write side under faults and at scale: a connection lost around `COMMIT` (through a TCP
//! proxy that cuts it right before or right after forwarding the `COMMIT`), the in-doubt
//! outcome and the documented retry, and a very large transaction.

use crate::common;

use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

use common::proxy::{CommitFault, MARKER, Proxy};
use common::{Note, TestDb};
use futures::StreamExt;
use ordo::{CommitStatus, Error, EventStream, Outbox, OutboxConfig, Start};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::time::timeout;
use uuid::Uuid;

const PATIENCE: Duration = Duration::from_secs(30);

/// A pool that reaches the server through `proxy`.
async fn proxied_pool(proxy: &Proxy) -> PgPool {
    let options = PgConnectOptions::from_str(&proxy.url).expect("the proxy's URL");
    PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(2))
        .connect_with(options)
        .await
        .expect("connect through the proxy")
}

async fn setup() -> (TestDb, Proxy, Outbox<Note>) {
    let db = TestDb::new().await;
    sqlx::query("CREATE TABLE orders (id INT NOT NULL)")
        .execute(&db.pool)
        .await
        .expect("create the domain table");
    let proxy = Proxy::start(&db.url).await;
    let outbox = Outbox::new(proxied_pool(&proxy).await, OutboxConfig::default())
        .await
        .expect("start the outbox");
    (db, proxy, outbox)
}

/// Writes a domain row and three events under `ids`, in a transaction the proxy will break.
async fn doomed_transaction(
    outbox: &Outbox<Note>,
    order: i32,
    ids: &[Uuid],
) -> ordo::OutboxTransaction<Note> {
    let mut tx = outbox.begin().await.expect("begin");
    sqlx::query(sqlx::AssertSqlSafe(format!("SELECT '{MARKER}'")))
        .execute(&mut *tx)
        .await
        .expect("mark the connection");
    sqlx::query("INSERT INTO orders (id) VALUES ($1)")
        .bind(order)
        .execute(&mut *tx)
        .await
        .expect("domain write");
    for (n, id) in ids.iter().enumerate() {
        tx.publish_with_id(
            *id,
            Note {
                writer: order as u32,
                n: n as u32,
            },
            ordo::Headers::new(),
        )
        .expect("publish");
    }
    tx
}

async fn stored(pool: &PgPool, ids: &[Uuid]) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM ordo.events WHERE id = ANY($1)")
        .bind(ids)
        .fetch_one(pool)
        .await
        .expect("count events")
}

async fn orders(pool: &PgPool, order: i32) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM orders WHERE id = $1")
        .bind(order)
        .fetch_one(pool)
        .await
        .expect("count orders")
}

/// Asks `commit_status` until it is no longer in progress (the documented wait).
async fn verdict(outbox: &Outbox<Note>, xid: i64, event_ids: &[Uuid]) -> CommitStatus {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match outbox.commit_status(xid, event_ids).await {
            Ok(CommitStatus::InProgress) | Err(_) => {}
            Ok(status) => return status,
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "transaction {xid} stayed in progress"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Publishes a sentinel and reads the lane up to it: how often each event id arrived before.
async fn ids_delivered_until_sentinel(
    outbox: &Outbox<Note>,
    lane: &mut EventStream<Note>,
) -> HashMap<Uuid, usize> {
    let mut tx = outbox.begin().await.expect("begin");
    let sentinel = tx.publish(Note { writer: 999, n: 0 }).expect("publish");
    tx.commit().await.expect("commit the sentinel");
    let mut seen = HashMap::new();
    let mut last = None;
    loop {
        let event = timeout(PATIENCE, lane.next())
            .await
            .expect("the lane delivers")
            .expect("the lane goes on")
            .expect("an event, not an error");
        if let Some(last) = last {
            assert!(event.sequence > last, "the lane went backwards");
        }
        last = Some(event.sequence);
        if event.id == sentinel {
            return seen;
        }
        *seen.entry(event.id).or_default() += 1;
    }
}

fn fresh_ids(count: usize) -> Vec<Uuid> {
    (0..count).map(|_| Uuid::now_v7()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_whose_answer_is_lost_after_the_server_committed_is_ok_and_delivered_once() {
    let (db, proxy, outbox) = setup().await;
    let mut lane = outbox.listen_inserted(Start::Beginning);
    let ids = fresh_ids(3);

    let tx = doomed_transaction(&outbox, 1, &ids).await;
    proxy.arm(CommitFault::DropAfter);
    let result = tx.commit().await;
    assert_eq!(
        proxy.fired(),
        1,
        "the proxy cut the connection after COMMIT"
    );
    let sequences = result.expect("the transaction committed, so commit() says so");
    assert_eq!(sequences.len(), 3);

    // Ok means stored: the documented pattern does not retry, and nothing is duplicated.
    assert_eq!(stored(&db.pool, &ids).await, 3);
    assert_eq!(orders(&db.pool, 1).await, 1);
    let seen = ids_delivered_until_sentinel(&outbox, &mut lane).await;
    for id in &ids {
        assert_eq!(seen.get(id), Some(&1), "event {id} delivered once");
    }
    assert_eq!(seen.len(), 3);
    outbox.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_cut_before_the_server_saw_it_is_an_error_and_stores_nothing() {
    let (db, proxy, outbox) = setup().await;
    let mut lane = outbox.listen_inserted(Start::Beginning);
    let ids = fresh_ids(3);

    let tx = doomed_transaction(&outbox, 2, &ids).await;
    proxy.arm(CommitFault::DropBefore);
    let result = tx.commit().await;
    assert_eq!(
        proxy.fired(),
        1,
        "the proxy cut the connection before COMMIT"
    );
    match result {
        Err(Error::Database(_)) => {}
        other => panic!("expected a database error (nothing published), got {other:?}"),
    }
    assert_eq!(stored(&db.pool, &ids).await, 0);
    assert_eq!(orders(&db.pool, 2).await, 0);
    // The rolled-back sequences are resolved and the lane goes on without them.
    let seen = ids_delivered_until_sentinel(&outbox, &mut lane).await;
    assert!(seen.is_empty(), "nothing of the failed transaction arrives");
    outbox.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_after_commit_is_in_doubt_and_resolves_to_committed_without_retry() {
    let (db, proxy, outbox) = setup().await;
    let mut lane = outbox.listen_inserted(Start::Beginning);
    let ids = fresh_ids(3);

    let tx = doomed_transaction(&outbox, 3, &ids).await;
    let kept = tx.event_ids().to_vec();
    proxy.arm_then_unreachable(CommitFault::DropAfter);
    let (xid, event_ids) = match tx.commit().await {
        Err(Error::CommitInDoubt { xid, event_ids, .. }) => (xid, event_ids),
        other => panic!("expected CommitInDoubt, got {other:?}"),
    };
    assert_eq!(event_ids, kept);
    assert_eq!(event_ids, ids);

    proxy.restore();
    assert_eq!(
        verdict(&outbox, xid, &event_ids).await,
        CommitStatus::Committed
    );
    // Committed: the documented pattern stops here. One copy of each, delivered once.
    let mut found = outbox.published(&ids).await.expect("published");
    found.sort();
    assert_eq!(found, ids);
    assert_eq!(stored(&db.pool, &ids).await, 3);
    assert_eq!(orders(&db.pool, 3).await, 1);
    let seen = ids_delivered_until_sentinel(&outbox, &mut lane).await;
    for id in &ids {
        assert_eq!(seen.get(id), Some(&1), "event {id} delivered once");
    }
    outbox.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_doubt_commit_that_aborted_is_retried_with_the_same_ids_and_stored_once() {
    let (db, proxy, outbox) = setup().await;
    let mut lane = outbox.listen_inserted(Start::Beginning);
    let ids = fresh_ids(3);

    let tx = doomed_transaction(&outbox, 4, &ids).await;
    proxy.arm_then_unreachable(CommitFault::DropBefore);
    let (xid, event_ids) = match tx.commit().await {
        Err(Error::CommitInDoubt { xid, event_ids, .. }) => (xid, event_ids),
        other => panic!("expected CommitInDoubt, got {other:?}"),
    };
    proxy.restore();
    assert_eq!(
        verdict(&outbox, xid, &event_ids).await,
        CommitStatus::Aborted
    );
    assert!(
        outbox
            .published(&event_ids)
            .await
            .expect("published")
            .is_empty()
    );

    // Aborted: retry the whole transaction with the same ids.
    let retry = doomed_transaction(&outbox, 4, &event_ids).await;
    retry.commit().await.expect("the retry commits");
    assert_eq!(stored(&db.pool, &ids).await, 3);
    assert_eq!(orders(&db.pool, 4).await, 1);
    let seen = ids_delivered_until_sentinel(&outbox, &mut lane).await;
    for id in &ids {
        assert_eq!(seen.get(id), Some(&1), "event {id} delivered once");
    }
    outbox.shutdown().await;
}

/// The process's peak resident set so far, in kB (Linux).
fn peak_rss_kb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_150000_event_transaction_commits_in_bounded_memory_and_is_delivered_once_in_order() {
    const EVENTS: u32 = 150_000;
    let db = TestDb::new().await;
    let outbox: Outbox<Note> = Outbox::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("start the outbox");
    let mut lane = outbox.listen_inserted(Start::Beginning);

    let before = peak_rss_kb();
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish_all((0..EVENTS).map(|n| Note { writer: 7, n }))
        .expect("publish");
    let sequences = tx.commit().await.expect("commit");
    let after = peak_rss_kb();
    assert_eq!(sequences.len(), EVENTS as usize);

    let mut next = 0u32;
    let mut last = None;
    while next < EVENTS {
        let event = timeout(PATIENCE, lane.next())
            .await
            .unwrap_or_else(|_| panic!("only {next} of {EVENTS} events arrived"))
            .expect("the lane goes on")
            .expect("an event, not an error");
        if let Some(last) = last {
            assert!(event.sequence > last, "the lane went backwards");
        }
        last = Some(event.sequence);
        assert_eq!(
            event.payload,
            Note { writer: 7, n: next },
            "in publish order"
        );
        next += 1;
    }
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM ordo.events")
        .fetch_one(&db.pool)
        .await
        .expect("count");
    assert_eq!(stored, i64::from(EVENTS));

    // The publish and commit of 150,000 small events (about 20 bytes of JSON each) must not
    // materialise them several times over: before chunking, this grew the peak by 118 MB.
    if let (Some(before), Some(after)) = (before, after) {
        let grown_mb = after.saturating_sub(before) / 1024;
        eprintln!("committing {EVENTS} events raised the peak resident set by {grown_mb} MB");
        assert!(
            grown_mb < 50,
            "committing {EVENTS} events raised the peak resident set by {grown_mb} MB"
        );
    }
    outbox.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_in_inserts_a_batch_of_several_chunks_in_order_in_the_callers_transaction() {
    const EVENTS: u32 = 12_000;
    let db = TestDb::new().await;
    let outbox: Outbox<Note> = Outbox::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("start the outbox");
    let mut lane = outbox.listen_inserted(Start::Beginning);

    let mut tx = db.pool.begin().await.expect("begin");
    let sequences = outbox
        .publish_in(&mut tx, (0..EVENTS).map(|n| Note { writer: 5, n }))
        .await
        .expect("publish_in");
    assert_eq!(sequences.len(), EVENTS as usize);
    assert!(sequences.windows(2).all(|pair| pair[0] < pair[1]));
    // What `publish_in`'s docs say to keep before committing.
    let (xid, ids): (i64, Vec<Uuid>) = sqlx::query_as(
        "SELECT pg_current_xact_id()::text::bigint, array_agg(id) FROM ordo.events \
         WHERE sequence = ANY($1)",
    )
    .bind(&sequences)
    .fetch_one(&mut *tx)
    .await
    .expect("the caller's xid and event ids");
    assert_eq!(ids.len(), EVENTS as usize);
    tx.commit().await.expect("the caller commits");
    assert_eq!(
        outbox
            .commit_status(xid, &ids)
            .await
            .expect("commit_status"),
        CommitStatus::Committed
    );

    for n in 0..EVENTS {
        let event = timeout(PATIENCE, lane.next())
            .await
            .unwrap_or_else(|_| panic!("only {n} of {EVENTS} events arrived"))
            .expect("the lane goes on")
            .expect("an event, not an error");
        assert_eq!(event.payload, Note { writer: 5, n }, "in publish order");
        assert_eq!(event.commit_xid, xid, "one transaction");
    }
    outbox.shutdown().await;
}
