//! Two folding processes do not race for every append: the one that loses the compare-and-set
//! yields other processes' groups to the peer that committed them, reads what that peer
//! appended, and takes over when the peer stops. One test binary with its own metrics recorder
//! (recorders are process-wide).

mod common;

use std::time::Duration;

use common::counters::Counters;
use common::invariants::{ORDO, check_log};
use common::{Note, TestDb, eventually};
use metrics_util::debugging::DebuggingRecorder;
use ordo::{Outbox, OutboxConfig, metrics as names};

const PATIENCE: Duration = Duration::from_secs(60);

async fn publish(outbox: &Outbox<Note>, writer: u32, transactions: u32) {
    for n in 0..transactions {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish(Note { writer, n }).expect("publish");
        tx.commit().await.expect("commit");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_lost_yields_to_the_writers_process_and_takes_over_when_it_stops() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).expect("the only recorder of this binary");
    let db = TestDb::new().await;
    let writer = Outbox::<Note>::new(db.another_pool(4).await, OutboxConfig::default())
        .await
        .expect("the writer's outbox");
    let peer = Outbox::<Note>::new(db.another_pool(4).await, OutboxConfig::default())
        .await
        .expect("the peer's outbox");

    // The writer's process appends its own transactions at once; the peer learns of them
    // later, loses the race once, and from then on reads what the writer's process appended.
    publish(&writer, 0, 100).await;
    let both_at = |head: u64| {
        let (writer, peer) = (writer.clone(), peer.clone());
        async move {
            eventually(PATIENCE, || async {
                writer.commit_head().get() >= head && peer.commit_head().get() >= head
            })
            .await
        }
    };
    assert!(
        both_at(100).await,
        "the log did not reach 100 in both processes"
    );
    let mut totals = Counters::default();
    totals.add(&snapshotter);
    assert!(
        totals.get(names::FOLD_APPENDS, Some("left_to_peer")) > 0,
        "the peer never yielded to the writer's process: {totals:?}"
    );

    // The writer's process stops; a process that does not fold writes on. The peer's grace
    // runs out and it appends again.
    writer.shutdown().await;
    let plain = Outbox::<Note>::new(
        db.another_pool(2).await,
        OutboxConfig::default().sequencer(false),
    )
    .await
    .expect("a non-folding writer");
    publish(&plain, 1, 50).await;
    assert!(
        eventually(PATIENCE, || async { peer.commit_head().get() >= 150 }).await,
        "the peer did not take over: head {}",
        peer.commit_head()
    );
    if let Err(broken) = check_log(&db.pool, &ORDO).await {
        panic!("commit log invariant broken: {broken}");
    }
    totals.add(&snapshotter);
    assert_eq!(
        totals.get(names::FOLD_RESTARTS, None),
        2,
        "each folding process restarts once, at start; yielding is not a restart"
    );
    plain.shutdown().await;
    peer.shutdown().await;
}
