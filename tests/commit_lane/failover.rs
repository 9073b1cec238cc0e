//! A primary fails over to its streaming standby while ordo is mid-stream.
//!
//! Each test builds a private primary and a standby with `pg_basebackup` (see
//! `common::cluster`), puts a TCP proxy in front of the primary as the address every part of
//! ordo connects to, SIGKILLs every process of the primary mid-stream, promotes the standby and
//! points the proxy at it: an address that moves to the new primary, as a virtual IP, a
//! re-resolved name or a pooler re-pointed by the failover manager does. Nobody restarts
//! anything in ordo. Where postgresql-common is absent the tests say so and pass.
//!
//! With a synchronous standby (`synchronous_standby_names`, `synchronous_commit = on`),
//! nothing acknowledged may be lost: every event whose `commit()` returned `Ok` is stored on the
//! promoted server exactly once, handled once by a subscription, delivered once on the commit
//! lane, which stays dense; a relay to NATS JetStream and a watermark inbox downstream (on a
//! cluster of its own) end with each event once, at its position; an event whose `commit()`
//! failed is not stored; an in-doubt commit is answered rightly.
#![cfg(feature = "nats")]

use crate::common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Note;
use common::brokers::{NATS_ADDR, TestStream};
use common::cluster::Cluster;
use common::invariants::{ORDO, check_log};
use common::proxy::{CommitFault, MARKER, Proxy};
use common::relays::config as relay_config;
use common::subscribers::{Project, assert_exactly_once, projection_table};
use common::tcp_fault::{Fault, TcpFault};
use futures::StreamExt;
use ordo::inbox::{Inbox, InboxConfig, InboxHandler, InboxMessage, InboxMode};
use ordo::relay::nats::NatsSink;
use ordo::{
    CommitStatus, CommitStream, Envelope, Error, HandlerError, JobConfig, Keys, Ordering, Outbox,
    OutboxConfig, Start, SubscriptionHandle,
};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

const WRITERS: u32 = 3;
/// Events acknowledged before the kill, and again after the promotion.
const ACKED_EACH_SIDE: usize = 150;
const PATIENCE: Duration = Duration::from_secs(60);

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A pool that gives up on a connection after two seconds, so that writers see the outage as
/// errors and go on.
async fn pool_on(url: &str, size: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(2))
        .connect(url)
        .await
        .expect("connect")
}

/// Makes `standby` the primary's synchronous standby and waits until it is.
async fn make_synchronous(primary: &PgPool, standby: &str) {
    for statement in [
        format!("ALTER SYSTEM SET synchronous_standby_names = '{standby}'"),
        "SELECT pg_reload_conf()".to_owned(),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(primary)
            .await
            .expect("synchronous_standby_names");
    }
    wait_for_standby(primary, standby, "sync").await;
}

/// Waits until `standby` streams from `primary` with `sync_state` `state`.
async fn wait_for_standby(primary: &PgPool, standby: &str, state: &str) {
    let ready = common::eventually(PATIENCE, || async {
        let found: Option<String> = sqlx::query_scalar(
            "SELECT sync_state FROM pg_stat_replication \
             WHERE application_name = $1 AND state = 'streaming'",
        )
        .bind(standby)
        .fetch_optional(primary)
        .await
        .ok()
        .flatten();
        found.as_deref() == Some(state)
    })
    .await;
    assert!(ready, "{standby} is not a {state} standby");
}

/// What the writers were told.
#[derive(Default)]
struct Outcomes {
    /// `commit()` returned `Ok`.
    acked: Vec<Uuid>,
    /// `commit()` failed, not in doubt: nothing of it may be stored.
    refused: Vec<Uuid>,
    /// `commit()` reported `CommitInDoubt`.
    in_doubt: Vec<(i64, Vec<Uuid>)>,
    /// `begin()` refused while the outbox started again after a rewind (what it said first).
    rewound: Option<String>,
}

/// Publishes until `stop`: transactions of one or two events, every fifth rolled back; waits
/// out errors (the outage) and goes on.
async fn write(
    outbox: Outbox<Note>,
    writer: u32,
    outcomes: Arc<Mutex<Outcomes>>,
    stop: Arc<AtomicBool>,
) {
    let mut t = 0u32;
    while !stop.load(AtomicOrdering::SeqCst) {
        t += 1;
        let mut tx = match outbox.begin().await {
            Ok(tx) => tx,
            Err(Error::ServerRewound { what }) => {
                // The outbox starts again from what the server holds: wait for it.
                outcomes
                    .lock()
                    .expect("outcomes")
                    .rewound
                    .get_or_insert(what);
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let count = if t.is_multiple_of(3) { 2 } else { 1 };
        let mut ids = Vec::new();
        for k in 0..count {
            ids.push(
                tx.publish(Note {
                    writer,
                    n: t * 2 + k,
                })
                .expect("publish"),
            );
        }
        if t.is_multiple_of(5) {
            let _ = tx.rollback().await;
            continue;
        }
        let outcome = tx.commit().await;
        let mut outcomes = outcomes.lock().expect("outcomes");
        match outcome {
            Ok(_) => outcomes.acked.extend(ids),
            Err(Error::CommitInDoubt { xid, event_ids, .. }) => {
                outcomes.in_doubt.push((xid, event_ids))
            }
            Err(_) => outcomes.refused.extend(ids),
        }
    }
}

fn acked(outcomes: &Mutex<Outcomes>) -> usize {
    outcomes.lock().expect("outcomes").acked.len()
}

/// How many copies of each of `ids` the server holds as committed events.
async fn copies(pool: &PgPool, ids: &[Uuid]) -> Vec<(Uuid, i64)> {
    sqlx::query_as(
        "SELECT id, count(*) FROM ordo.events \
         WHERE id = ANY($1) AND commit_xid IS NOT NULL GROUP BY id",
    )
    .bind(ids)
    .fetch_all(pool)
    .await
    .expect("count the copies")
}

/// The downstream inbox's handler: one row per message, at its position.
struct Downstream;

impl InboxHandler for Downstream {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        message: &InboxMessage,
    ) -> Result<(), HandlerError> {
        let position = message
            .position
            .ok_or("a watermark message has a position")?;
        sqlx::query("INSERT INTO downstream (position, event_id) VALUES ($1, $2)")
            .bind(i64::try_from(position)?)
            .bind(&message.id)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

/// One key for every event: the relay sends in commit order, as a watermark inbox wants.
fn in_commit_order(_: &Envelope<Note>) -> Keys {
    Keys::one("all")
}

/// Runs a NATS adapter into a watermark inbox on `pool` until `stop` fires.
fn downstream(
    pool: PgPool,
    stream: &TestStream,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> tokio::task::JoinHandle<()> {
    let adapter = common::brokers::watermark_adapter(NATS_ADDR, stream, "fo-downstream");
    let inbox = Inbox::new(
        pool,
        InboxConfig::new("fo-downstream").mode(InboxMode::Watermark),
    )
    .expect("inbox");
    tokio::spawn(async move {
        adapter
            .run(&inbox, &Downstream, async move {
                let _ = stop.await;
            })
            .await
            .expect("the adapter runs");
    })
}

/// What the downstream inbox holds: (position, event id), by position.
async fn downstream_rows(pool: &PgPool) -> Vec<(i64, String)> {
    sqlx::query_as("SELECT position, event_id FROM downstream ORDER BY position, event_id")
        .fetch_all(pool)
        .await
        .expect("the downstream rows")
}

/// The sending side on `pool`: an outbox, a commit-ordered subscription `subscription` that
/// projects every event, and a relay of the commit lane to `stream`, one key for all.
struct Sender {
    outbox: Outbox<Note>,
    subscription: SubscriptionHandle,
    relay: SubscriptionHandle,
}

impl Sender {
    async fn start(pool: &PgPool, subscription: &str, stream: &TestStream) -> Sender {
        let outbox = Outbox::<Note>::new(pool.clone(), OutboxConfig::default())
            .await
            .expect("outbox");
        let subscription = outbox
            .subscribe(
                JobConfig::new(subscription).ordering(Ordering::Commit),
                Project { fail_rate: 0.0 },
            )
            .await
            .expect("subscribe");
        let sink = NatsSink::builder(NATS_ADDR)
            .subject_prefix(&stream.prefix)
            .build()
            .expect("sink");
        let relay = outbox
            .relay(
                relay_config("fo-relay").source("fo-a"),
                sink,
                in_commit_order,
            )
            .await
            .expect("relay");
        Sender {
            outbox,
            subscription,
            relay,
        }
    }

    async fn shutdown(&self) {
        self.relay.shutdown().await;
        self.subscription.shutdown().await;
        self.outbox.shutdown().await;
    }
}

/// A private cluster `name` on `port` for the inbox downstream: migrated, with its table.
async fn receiver(name: &str, port: u16) -> Option<(Cluster, PgPool)> {
    let receiver = Cluster::create(name, port, &[])?;
    let receiving = pool_on(&receiver.url(), 4).await;
    ordo::migrate(&receiving).await.expect("migrate downstream");
    sqlx::query("CREATE TABLE downstream (position BIGINT NOT NULL, event_id TEXT NOT NULL)")
        .execute(&receiving)
        .await
        .expect("the downstream table");
    Some((receiver, receiving))
}

/// [`WRITERS`] writers on `outbox`, until `stop`.
fn spawn_writers(
    outbox: &Outbox<Note>,
    outcomes: &Arc<Mutex<Outcomes>>,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..WRITERS)
        .map(|w| {
            tokio::spawn(write(
                outbox.clone(),
                w,
                Arc::clone(outcomes),
                Arc::clone(stop),
            ))
        })
        .collect()
}

/// The commit lane `pool` holds: (position, event id), by position.
async fn commit_lane_of(pool: &PgPool) -> Vec<(i64, String)> {
    sqlx::query_as(
        "SELECT l.commit_seq, e.id::text FROM ordo.commit_log AS l \
         JOIN ordo.events AS e ON e.sequence = l.sequence ORDER BY l.commit_seq",
    )
    .fetch_all(pool)
    .await
    .expect("the commit lane")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_synchronous_standby_loses_and_repeats_nothing_acknowledged() {
    let Some(primary) = Cluster::create("ordo_fo_sync_p", 5491, &[]) else {
        return;
    };
    let setup = pool_on(&primary.url(), 2).await;
    ordo::migrate(&setup).await.expect("migrate");
    projection_table(&setup).await;
    let standby = Cluster::standby_of(&primary, primary.port(), "ordo_fo_sync_s", 5492);
    make_synchronous(&setup, "ordo_fo_sync_s").await;
    setup.close().await;

    let front = TcpFault::start(local(primary.port())).await;
    let url = format!("postgres://postgres@{}/postgres", front.addr());
    let pool = pool_on(&url, 6).await;
    // Downstream: a relay to NATS, and a watermark inbox on a cluster of its own.
    let Some((_receiver, receiving)) = receiver("ordo_fo_sync_b", 5495).await else {
        return;
    };
    let stream = TestStream::new().await;
    let sender = Sender::start(&pool, "through-failover", &stream).await;
    let outbox = sender.outbox.clone();
    let (stop_downstream, stopping) = tokio::sync::oneshot::channel();
    let consuming = downstream(receiving.clone(), &stream, stopping);
    let (heard, listener) = hear_the_commit_lane(&outbox);

    let outcomes = Arc::new(Mutex::new(Outcomes::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let writers = spawn_writers(&outbox, &outcomes, &stop);
    let before = acked_beyond(&outcomes, 0).await;
    assert!(before, "the writers publish before the failover");
    primary.kill();
    let acked_at_kill = acked(&outcomes);
    standby.promote().await;
    front.retarget(local(standby.port()));
    let after = acked_beyond(&outcomes, acked_at_kill).await;
    assert!(
        after,
        "the writers publish on the promoted server, through the same address"
    );
    stop_writers(&stop, writers).await;

    let promoted = pool_on(&standby.url(), 2).await;
    let stored = caught_up_on_the_promoted_server(&promoted, &outbox).await;
    let outcomes = std::mem::take(&mut *outcomes.lock().expect("outcomes"));
    assert_what_the_writers_were_told_holds(&promoted, &outbox, &outcomes).await;
    assert_exactly_once(&promoted).await;
    check_log(&promoted, &ORDO)
        .await
        .expect("the commit log's invariants on the promoted server");

    assert_downstream_holds_the_promoted_lane(&receiving, &promoted).await;
    let _ = stop_downstream.send(());
    consuming.await.expect("the adapter");

    // The listener in the writers' process: each stored event once, at dense positions.
    let all_heard = common::eventually(PATIENCE, || async {
        heard.lock().expect("heard").len() >= stored.len()
    })
    .await;
    listener.abort();
    sender.shutdown().await;
    let seen = heard.lock().expect("heard").clone();
    assert_heard_each_stored_event_once(all_heard, &seen, &stored);
    eprintln!(
        "failover: {} acknowledged ({acked_at_kill} before the kill), {} refused, {} in doubt, {} stored",
        outcomes.acked.len(),
        outcomes.refused.len(),
        outcomes.in_doubt.len(),
        stored.len()
    );
    pool.close().await;
    promoted.close().await;
    receiving.close().await;
}

/// What a listener heard: (position, event id), in the order it heard them.
type Heard = Arc<Mutex<Vec<(u64, Uuid)>>>;

/// A listener of `outbox`'s commit lane from the beginning, recording (position, event id) of
/// every event it hears; it fails the test if a read fails across the failover.
fn hear_the_commit_lane(outbox: &Outbox<Note>) -> (Heard, tokio::task::JoinHandle<()>) {
    let mut committed = outbox.listen_committed(Start::Beginning);
    let heard: Heard = Arc::new(Mutex::new(Vec::new()));
    let hearing = Arc::clone(&heard);
    let listener = tokio::spawn(async move {
        while let Some(event) = committed.next().await {
            let event = event.expect("the commit lane fails no read across the failover");
            let entry = (event.commit_sequence.get(), event.event.id);
            hearing.lock().expect("heard").push(entry);
        }
    });
    (heard, listener)
}

/// Waits until the writers have [`ACKED_EACH_SIDE`] events acknowledged beyond `since`.
async fn acked_beyond(outcomes: &Mutex<Outcomes>, since: usize) -> bool {
    common::eventually(PATIENCE, || async {
        acked(outcomes) >= since + ACKED_EACH_SIDE
    })
    .await
}

/// Stops the writers and waits for each to end.
async fn stop_writers(stop: &AtomicBool, writers: Vec<tokio::task::JoinHandle<()>>) {
    stop.store(true, AtomicOrdering::SeqCst);
    for writer in writers {
        writer.await.expect("a writer");
    }
}

/// The events the promoted server stores as committed, by sequence, once the subscription's
/// projection and the commit lane of `outbox` have caught up with them.
async fn caught_up_on_the_promoted_server(promoted: &PgPool, outbox: &Outbox<Note>) -> Vec<Uuid> {
    let stored: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM ordo.events WHERE commit_xid IS NOT NULL ORDER BY sequence",
    )
    .fetch_all(promoted)
    .await
    .expect("the stored events");
    let caught_up = common::eventually(PATIENCE, || async {
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM projection")
            .fetch_one(promoted)
            .await
            .unwrap_or(0);
        rows as usize >= stored.len() && outbox.commit_head().get() as usize >= stored.len()
    })
    .await;
    assert!(
        caught_up,
        "the subscription and the commit lane catch up on the promoted server"
    );
    stored
}

/// Every acknowledged event is stored once; no refused one is; an in-doubt commit, asked now,
/// is answered by what the server holds.
async fn assert_what_the_writers_were_told_holds(
    promoted: &PgPool,
    outbox: &Outbox<Note>,
    outcomes: &Outcomes,
) {
    let acked_copies = copies(promoted, &outcomes.acked).await;
    assert_eq!(
        acked_copies.len(),
        outcomes.acked.len(),
        "an acknowledged event is missing from the promoted server"
    );
    assert!(
        acked_copies.iter().all(|(_, n)| *n == 1),
        "an acknowledged event is stored twice"
    );
    assert!(
        copies(promoted, &outcomes.refused).await.is_empty(),
        "an event whose commit() failed is stored"
    );
    for (xid, ids) in &outcomes.in_doubt {
        let status = outbox.commit_status(*xid, ids).await.expect("ask");
        let held = copies(promoted, ids).await.len();
        match status {
            CommitStatus::Committed => assert_eq!(held, ids.len(), "{xid} said committed"),
            CommitStatus::Aborted => assert_eq!(held, 0, "{xid} said aborted"),
            other => panic!("{xid} still {other:?} after the failover"),
        }
    }
}

/// Downstream: each stored event once, at its position on the promoted server.
async fn assert_downstream_holds_the_promoted_lane(receiving: &PgPool, promoted: &PgPool) {
    let on_promoted = commit_lane_of(promoted).await;
    let relayed = common::eventually(PATIENCE, || async {
        downstream_rows(receiving).await.len() >= on_promoted.len()
    })
    .await;
    let rows = downstream_rows(receiving).await;
    assert!(
        relayed,
        "downstream holds {} of {} events",
        rows.len(),
        on_promoted.len()
    );
    assert_eq!(
        rows, on_promoted,
        "downstream holds the promoted commit lane, each event once"
    );
}

/// What a listener `seen` (`all_heard`: as many as were `stored`): each stored event once, at
/// dense positions.
fn assert_heard_each_stored_event_once(all_heard: bool, seen: &[(u64, Uuid)], stored: &[Uuid]) {
    assert!(
        all_heard,
        "the listener heard {} of {} events",
        seen.len(),
        stored.len()
    );
    let positions: Vec<u64> = seen.iter().map(|(p, _)| *p).collect();
    let dense: Vec<u64> = (1..=seen.len() as u64).collect();
    assert_eq!(
        positions, dense,
        "the commit lane went back or skipped across the failover"
    );
    let ids: BTreeSet<Uuid> = seen.iter().map(|(_, id)| *id).collect();
    assert_eq!(ids.len(), seen.len(), "the commit lane repeated an event");
    assert_eq!(
        ids,
        stored.iter().copied().collect::<BTreeSet<_>>(),
        "the commit lane delivered what the promoted server holds"
    );
}

/// The transaction id of the events `ids` on `pool`.
async fn xid_of(pool: &PgPool, id: Uuid) -> i64 {
    sqlx::query_scalar("SELECT commit_xid FROM ordo.events WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("the event's commit_xid")
}

/// Publishes one event and returns its id and its transaction's id.
async fn publish_one(outbox: &Outbox<Note>, n: u32) -> (Uuid, i64) {
    let mut tx = outbox.begin().await.expect("begin");
    let id = tx.publish(Note { writer: 0, n }).expect("publish");
    tx.commit().await.expect("commit");
    (id, xid_of(outbox.pool(), id).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_doubt_commit_is_answered_by_what_the_promoted_server_holds() {
    let Some(primary) = Cluster::create("ordo_fo_doubt_p", 5493, &[]) else {
        return;
    };
    let setup = pool_on(&primary.url(), 2).await;
    ordo::migrate(&setup).await.expect("migrate");
    // The standby streams through a proxy, so that its replication can be cut.
    let replication = TcpFault::start(local(primary.port())).await;
    let standby = Cluster::standby_of(&primary, replication.addr().port(), "ordo_fo_doubt_s", 5494);
    wait_for_standby(&setup, "ordo_fo_doubt_s", "async").await;

    let front = TcpFault::start(local(primary.port())).await;
    let pool = pool_on(&format!("postgres://postgres@{}/postgres", front.addr()), 4).await;
    let outbox = Outbox::<Note>::new(pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");

    // Committed, and received by the standby.
    let (kept, kept_xid) = publish_one(&outbox, 1).await;
    let standby_pool = pool_on(&standby.url(), 1).await;
    let received = common::eventually(PATIENCE, || async {
        !copies(&standby_pool, &[kept]).await.is_empty()
    })
    .await;
    assert!(received, "the standby replays the first transaction");
    standby_pool.close().await;

    // Committed on the primary after its standby stopped receiving: lost at the failover.
    replication.set(common::tcp_fault::Fault::Cut);
    let (lost, lost_xid) = publish_one(&outbox, 2).await;
    // Running when the primary dies, with an xid the standby never saw.
    let mut open = setup.begin().await.expect("begin");
    let open_xid: i64 = sqlx::query_scalar("SELECT pg_current_xact_id()::text::bigint")
        .fetch_one(&mut *open)
        .await
        .expect("take an xid");

    primary.kill();
    drop(open);
    standby.promote().await;
    front.retarget(local(standby.port()));

    let ask = |xid: i64, ids: Vec<Uuid>| {
        let outbox = outbox.clone();
        async move {
            let mut last = None;
            // The pool's connections to the dead primary fail first, then it reconnects.
            for _ in 0..100 {
                match outbox.commit_status(xid, &ids).await {
                    Ok(status) => return status,
                    Err(error) => last = Some(error),
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("commit_status({xid}, ids) kept failing: {last:?}");
        }
    };
    assert_eq!(ask(kept_xid, vec![kept]).await, CommitStatus::Committed);
    assert_eq!(ask(lost_xid, vec![lost]).await, CommitStatus::Aborted);
    assert_eq!(
        ask(open_xid, vec![Uuid::now_v7()]).await,
        CommitStatus::Aborted
    );

    // The promoted server gives the lost transactions' ids again, to transactions that commit.
    let promoted = pool_on(&standby.url(), 1).await;
    let reached = take_xids_until(&promoted, lost_xid.max(open_xid)).await;
    assert!(reached, "the promoted server reaches the lost xids");
    // A bare xid now names another transaction (the promoted server's), whose fate
    // `pg_xact_status` reports; the events say this one is not in the promoted history.
    assert_eq!(ask(lost_xid, vec![lost]).await, CommitStatus::Aborted);
    assert_eq!(
        ask(open_xid, vec![Uuid::now_v7()]).await,
        CommitStatus::Aborted
    );
    assert_eq!(ask(kept_xid, vec![kept]).await, CommitStatus::Committed);

    outbox.shutdown().await;
    pool.close().await;
    promoted.close().await;
    setup.close().await;
}

/// What `Error::CommitInDoubt` says to do, done as its message and docs say: ask
/// `Outbox::commit_status` with the error's fields, with a backoff, until it says committed or
/// aborted.
async fn documented_answer(outbox: &Outbox<Note>, xid: i64, event_ids: &[Uuid]) -> CommitStatus {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match outbox.commit_status(xid, event_ids).await {
            Ok(status @ (CommitStatus::Committed | CommitStatus::Aborted)) => return status,
            other => assert!(
                tokio::time::Instant::now() < deadline,
                "commit_status({xid}, ids) kept answering {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A `commit()` in doubt on a primary whose asynchronous standby never received it; the
/// standby is promoted and gives the transaction's id to a transaction of its own, which
/// commits. What the error says to ask answers `Aborted`, so the caller retries, and the retry
/// (same ids) stores each event once. (The xid alone, `pg_xact_status`, says committed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_doubt_commit_lost_at_an_asynchronous_failover_is_retried_the_documented_way() {
    let Some(primary) = Cluster::create("ordo_h2_doubt_p", 5501, &[]) else {
        return;
    };
    let setup = pool_on(&primary.url(), 2).await;
    ordo::migrate(&setup).await.expect("migrate");
    let replication = TcpFault::start(local(primary.port())).await;
    let standby = Cluster::standby_of(&primary, replication.addr().port(), "ordo_h2_doubt_s", 5502);
    wait_for_standby(&setup, "ordo_h2_doubt_s", "async").await;

    // The outbox reaches the address that follows the primary through a proxy that can lose
    // the answer to a `COMMIT`.
    let front = TcpFault::start(local(primary.port())).await;
    let breaker = Proxy::start(&format!("postgres://postgres@{}/postgres", front.addr())).await;
    let pool = pool_on(&breaker.url, 4).await;
    let outbox = Outbox::<Note>::new(pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");

    // The standby stops receiving; the primary commits, the answer is lost and the server
    // cannot be asked: in doubt.
    replication.set(Fault::Cut);
    let (error, xid, event_ids) = commit_in_doubt(&outbox, &breaker).await;
    let on_primary = common::eventually(PATIENCE, || async {
        copies(&setup, &event_ids).await.len() == 1
    })
    .await;
    assert!(on_primary, "the primary committed the in-doubt transaction");

    primary.kill();
    standby.promote().await;
    front.retarget(local(standby.port()));
    breaker.restore();

    // The promoted server never received it, and gives its id to a transaction of its own,
    // which commits.
    let promoted = pool_on(&standby.url(), 1).await;
    let reached = take_xids_until(&promoted, xid).await;
    assert!(reached, "the promoted server reaches the in-doubt xid");
    let reused = common::eventually(PATIENCE, || async {
        let fate: Option<String> =
            sqlx::query_scalar("SELECT pg_xact_status($1::bigint::text::xid8)")
                .bind(xid)
                .fetch_one(&promoted)
                .await
                .expect("pg_xact_status");
        fate.as_deref() == Some("committed")
    })
    .await;
    assert!(
        reused,
        "the promoted server committed a transaction of its own as {xid}"
    );
    assert!(copies(&promoted, &event_ids).await.is_empty());

    // The error names the call to make; made as documented, it says to retry.
    let said = error.to_string();
    assert!(
        said.contains(&format!("Outbox::commit_status({xid}, &event_ids)")),
        "the message names the documented call: {said}"
    );
    assert_eq!(
        documented_answer(&outbox, xid, &event_ids).await,
        CommitStatus::Aborted,
        "the documented way says the events are not stored"
    );

    retry_with_the_same_ids(&outbox, &event_ids).await;
    let stored = copies(&promoted, &event_ids).await;
    assert_eq!(stored.len(), event_ids.len());
    assert!(stored.iter().all(|(_, count)| *count == 1));

    outbox.shutdown().await;
    pool.close().await;
    promoted.close().await;
    setup.close().await;
}

/// A transaction of one event whose `COMMIT` the primary carries out while `breaker` loses
/// the answer and leaves the server unreachable: the error, its xid and its event ids.
async fn commit_in_doubt(outbox: &Outbox<Note>, breaker: &Proxy) -> (Error, i64, Vec<Uuid>) {
    let mut tx = outbox.begin().await.expect("begin");
    sqlx::query(sqlx::AssertSqlSafe(format!("SELECT '{MARKER}'")))
        .execute(&mut *tx)
        .await
        .expect("mark the connection");
    tx.publish(Note { writer: 0, n: 1 }).expect("publish");
    breaker.arm_then_unreachable(CommitFault::DropAfter);
    let error = tx.commit().await.expect_err("the answer to COMMIT is lost");
    let (xid, event_ids) = match &error {
        Error::CommitInDoubt { xid, event_ids, .. } => (*xid, event_ids.clone()),
        other => panic!("expected CommitInDoubt, got {other:?}"),
    };
    (error, xid, event_ids)
}

/// Takes transaction ids on `pool` (at most 10,000) until one is `target` or later: whether it
/// got there.
async fn take_xids_until(pool: &PgPool, target: i64) -> bool {
    for _ in 0..10_000 {
        let xid: i64 = sqlx::query_scalar("SELECT pg_current_xact_id()::text::bigint")
            .fetch_one(pool)
            .await
            .expect("take an xid on the promoted server");
        if xid >= target {
            return true;
        }
    }
    false
}

/// The documented retry, with the same ids: publishes each of `event_ids` again in one
/// transaction and commits it. (`begin` refuses while the outbox starts again from what the
/// promoted server holds.)
async fn retry_with_the_same_ids(outbox: &Outbox<Note>, event_ids: &[Uuid]) {
    let mut began = None;
    for _ in 0..600 {
        match outbox.begin().await {
            Ok(tx) => {
                began = Some(tx);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let mut retry = began.expect("begin on the promoted server");
    for (n, id) in event_ids.iter().enumerate() {
        retry
            .publish_with_id(
                *id,
                Note {
                    writer: 0,
                    n: n as u32 + 1,
                },
                ordo::Headers::new(),
            )
            .expect("publish");
    }
    retry.commit().await.expect("the retry commits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_that_loses_transactions_is_reported_and_drops_no_new_event() {
    let Some(primary) = Cluster::create("ordo_fo_loss_p", 5496, &[]) else {
        return;
    };
    let setup = pool_on(&primary.url(), 2).await;
    ordo::migrate(&setup).await.expect("migrate");
    projection_table(&setup).await;
    let replication = TcpFault::start(local(primary.port())).await;
    let standby = Cluster::standby_of(&primary, replication.addr().port(), "ordo_fo_loss_s", 5497);
    wait_for_standby(&setup, "ordo_fo_loss_s", "async").await;
    let Some((_receiver, receiving)) = receiver("ordo_fo_loss_b", 5498).await else {
        return;
    };

    let front = TcpFault::start(local(primary.port())).await;
    let pool = pool_on(&format!("postgres://postgres@{}/postgres", front.addr()), 8).await;
    let stream = TestStream::new().await;
    let sender = Sender::start(&pool, "through-loss", &stream).await;
    let outbox = sender.outbox.clone();
    let (follower, followed, following) = follow_without_folding(&pool).await;
    let (stop_downstream, stopping) = tokio::sync::oneshot::channel();
    let consuming = downstream(receiving.clone(), &stream, stopping);

    let outcomes = Arc::new(Mutex::new(Outcomes::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let writers = spawn_writers(&outbox, &outcomes, &stop);
    let head_before = commit_what_the_standby_never_receives(
        &outcomes,
        &replication,
        &outbox,
        &receiving,
        &followed,
    )
    .await;

    let mut listener = outbox.listen_committed(Start::Beginning);
    primary.kill();
    standby.promote().await;
    front.retarget(local(standby.port()));
    // The outbox finds the promoted server below what its lanes passed: its listeners end
    // with the error, writers are refused while its lanes start again from what the promoted
    // server holds, and then everything goes on in the same process, nothing restarted.
    assert_ends_with_the_rewind(&mut listener).await;
    // The follower too, instead of skipping the positions given again.
    let ended = tokio::time::timeout(PATIENCE, following)
        .await
        .expect("the follower's listener ends")
        .expect("the follower's listener");
    eprintln!("loss: the follower's listener ended: {ended:?}");
    assert!(
        matches!(ended, Some(Error::ServerRewound { .. })),
        "the follower's listener ends with the rewind: {ended:?}"
    );
    let acked_at_kill = acked(&outcomes);
    let after = acked_beyond(&outcomes, acked_at_kill).await;
    assert!(after, "the same writers publish on the promoted server");
    stop_writers(&stop, writers).await;
    let rewound = outcomes.lock().expect("outcomes").rewound.clone();
    eprintln!("loss: writers were told while the outbox started again: {rewound:?}");
    assert_a_new_listener_reads_from_the_start(&follower).await;
    follower.shutdown().await;

    let promoted = pool_on(&standby.url(), 2).await;
    let (stored, on_promoted) = folded_on_the_promoted_server(&promoted).await;
    let outcomes = std::mem::take(&mut *outcomes.lock().expect("outcomes"));
    let lost = outcomes.acked.len() as i64 - copies(&promoted, &outcomes.acked).await.len() as i64;
    eprintln!(
        "loss: {} acknowledged, {lost} of them lost; head before the kill {head_before}, \
         promoted log {} entries, {stored} stored",
        outcomes.acked.len(),
        on_promoted.len()
    );
    assert!(
        lost > 0,
        "the cut lost acknowledged transactions (else this test proves nothing)"
    );
    assert_the_subscription_has_each_stored_event_once(&promoted, stored).await;

    let (rows, promoted_ids) =
        downstream_has_every_promoted_event(&receiving, &promoted, &on_promoted).await;
    assert_the_rewind_is_reported(&promoted, &receiving, head_before, &rows, &promoted_ids).await;

    let _ = stop_downstream.send(());
    consuming.await.expect("the adapter");
    sender.shutdown().await;
    pool.close().await;
    promoted.close().await;
    receiving.close().await;
    setup.close().await;
}

/// A second process that does not fold, reading the commit lane from the folding one's
/// appends: it learns of the loss only from what it reads of the promoted server. Its outbox,
/// the last position its listener read, and the listener's task, which ends with the error
/// that ended the stream (`None` if it ended without one).
async fn follow_without_folding(
    pool: &PgPool,
) -> (
    Outbox<Note>,
    Arc<AtomicU64>,
    tokio::task::JoinHandle<Option<Error>>,
) {
    let follower = Outbox::<Note>::new(pool.clone(), OutboxConfig::default().sequencer(false))
        .await
        .expect("the follower");
    let followed = Arc::new(AtomicU64::new(0));
    let following = tokio::spawn({
        let mut stream = follower.listen_committed(Start::Beginning);
        let followed = Arc::clone(&followed);
        async move {
            while let Some(event) = stream.next().await {
                match event {
                    Ok(event) => {
                        followed.store(event.commit_sequence.get(), AtomicOrdering::SeqCst)
                    }
                    Err(error) => return Some(error),
                }
            }
            None
        }
    });
    (follower, followed, following)
}

/// Kept: events the standby received. Then its replication is cut, and what follows is
/// committed and relayed downstream (and read by the follower), but never reaches it. The
/// commit head before the kill.
async fn commit_what_the_standby_never_receives(
    outcomes: &Mutex<Outcomes>,
    replication: &TcpFault,
    outbox: &Outbox<Note>,
    receiving: &PgPool,
    followed: &AtomicU64,
) -> u64 {
    let kept = acked_beyond(outcomes, 0).await;
    assert!(kept, "the writers publish");
    replication.set(common::tcp_fault::Fault::Cut);
    let acked_at_cut = acked(outcomes);
    let doomed = acked_beyond(outcomes, acked_at_cut).await;
    assert!(doomed, "the writers publish after the cut");
    let head_before = outbox.commit_head().get();
    let relayed = common::eventually(PATIENCE, || async {
        downstream_rows(receiving).await.len() as u64 >= head_before
    })
    .await;
    assert!(
        relayed,
        "downstream holds every position up to {head_before} before the kill"
    );
    let read = common::eventually(PATIENCE, || async {
        followed.load(AtomicOrdering::SeqCst) >= head_before
    })
    .await;
    assert!(
        read,
        "the follower reads every position up to {head_before} before the kill"
    );
    head_before
}

/// `listener` ends with `Error::ServerRewound`, and then the stream is over.
async fn assert_ends_with_the_rewind(listener: &mut CommitStream<Note>) {
    let ended = tokio::time::timeout(PATIENCE, async {
        while let Some(event) = listener.next().await {
            if let Err(error) = event {
                return Some(error);
            }
        }
        None
    })
    .await
    .expect("the listener ends");
    assert!(
        matches!(ended, Some(Error::ServerRewound { .. })),
        "the listener ends with the rewind: {ended:?}"
    );
    assert!(listener.next().await.is_none(), "then the stream is over");
}

/// A listener opened now on `follower` reads the promoted server's lane, from its start.
async fn assert_a_new_listener_reads_from_the_start(follower: &Outbox<Note>) {
    let mut resumed = follower.listen_committed(Start::Beginning);
    let first = tokio::time::timeout(PATIENCE, resumed.next())
        .await
        .expect("the follower's new listener hears")
        .expect("open")
        .expect("an event");
    assert_eq!(first.commit_sequence.get(), 1, "from the start of the lane");
}

/// How many committed events the promoted server stores, and its commit lane once it covers
/// them all.
async fn folded_on_the_promoted_server(promoted: &PgPool) -> (i64, Vec<(i64, String)>) {
    let stored: i64 =
        sqlx::query_scalar("SELECT count(*) FROM ordo.events WHERE commit_xid IS NOT NULL")
            .fetch_one(promoted)
            .await
            .expect("count");
    // The last transactions may still be on their way into the log: read it once it holds
    // every stored event, or a survivor not yet folded counts as lost below.
    let folded = common::eventually(PATIENCE, || async {
        commit_lane_of(promoted).await.len() as i64 >= stored
    })
    .await;
    assert!(
        folded,
        "the promoted server's log covers its {stored} events"
    );
    (stored, commit_lane_of(promoted).await)
}

/// The subscription on the promoted server: every event it holds, once.
async fn assert_the_subscription_has_each_stored_event_once(promoted: &PgPool, stored: i64) {
    let caught_up = common::eventually(PATIENCE, || async {
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM projection")
            .fetch_one(promoted)
            .await
            .unwrap_or(0);
        rows >= stored
    })
    .await;
    assert!(
        caught_up,
        "the subscription catches up on the promoted server"
    );
    assert_exactly_once(promoted).await;
    check_log(promoted, &ORDO)
        .await
        .expect("the commit log's invariants on the promoted server");
}

/// Downstream: every event the promoted server holds, each once (by id: an event that
/// survived may sit at another position on the new history than where it was handled). What
/// downstream holds, and the ids of the promoted server's lane.
async fn downstream_has_every_promoted_event(
    receiving: &PgPool,
    promoted: &PgPool,
    on_promoted: &[(i64, String)],
) -> (Vec<(i64, String)>, BTreeSet<String>) {
    let promoted_ids: BTreeSet<String> = on_promoted.iter().map(|(_, id)| id.clone()).collect();
    let all_new = common::eventually(PATIENCE, || async {
        let have: BTreeSet<String> = downstream_rows(receiving)
            .await
            .into_iter()
            .map(|(_, id)| id)
            .collect();
        promoted_ids.is_subset(&have)
    })
    .await;
    let rows = downstream_rows(receiving).await;
    let have: BTreeSet<String> = rows.iter().map(|(_, id)| id.clone()).collect();
    eprintln!(
        "loss: downstream holds {} rows; {} of the promoted server's events missing",
        rows.len(),
        promoted_ids.difference(&have).count()
    );
    if !all_new {
        // What the relay and the inbox hold, for whoever reads the failure.
        let relay: Vec<(i64, Option<String>, String, Option<String>)> = sqlx::query_as(
            "SELECT position, lease_owner::text, status, last_error FROM ordo.subscriptions",
        )
        .fetch_all(promoted)
        .await
        .unwrap_or_default();
        let histories: Vec<(i64, i64)> =
            sqlx::query_as("SELECT history, from_commit_seq FROM ordo.commit_histories")
                .fetch_all(promoted)
                .await
                .unwrap_or_default();
        let marks = ordo::inbox::list_watermarks(receiving, Some("fo-downstream"))
            .await
            .map(|m| ordo::admin::watermarks_table(&m))
            .unwrap_or_default();
        eprintln!("loss: rows {relay:?}; histories {histories:?}; downstream marks:\n{marks}");
    }
    assert!(all_new, "downstream dropped events of the promoted server");
    assert_eq!(have.len(), rows.len(), "downstream handled an event twice");
    (rows, promoted_ids)
}

/// The rewind, reported by the downstream inbox: from where the promoted server's history
/// began to the mark before the kill (`head_before`), naming the history before; and what
/// downstream holds beyond the promoted lane (`rows` not in `promoted_ids`) are the lost
/// events, at rewound positions.
async fn assert_the_rewind_is_reported(
    promoted: &PgPool,
    receiving: &PgPool,
    head_before: u64,
    rows: &[(i64, String)],
    promoted_ids: &BTreeSet<String>,
) {
    let (newest, timeline, began): (i64, i32, i64) = sqlx::query_as(
        "SELECT history, timeline, from_commit_seq FROM ordo.commit_histories \
         ORDER BY history DESC LIMIT 1",
    )
    .fetch_one(promoted)
    .await
    .expect("the promoted history");
    assert!(timeline >= 2, "the promotion started a new timeline");
    let (older,): (i64,) =
        sqlx::query_as("SELECT max(history) FROM ordo.commit_histories WHERE history < $1")
            .bind(newest)
            .fetch_one(promoted)
            .await
            .expect("the history before it");
    let (from, through, old_history, history): (
        Option<i64>,
        Option<i64>,
        Option<i64>,
        Option<i64>,
    ) = sqlx::query_as(
        "SELECT rewound_from, rewound_through, rewound_history, history \
             FROM ordo.inbox_watermarks WHERE consumer = 'fo-downstream'",
    )
    .fetch_one(receiving)
    .await
    .expect("the watermark");
    assert_eq!(
        from,
        Some(began),
        "the rewind begins where the new history does"
    );
    let through = through.expect("the rewind's end");
    assert!(
        through >= head_before as i64,
        "the rewind reaches the mark before the kill"
    );
    // The history the inbox last held before the rewind: one older than the newest. Which one
    // depends on timing: the promotion's new timeline begins a history, and the outbox that
    // detects the rewind may begin another before the relay sends under the first.
    let older_histories: Vec<i64> =
        sqlx::query_scalar("SELECT history FROM ordo.commit_histories WHERE history < $1")
            .bind(newest)
            .fetch_all(promoted)
            .await
            .expect("the histories before it");
    assert!(
        old_history.is_some_and(|old| older_histories.contains(&old)),
        "the rewind names a history before the newest: {old_history:?}, not in {older_histories:?} (the latest of them {older})"
    );
    assert_eq!(history, Some(newest));
    let marks = ordo::inbox::list_watermarks(receiving, Some("fo-downstream"))
        .await
        .expect("the watermarks");
    let shown = ordo::admin::watermarks_table(&marks);
    assert!(
        shown.contains(&format!("positions {began} to {through} were given again")),
        "ordo inbox watermarks shows the rewind: {shown}"
    );
    let lost_downstream: Vec<&(i64, String)> = rows
        .iter()
        .filter(|(_, id)| !promoted_ids.contains(id))
        .collect();
    assert!(
        !lost_downstream.is_empty(),
        "downstream had handled events that were lost"
    );
    assert!(
        lost_downstream
            .iter()
            .all(|(p, _)| (began..=through).contains(p)),
        "downstream holds a lost event outside the rewind"
    );
    eprintln!("loss: rewind reported: positions {began}..={through} of history {older}");
}
