//! A server that crashed and started again, on the same history (no promotion), having lost
//! transactions it had acknowledged (writers with `synchronous_commit = off`) with their
//! appends: a peer folds new events into the lost positions before a process that had read
//! them reads the head again, so that process never sees the head go back nor a newer
//! history. It must notice the restart itself and find the positions given to other events.
//!
//! The server is a private cluster (`common::cluster`) restarted with `pg_ctlcluster stop -m
//! immediate` and `start`; the process that reads reaches it through a TCP proxy that is cut
//! until the loss and the peer's fold are made (by hand, in one transaction: which committed
//! transactions a real crash loses is up to the WAL writer's timing). Where postgresql-common
//! is absent, the test says so and passes.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::Note;
use common::cluster::Cluster;
use common::lost::{ends_with_rewind, goes_on_from_the_server, lose_by_hand};
use common::tcp_fault::{Fault, TcpFault};
use futures::StreamExt;
use ordo::{CommitStream, Outbox, OutboxConfig, Start};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::time::timeout;

const PATIENCE: Duration = Duration::from_secs(60);

async fn pool_on(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(2))
        .connect(url)
        .await
        .expect("connect to the private cluster")
}

async fn next_position(stream: &mut CommitStream<Note>) -> u64 {
    timeout(PATIENCE, stream.next())
        .await
        .expect("in time")
        .expect("open")
        .expect("an event, not an error")
        .commit_sequence
        .get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_that_lost_acknowledged_transactions_ends_a_reader_that_comes_back_after_a_peer_folded_past_and_it_goes_on()
 {
    let Some(server) = Cluster::create("ordo_restart_loss", 5489, &[]) else {
        return;
    };
    let direct = pool_on(&server.url()).await;
    ordo::migrate(&direct).await.expect("migrate");
    let front = TcpFault::start(SocketAddr::from(([127, 0, 0, 1], server.port()))).await;
    let folder: Outbox<Note> = Outbox::new(direct.clone(), OutboxConfig::default())
        .await
        .expect("the folding process");
    let through_front = pool_on(&format!("postgres://postgres@{}/postgres", front.addr())).await;
    let follower: Outbox<Note> =
        Outbox::new(through_front, OutboxConfig::default().sequencer(false))
            .await
            .expect("the process that reads");
    let mut followed = follower.listen_committed(Start::Beginning);
    for n in 0..30u32 {
        let mut tx = folder.begin().await.expect("begin");
        tx.publish(Note { writer: 1, n }).expect("publish");
        tx.commit().await.expect("commit");
    }
    let mut seen = 0;
    while seen < 30 {
        seen = next_position(&mut followed).await;
    }
    folder.shutdown().await;
    // The appends commit asynchronously: flushed now, so that the loss below is the one made.
    sqlx::query("CHECKPOINT")
        .execute(&direct)
        .await
        .expect("checkpoint");
    drop(direct);

    // The reader is cut off; the server crashes and starts again; the last appends and their
    // transactions are gone, and a peer folds 32 new events from the first lost position on.
    front.set(Fault::Cut);
    server.stop_immediate();
    server.start();
    let direct = pool_on(&server.url()).await;
    let from = lose_by_hand(&direct, true, 25, 32, None).await;
    assert!((1..=25).contains(&from), "the appends lost began at {from}");
    let timelines: i64 = sqlx::query_scalar("SELECT count(*) FROM ordo.commit_histories")
        .fetch_one(&direct)
        .await
        .expect("histories");
    assert_eq!(timelines, 1, "the same server history: no promotion");
    front.set(Fault::Pass);

    // The reader comes back to a head above every position it saw, on the history it knew:
    // only the restart tells it to check, and the positions it returned hold other events.
    ends_with_rewind(
        "the reader that came back",
        &mut followed,
        &format!("position {from}"),
        from,
        PATIENCE,
    )
    .await;
    // Then it goes on by itself, from what the server holds (no process folds here now).
    goes_on_from_the_server(
        "the reader that came back",
        &follower,
        &direct,
        from,
        false,
        PATIENCE,
    )
    .await;
    follower.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_that_lost_nothing_is_checked_and_both_processes_go_on_past_a_trimmed_bottom() {
    let Some(server) = Cluster::create("ordo_restart_clean", 5490, &[]) else {
        return;
    };
    let direct = pool_on(&server.url()).await;
    ordo::migrate(&direct).await.expect("migrate");
    let outbox: Outbox<Note> = Outbox::new(direct.clone(), OutboxConfig::default())
        .await
        .expect("the outbox");
    let follower: Outbox<Note> =
        Outbox::new(direct.clone(), OutboxConfig::default().sequencer(false))
            .await
            .expect("the process that reads");
    let mut folded = outbox.listen_committed(Start::Beginning);
    let mut followed = follower.listen_committed(Start::Beginning);
    for n in 0..20u32 {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish(Note { writer: 1, n }).expect("publish");
        tx.commit().await.expect("commit");
    }
    for stream in [&mut folded, &mut followed] {
        let mut seen = 0;
        while seen < 20 {
            seen = next_position(stream).await;
        }
    }

    // Retention took the bottom of the log (its first chunk, entries and events), which both
    // processes still hold in their caches: not a loss.
    let trimmed: i64 = sqlx::query_scalar(
        "WITH c AS (DELETE FROM ordo.commit_chunks WHERE first_commit_seq = 1
                    RETURNING last_commit_seq, sequences),
              e AS (DELETE FROM ordo.events AS e USING c WHERE e.sequence = ANY (c.sequences))
         SELECT last_commit_seq FROM c",
    )
    .fetch_one(&direct)
    .await
    .expect("trim the bottom of the log by hand");
    assert!(
        trimmed < 20,
        "a chunk below the head was trimmed: 1..={trimmed}"
    );

    // A restart with nothing lost: both processes check what they hold and go on.
    server.stop_immediate();
    server.start();
    let mut tx = None;
    for _ in 0..100 {
        match outbox.begin().await {
            Ok(begun) => {
                tx = Some(begun);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let mut tx = tx.expect("a transaction once the server is back");
    tx.publish(Note { writer: 2, n: 0 }).expect("publish");
    tx.commit().await.expect("commit after the restart");
    for (which, stream) in [("folding", &mut folded), ("reading", &mut followed)] {
        let position = next_position(stream).await;
        assert_eq!(
            position, 21,
            "the {which} process goes on at the next position"
        );
    }
    outbox.shutdown().await;
    follower.shutdown().await;
}
