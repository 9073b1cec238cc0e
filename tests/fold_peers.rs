//! Sequencers that lose the compare-and-set to a peer continue from what the peer appended:
//! a lost CAS is not a restart. One test binary with its own metrics recorder (recorders are
//! process-wide).

mod common;

use std::time::Duration;

/// How long the peers get to race, and to catch up.
const PATIENCE: Duration = Duration::from_secs(60);

use common::counters::Counters;
use common::invariants::{ORDO, check_log, counts};
use common::{Note, TestDb, eventually};
use metrics_util::debugging::DebuggingRecorder;
use ordo::{Outbox, OutboxConfig, metrics as names};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sequencers_losing_the_cas_follow_the_winner_without_restarting() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).expect("the only recorder of this binary");

    let db = TestDb::new().await;
    let mut peers = Vec::new();
    for _ in 0..3 {
        let pool = db.another_pool(4).await;
        let outbox = Outbox::<Note>::new(pool, OutboxConfig::default())
            .await
            .expect("outbox");
        peers.push(outbox);
    }
    let mut totals = Counters::default();
    // Write until peers have lost the CAS a good number of times (a race, so bounded by time).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut round = 0u32;
    while totals.get(names::FOLD_APPENDS, Some("refused")) < 20
        && tokio::time::Instant::now() < deadline
    {
        let mut writers = Vec::new();
        for writer in 0..6u32 {
            let outbox = peers[writer as usize % peers.len()].clone();
            writers.push(tokio::spawn(async move {
                for n in 0..20u32 {
                    let mut tx = outbox.begin().await.expect("begin");
                    tx.publish(Note {
                        writer,
                        n: round * 100 + n,
                    })
                    .expect("publish");
                    tx.commit().await.expect("commit");
                }
            }));
        }
        for writer in writers {
            writer.await.expect("writer");
        }
        totals.add(&snapshotter);
        round += 1;
    }
    let caught_up = eventually(PATIENCE, || async {
        let (real, logged) = counts(&db.pool).await;
        logged >= real
    })
    .await;
    assert!(caught_up, "the log did not catch up");
    if let Err(broken) = check_log(&db.pool, &ORDO).await {
        panic!("commit log invariant broken: {broken}");
    }
    totals.add(&snapshotter);
    assert!(
        totals.get(names::FOLD_APPENDS, Some("refused")) > 0,
        "the peers never lost a compare-and-set in {round} rounds: the test proved nothing"
    );
    assert_eq!(
        totals.get(names::FOLD_RESTARTS, None),
        3,
        "each sequencer restarts once, at start; {} refusals must not add restarts",
        totals.get(names::FOLD_APPENDS, Some("refused"))
    );
    for peer in peers {
        peer.shutdown().await;
    }
}
