//! Commit-lane listeners that take this process's own transactions at the positions its
//! sequencer computed, before the append that logs them: the log then gives them the same
//! positions, a difference is reported as a rewind, and with the setting off a listener waits
//! for the append.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::Duration;

use common::invariants::{ORDO, check_log, counts, log_reaches, stored_head};
use common::{Note, TestDb, eventually, write_with_rollbacks};
use futures::StreamExt;
use ordo::{CommitStream, Outbox, OutboxConfig, Start};
use sqlx::{PgPool, Row};
use tokio::time::timeout;

const PATIENCE: Duration = Duration::from_secs(30);

/// A position as a listener had it: (commit sequence, event sequence, boundary).
type Heard = (u64, u64, bool);

async fn outbox_on(pool: &PgPool, config: OutboxConfig) -> Outbox<Note> {
    Outbox::new(pool.clone(), config)
        .await
        .expect("start the outbox")
}

async fn commit(outbox: &Outbox<Note>, writer: u32, events: u32) {
    let mut tx = outbox.begin().await.expect("begin");
    for n in 0..events {
        tx.publish(Note { writer, n }).expect("publish");
    }
    tx.commit().await.expect("commit");
}

async fn next(stream: &mut CommitStream<Note>) -> Heard {
    let item = timeout(PATIENCE, stream.next())
        .await
        .expect("the listener has the event in time")
        .expect("the stream goes on")
        .expect("an event");
    (
        item.commit_sequence.get(),
        item.event.sequence.get(),
        item.boundary,
    )
}

/// The next `n` positions the listener has.
async fn next_n(stream: &mut CommitStream<Note>, n: usize) -> Vec<Heard> {
    let mut heard = Vec::with_capacity(n);
    for _ in 0..n {
        heard.push(next(stream).await);
    }
    heard
}

/// The log as stored, from position `after` on.
async fn logged(pool: &PgPool, after: u64) -> Vec<Heard> {
    sqlx::query(
        "SELECT commit_seq, sequence, group_last FROM ordo.commit_log WHERE commit_seq > $1 \
         ORDER BY commit_seq",
    )
    .bind(i64::try_from(after).expect("a small position"))
    .fetch_all(pool)
    .await
    .expect("read the log")
    .iter()
    .map(|row| {
        let position: i64 = row.get(0);
        let sequence: i64 = row.get(1);
        (
            u64::try_from(position).expect("positive"),
            u64::try_from(sequence).expect("positive"),
            row.get(2),
        )
    })
    .collect()
}

/// Holds the state row's lock in a transaction of its own: every append waits for it.
async fn hold_appends(pool: &PgPool) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut holder = pool.begin().await.expect("begin the holder");
    sqlx::query("SELECT 1 FROM ordo.sequencer_state FOR UPDATE")
        .execute(&mut *holder)
        .await
        .expect("lock the state row");
    holder
}

/// One transaction folded and heard, so that the sequencer runs and the listener is past it.
async fn warmed(db: &TestDb, config: OutboxConfig) -> (Outbox<Note>, CommitStream<Note>, u64) {
    let outbox = outbox_on(&db.pool, config).await;
    let mut stream = outbox.listen_committed(Start::Now);
    commit(&outbox, 0, 1).await;
    let (first, _, _) = next(&mut stream).await;
    let caught_up = log_reaches(&db.pool, first).await;
    assert!(caught_up, "the first transaction is logged");
    (outbox, stream, first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_has_its_own_commits_before_the_append_at_the_positions_the_log_gives_them() {
    let db = TestDb::new().await;
    let (outbox, mut stream, first) = warmed(&db, OutboxConfig::default()).await;
    let holder = hold_appends(&db.pool).await;
    // Three transactions of one, three and two events, committed while no append can land.
    for (writer, events) in [(1, 1), (2, 3), (3, 2)] {
        commit(&outbox, writer, events).await;
    }
    let heard = next_n(&mut stream, 6).await;
    let head = stored_head(&db.pool).await;
    assert_eq!(
        head, first,
        "the listener had all six while the log held none of them"
    );
    let positions: Vec<u64> = heard.iter().map(|(position, _, _)| *position).collect();
    assert_eq!(positions, (first + 1..=first + 6).collect::<Vec<_>>());
    let boundaries: Vec<bool> = heard.iter().map(|(_, _, last)| *last).collect();
    assert_eq!(
        boundaries,
        [true, false, false, true, false, true],
        "each transaction's last event ends its group"
    );

    holder.rollback().await.expect("let the appends through");
    let caught_up = log_reaches(&db.pool, first + 6).await;
    assert!(caught_up, "the appends land");
    assert_eq!(
        logged(&db.pool, first).await,
        heard,
        "the log gives every event the position, and the boundary, the listener had"
    );
    // Nothing was reported: the stream goes on with the next commit.
    commit(&outbox, 4, 1).await;
    let (after, _, _) = next(&mut stream).await;
    assert_eq!(after, first + 7);
    // The listener may have it before the log does.
    let caught_up = log_reaches(&db.pool, first + 7).await;
    assert!(caught_up, "the last append lands");
    check_log(&db.pool, &ORDO)
        .await
        .expect("the log's invariants");
    outbox.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_early_listeners_off_a_listener_waits_for_the_append() {
    let db = TestDb::new().await;
    let config = OutboxConfig::default().early_commit_listeners(false);
    let (outbox, mut stream, first) = warmed(&db, config).await;
    let holder = hold_appends(&db.pool).await;
    commit(&outbox, 1, 2).await;
    let released = Arc::new(AtomicBool::new(false));
    let release = {
        let released = Arc::clone(&released);
        async move {
            // Long enough for a promise to reach the listener, were one made.
            tokio::time::sleep(Duration::from_millis(300)).await;
            released.store(true, AtomicOrdering::SeqCst);
            holder.rollback().await.expect("let the appends through");
        }
    };
    let (heard, ()) = tokio::join!(next(&mut stream), release);
    assert!(
        released.load(AtomicOrdering::SeqCst),
        "the listener had position {} before the append could land",
        heard.0
    );
    assert!(stored_head(&db.pool).await >= heard.0);
    assert_eq!(heard.0, first + 1);
    outbox.shutdown().await;
}

/// A transaction that gains a row after ordo's insert (here from a deferred trigger, at
/// `COMMIT`) has more members than the commit knew: the position promised after it was the
/// wrong one. The append shows it, and it is reported as a rewind, not passed over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_larger_than_the_commit_knew_is_reported_as_a_rewind() {
    let db = TestDb::new().await;
    sqlx::raw_sql(
        "CREATE FUNCTION public.one_more() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN \
           INSERT INTO ordo.events (id, payload, headers) \
           VALUES (gen_random_uuid(), '{\"writer\": 99, \"n\": 0}', '{}'); \
           RETURN NULL; \
         END $$; \
         CREATE CONSTRAINT TRIGGER one_more AFTER INSERT ON ordo.events \
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW \
         WHEN ((NEW.payload ->> 'writer') = '7') EXECUTE FUNCTION public.one_more();",
    )
    .execute(&db.pool)
    .await
    .expect("the deferred trigger");
    let (outbox, mut stream, first) = warmed(&db, OutboxConfig::default()).await;
    let holder = hold_appends(&db.pool).await;
    // Writer 7's transaction gains writer 99's row at COMMIT; writer 8's comes after it.
    commit(&outbox, 7, 1).await;
    commit(&outbox, 8, 1).await;
    // The listener may have had the promised positions before the append showed them wrong.
    holder.rollback().await.expect("let the appends through");
    let mut ended = None;
    for _ in 0..3 {
        match timeout(PATIENCE, stream.next()).await.expect("in time") {
            Some(Ok(_)) => continue,
            other => {
                ended = Some(other);
                break;
            }
        }
    }
    assert!(
        matches!(ended, Some(Some(Err(ordo::Error::ServerRewound { .. })))),
        "the listener ends with the rewind: {ended:?}"
    );
    // The outbox starts again from the log the server holds, which has the three rows.
    let resumed = eventually(PATIENCE, || async {
        match outbox.begin().await {
            Ok(tx) => tx.rollback().await.is_ok(),
            Err(_) => false,
        }
    })
    .await;
    assert!(resumed, "the outbox starts again");
    let mut again = outbox.listen_committed(Start::After(ordo::CommitSequence::new(first)));
    let heard = next_n(&mut again, 3).await;
    assert_eq!(heard, logged(&db.pool, first).await);
    assert_eq!(
        heard.iter().map(|(_, _, last)| *last).collect::<Vec<_>>(),
        [false, true, true],
        "writer 7's group holds the trigger's row"
    );
    outbox.shutdown().await;
}

/// Three outboxes folding on one database, each with writers (rollbacks among them) and an
/// early listener: every listener hears exactly the log, position for position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_of_several_folding_outboxes_hear_exactly_the_log() {
    let db = TestDb::new().await;
    let mut outboxes = Vec::new();
    for _ in 0..3 {
        let pool = db.another_pool(4).await;
        outboxes.push(Arc::new(outbox_on(&pool, OutboxConfig::default()).await));
    }
    let mut streams: Vec<CommitStream<Note>> = outboxes
        .iter()
        .map(|outbox| outbox.listen_committed(Start::Beginning))
        .collect();
    let mut writers = Vec::new();
    for (o, outbox) in outboxes.iter().enumerate() {
        for w in 0..2u32 {
            let outbox = Arc::clone(outbox);
            let writer = u32::try_from(o).expect("few") * 10 + w;
            writers.push(tokio::spawn(async move {
                write_with_rollbacks(&outbox, writer, 60).await;
            }));
        }
    }
    for writer in writers {
        writer.await.expect("the writer ran");
    }
    let caught_up = eventually(PATIENCE, || async {
        let (real, logged) = counts(&db.pool).await;
        logged >= real
    })
    .await;
    assert!(caught_up, "the log holds every event");
    let log = logged(&db.pool, 0).await;
    for (i, stream) in streams.iter_mut().enumerate() {
        let mut heard = Vec::new();
        while heard.len() < log.len() {
            heard.push(next(stream).await);
        }
        assert_eq!(heard, log, "listener {i} heard the log");
    }
    check_log(&db.pool, &ORDO)
        .await
        .expect("the log's invariants");
    for outbox in outboxes {
        if let Ok(outbox) = Arc::try_unwrap(outbox) {
            outbox.shutdown().await;
        }
    }
}

/// The sequencer's append dies while it waits (its backend terminated): the sequencer restarts
/// from the state row and appends the same groups (no longer knowing them as its own, it
/// promises nothing again), the log gives them the positions the listener had, and nothing is
/// reported: the listener goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequencer_that_restarts_mid_append_keeps_the_positions_its_listener_had() {
    let db = TestDb::new().await;
    let (outbox, mut stream, first) = warmed(&db, OutboxConfig::default()).await;
    let holder = hold_appends(&db.pool).await;
    commit(&outbox, 1, 2).await;
    commit(&outbox, 2, 1).await;
    let heard = next_n(&mut stream, 3).await;
    // The append waiting on the lock is the sequencer's: end its connection.
    let ended = eventually(PATIENCE, || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock' \
             AND query LIKE '%append_commit_log%') AS t",
        )
        .fetch_one(&db.pool)
        .await
        .is_ok_and(|terminated| terminated > 0)
    })
    .await;
    assert!(ended, "the waiting append's backend is terminated");
    holder.rollback().await.expect("let the appends through");
    let caught_up = log_reaches(&db.pool, first + 3).await;
    assert!(caught_up, "the restarted sequencer appends them");
    assert_eq!(logged(&db.pool, first).await, heard);
    commit(&outbox, 3, 1).await;
    let (after, _, _) = next(&mut stream).await;
    assert_eq!(after, first + 4, "no rewind: the listener goes on");
    outbox.shutdown().await;
}

/// A listener that opens while the plan holds transactions committed before it (none promised,
/// no one listening then): the positions promised to it count those transactions too, and the
/// log gives every event the position the listener had. Then it closes, more commit unheard,
/// and a second listener hears them all in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_opens_mid_plan_has_the_positions_the_log_gives() {
    let db = TestDb::new().await;
    let (outbox, stream, first) = warmed(&db, OutboxConfig::default()).await;
    drop(stream);
    let holder = hold_appends(&db.pool).await;
    // Planned while no listener takes promises: the first goes into the blocked append, the
    // second waits behind it.
    commit(&outbox, 1, 2).await;
    commit(&outbox, 2, 1).await;
    let mut late = outbox.listen_committed(Start::After(ordo::CommitSequence::new(first)));
    commit(&outbox, 3, 1).await;
    let heard = next_n(&mut late, 4).await;
    assert_eq!(
        stored_head(&db.pool).await,
        first,
        "heard before any append"
    );
    drop(late);
    commit(&outbox, 4, 2).await;
    let mut again = outbox.listen_committed(Start::After(ordo::CommitSequence::new(first)));
    commit(&outbox, 5, 1).await;
    let all = next_n(&mut again, 7).await;
    assert_eq!(
        &all[..4],
        &heard[..],
        "the same positions to both listeners"
    );
    holder.rollback().await.expect("let the appends through");
    assert!(log_reaches(&db.pool, first + 7).await, "the appends land");
    assert_eq!(logged(&db.pool, first).await, all);
    commit(&outbox, 6, 1).await;
    assert_eq!(next(&mut again).await.0, first + 8, "no rewind: it goes on");
    outbox.shutdown().await;
}
