//! While nobody waits for the commit log (no reader of logged positions in the process, every
//! planned group promised to its listeners, no other process on the wake-up channel), the
//! sequencer gathers appends `unwatched_append_spacing` apart; whoever starts waiting ends the
//! gathering at once, and a stopping outbox appends what it planned.
//!
//! The tests of what ends the gathering set the spacing to 60 s, the longest allowed, so that an
//! append they see within their patience came from what they check, not from the spacing
//! running out; the one under concurrent writers sets 25 ms, so that it gathers many times.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::invariants::{ORDO, check_log, counts, log_reaches, stored_head};
use common::{Note, TestDb, eventually, write_with_rollbacks};
use futures::StreamExt;
use ordo::{CommitStream, EventSequence, Outbox, OutboxConfig, Start};
use sqlx::PgPool;
use tokio::time::timeout;

/// Well inside the spacing: what arrives within it was not the spacing running out.
const PATIENCE: Duration = Duration::from_secs(20);
/// Longer than an outbox takes other processes to be there after it connects (it waits
/// 500 ms for the answers to its greeting): from then on, alone, it gathers.
const SETTLE: Duration = Duration::from_secs(2);
/// How long a test looks for an append that must not come: appends come within milliseconds
/// when someone waits.
const QUIET: Duration = Duration::from_millis(400);

fn gathering() -> OutboxConfig {
    OutboxConfig::default().unwatched_append_spacing(Duration::from_secs(60))
}

async fn alone(pool: &PgPool) -> Outbox<Note> {
    let outbox = Outbox::new(pool.clone(), gathering())
        .await
        .expect("start the outbox");
    settle(pool).await;
    outbox
}

/// Waits until the outbox's LISTEN connection is up, then [`SETTLE`]: until then it cannot tell
/// whether anyone else is there, and appends as if someone were.
async fn settle(pool: &PgPool) {
    let listening = eventually(PATIENCE, || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND query LIKE 'LISTEN%'",
        )
        .fetch_one(pool)
        .await
        .is_ok_and(|n| n > 0)
    })
    .await;
    assert!(listening, "the outbox listens on the wake-up channel");
    tokio::time::sleep(SETTLE).await;
}

async fn commit(outbox: &Outbox<Note>, n: u32) -> Vec<EventSequence> {
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(Note { writer: 1, n }).expect("publish");
    tx.commit().await.expect("commit")
}

async fn next(stream: &mut CommitStream<Note>) -> (u64, u32) {
    let item = timeout(PATIENCE, stream.next())
        .await
        .expect("the listener has the event in time")
        .expect("the stream goes on")
        .expect("an event");
    (item.commit_sequence.get(), item.event.payload.n)
}

/// The log's positions and their events' sequences in order, as stored.
async fn logged_events(pool: &PgPool) -> Vec<(u64, u64)> {
    let rows: Vec<(i64, i64)> =
        sqlx::query_as("SELECT commit_seq, sequence FROM ordo.commit_log ORDER BY commit_seq")
            .fetch_all(pool)
            .await
            .expect("read the log");
    rows.into_iter()
        .map(|(position, sequence)| {
            (
                u64::try_from(position).expect("positive"),
                u64::try_from(sequence).expect("positive"),
            )
        })
        .collect()
}

/// The log's positions in order, as stored.
async fn logged_positions(pool: &PgPool) -> Vec<u64> {
    logged_events(pool)
        .await
        .into_iter()
        .map(|(position, _)| position)
        .collect()
}

/// Commits the first transaction (appended at once: no append came before it) and waits for
/// the log to hold it; then commits `more`, heard by `listener` at once, which the log does not
/// hold within [`QUIET`]. Returns the sequences of the last one committed.
async fn gathered(
    db: &TestDb,
    outbox: &Outbox<Note>,
    listener: &mut CommitStream<Note>,
    more: u32,
) -> Vec<EventSequence> {
    commit(outbox, 0).await;
    assert_eq!(next(listener).await, (1, 0));
    assert!(
        log_reaches(&db.pool, 1).await,
        "the first append comes at once"
    );
    let mut last = Vec::new();
    for n in 1..=more {
        last = commit(outbox, n).await;
        assert_eq!(next(listener).await, (u64::from(n) + 1, n));
    }
    tokio::time::sleep(QUIET).await;
    assert_eq!(
        stored_head(&db.pool).await,
        1,
        "alone, with every group promised to the listener, the sequencer gathers"
    );
    last
}

/// A database with an outbox alone on it, its listener, and `more` transactions gathered
/// ([`gathered`]); with the sequences of the last one.
async fn gathering_alone(
    more: u32,
) -> (TestDb, Outbox<Note>, CommitStream<Note>, Vec<EventSequence>) {
    let db = TestDb::new().await;
    let outbox = alone(&db.pool).await;
    let mut listener = outbox.listen_committed(Start::Beginning);
    let last = gathered(&db, &outbox, &mut listener, more).await;
    (db, outbox, listener, last)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_the_log_ends_the_gathering_and_finds_the_positions_the_listener_had() {
    let (db, outbox, _listener, last) = gathering_alone(3).await;
    // Someone waits for the log: the append comes now, not when the spacing runs out.
    let positions = outbox
        .wait_for_commit(&last, PATIENCE)
        .await
        .expect("the log holds the last transaction within the patience");
    assert_eq!(
        positions.iter().map(|p| p.get()).collect::<Vec<_>>(),
        vec![4]
    );
    assert_eq!(logged_positions(&db.pool).await, vec![1, 2, 3, 4]);
    outbox.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_on_the_channel_ends_the_gathering() {
    let (db, outbox, _listener, _) = gathering_alone(2).await;
    // Another process connects (it reads the log, folding nothing): its greeting on the
    // wake-up channel is heard, and its relays or listeners would wait for the log.
    let reader = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default().sequencer(false))
        .await
        .expect("start a second outbox");
    assert!(
        log_reaches(&db.pool, 3).await,
        "the sequencer appends once someone else is there"
    );
    let mut theirs = reader.listen_committed(Start::Beginning);
    for (position, n) in [(1, 0), (2, 1), (3, 2)] {
        assert_eq!(next(&mut theirs).await, (position, n));
    }
    reader.shutdown().await;
    outbox.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_the_listener_has_no_promise_of_ends_the_gathering() {
    let (db, outbox, mut listener, _) = gathering_alone(2).await;
    // Published in the application's own transaction: ordo does not see its commit, so its
    // position is known only from the append, which the listener waits for.
    let mut tx = db.pool.begin().await.expect("begin");
    outbox
        .publish_in(&mut tx, [Note { writer: 2, n: 9 }])
        .await
        .expect("publish in the application's transaction");
    tx.commit().await.expect("commit");
    assert_eq!(next(&mut listener).await, (4, 9));
    assert!(log_reaches(&db.pool, 4).await);
    outbox.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_outbox_appends_what_its_listener_had() {
    let (db, outbox, _listener, _) = gathering_alone(4).await;
    outbox.shutdown().await;
    // Nothing runs now: the log holds what the listener had, because the sequencer appended
    // its plan as it stopped.
    assert_eq!(logged_positions(&db.pool).await, vec![1, 2, 3, 4, 5]);
    assert_eq!(stored_head(&db.pool).await, 5);
}

/// The groups a gathered append starts at while a listener takes early positions, whatever the
/// spacing (the sequencer's `GATHER_GROUPS`, below the default `fold_batch`).
const GATHER_GROUPS: u32 = 256;

/// With a listener taking early positions (the gathering's own listener here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gathering_that_reaches_its_size_is_appended_before_the_spacing_runs_out() {
    let (db, outbox, mut listener, _) = gathering_alone(2).await;
    // Two gathered so far (positions 2 and 3); one short of the size, still nothing appended.
    for n in 3..GATHER_GROUPS {
        commit(&outbox, n).await;
        assert_eq!(next(&mut listener).await, (u64::from(n) + 1, n));
    }
    tokio::time::sleep(QUIET).await;
    assert_eq!(stored_head(&db.pool).await, 1, "below the size, it gathers");
    // The one that makes the size: appended now, not in 60 s.
    commit_the_size(&db, outbox, GATHER_GROUPS).await;
}

/// Commits transaction `size` (positions 1 to `size` gathered before it) and checks that the
/// gathering is appended at once, whole, and that the log keeps its invariants.
async fn commit_the_size(db: &TestDb, outbox: Outbox<Note>, size: u32) {
    commit(&outbox, size).await;
    let head = u64::from(size) + 1;
    assert!(
        log_reaches(&db.pool, head).await,
        "a gathering of {size} transactions is appended at once"
    );
    assert_eq!(
        logged_positions(&db.pool).await,
        (1..=head).collect::<Vec<_>>()
    );
    outbox.shutdown().await;
    check_log(&db.pool, &ORDO)
        .await
        .expect("the log holds every transaction once, in order");
}

/// With no listener taking early positions, nobody's clock runs through an append: the
/// gathering grows past `GATHER_GROUPS`, up to `fold_batch`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_early_listener_a_gathering_grows_to_fold_batch() {
    let db = TestDb::new().await;
    let batch = GATHER_GROUPS + 44;
    let outbox = Outbox::<Note>::new(
        db.another_pool(4).await,
        gathering().fold_batch(batch as usize),
    )
    .await
    .expect("start the outbox");
    settle(&db.pool).await;
    commit(&outbox, 0).await;
    assert!(
        log_reaches(&db.pool, 1).await,
        "the first append comes at once"
    );
    // Positions 2 to `batch`: one short of `fold_batch`, past `GATHER_GROUPS`.
    for n in 1..batch {
        commit(&outbox, n).await;
    }
    tokio::time::sleep(QUIET).await;
    assert_eq!(
        stored_head(&db.pool).await,
        1,
        "with nobody listening early, {} gathered transactions are not appended yet",
        batch - 1
    );
    // The one that makes `fold_batch`.
    commit_the_size(&db, outbox, batch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_wake_up_connection_ends_the_gathering() {
    let (db, outbox, mut listener, _) = gathering_alone(2).await;
    // Its LISTEN connection dropped, the outbox cannot tell whether anyone else is there: it
    // appends as if someone were, and goes on once the connection is back.
    let dropped: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND query LIKE 'LISTEN%') AS t",
    )
    .fetch_one(&db.pool)
    .await
    .expect("terminate the LISTEN connection");
    assert_eq!(dropped, 1, "one LISTEN connection");
    assert!(
        log_reaches(&db.pool, 3).await,
        "the sequencer appends once it cannot tell"
    );
    commit(&outbox, 3).await;
    assert_eq!(next(&mut listener).await, (4, 3));
    assert!(log_reaches(&db.pool, 4).await);
    assert_eq!(logged_positions(&db.pool).await, vec![1, 2, 3, 4]);
    outbox.shutdown().await;
}

/// Concurrent writers with rollbacks, beside one that publishes in its own transactions (whose
/// groups the listener has no early position of), into an outbox alone at the default spacing:
/// the listener hears exactly the log, and the log keeps its invariants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_with_rollbacks_into_a_gathering_outbox_are_logged_as_heard() {
    let db = TestDb::new().await;
    let outbox = Arc::new(
        Outbox::<Note>::new(
            db.another_pool(6).await,
            // Short, so that it gathers many times within the test (the default is 1 s).
            OutboxConfig::default().unwatched_append_spacing(Duration::from_millis(25)),
        )
        .await
        .expect("start the outbox"),
    );
    settle(&db.pool).await;
    let mut listener = outbox.listen_committed(Start::Beginning);
    let mut writers = Vec::new();
    for writer in 0..3u32 {
        let outbox = Arc::clone(&outbox);
        writers.push(tokio::spawn(async move {
            write_with_rollbacks(&outbox, writer, 80).await;
        }));
    }
    let outside = {
        let outbox = Arc::clone(&outbox);
        let pool = db.pool.clone();
        tokio::spawn(async move {
            for n in 0..20u32 {
                let mut tx = pool.begin().await.expect("begin");
                outbox
                    .publish_in(&mut tx, [Note { writer: 9, n }])
                    .await
                    .expect("publish in");
                if n % 5 == 2 {
                    tx.rollback().await.expect("rollback");
                } else {
                    tx.commit().await.expect("commit");
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        })
    };
    for writer in writers {
        writer.await.expect("the writer ran");
    }
    outside.await.expect("the outside writer ran");
    let caught_up = eventually(PATIENCE, || async {
        let (real, logged) = counts(&db.pool).await;
        logged >= real
    })
    .await;
    assert!(caught_up, "the log holds every event");
    let log = logged_events(&db.pool).await;
    let mut heard = Vec::new();
    while heard.len() < log.len() {
        let item = timeout(PATIENCE, listener.next())
            .await
            .expect("the listener has the event in time")
            .expect("the stream goes on")
            .expect("an event");
        heard.push((item.commit_sequence.get(), item.event.sequence.get()));
    }
    assert_eq!(heard, log, "the listener heard the log");
    check_log(&db.pool, &ORDO)
        .await
        .expect("the log's invariants");
    drop(listener);
    if let Ok(outbox) = Arc::try_unwrap(outbox) {
        outbox.shutdown().await;
    }
}

/// A process that gathers, killed: on a runtime of its own, an outbox alone commits
/// `transactions` transactions, its listener hears each at once, the log stays at the first;
/// then the runtime is dropped with the outbox still held (a kill, not a stop: no flush).
/// Returns what the listener heard: (position, the event's sequence).
fn gather_then_kill(url: String, transactions: u32) -> Vec<(u64, u64)> {
    std::thread::spawn(move || {
        let runtime = common::victim_runtime();
        let (heard_tx, heard_rx) = std::sync::mpsc::channel();
        runtime.spawn(async move {
            let pool = PgPool::connect(&url).await.expect("victim pool");
            let outbox = alone(&pool).await;
            let mut listener = outbox.listen_committed(Start::Beginning);
            let mut heard = Vec::new();
            for n in 0..transactions {
                let sequences = commit(&outbox, n).await;
                let (position, got) = next(&mut listener).await;
                assert_eq!(got, n, "the listener hears the transactions in order");
                heard.push((position, sequences[0].get()));
            }
            tokio::time::sleep(QUIET).await;
            assert_eq!(stored_head(&pool).await, 1, "the victim gathers");
            heard_tx.send(heard).expect("the test waits for it");
            // Held until the runtime goes: its tasks are dropped where they stand.
            std::future::pending::<()>().await;
            drop((outbox, listener, pool));
        });
        let heard = heard_rx.recv().expect("the victim gathered");
        runtime.shutdown_background();
        heard
    })
    .join()
    .expect("victim thread")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_while_it_gathers_loses_nothing_and_the_next_fold_logs_what_it_heard() {
    let db = TestDb::new().await;
    let url = db.url.clone();
    let heard = tokio::task::spawn_blocking(move || gather_then_kill(url, 6))
        .await
        .expect("the victim ran");
    assert_eq!(
        heard
            .iter()
            .map(|(position, _)| *position)
            .collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5, 6]
    );
    assert_eq!(
        stored_head(&db.pool).await,
        1,
        "killed, the victim appended nothing more"
    );
    // The next process folds what the killed one had planned, from the table: the same
    // positions for the same events as its listener had.
    let outbox = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("start the next outbox");
    assert!(log_reaches(&db.pool, 6).await, "the next fold logs them");
    assert_eq!(logged_events(&db.pool).await, heard);
    outbox.shutdown().await;
    check_log(&db.pool, &ORDO)
        .await
        .expect("the log's invariants");
}

/// The same kill with no listener, the gathering past `GATHER_GROUPS` (up to `fold_batch`
/// while nobody listens early): the next process logs every transaction the killed one
/// committed, once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_with_a_gathering_past_gather_groups_loses_nothing() {
    let db = TestDb::new().await;
    let url = db.url.clone();
    let transactions = GATHER_GROUPS + 44;
    let head = tokio::task::spawn_blocking(move || {
        let runtime = common::victim_runtime();
        let (gathered_tx, gathered_rx) = std::sync::mpsc::channel();
        runtime.spawn(async move {
            let pool = PgPool::connect(&url).await.expect("victim pool");
            let outbox = alone(&pool).await;
            for n in 0..transactions {
                commit(&outbox, n).await;
            }
            tokio::time::sleep(QUIET).await;
            gathered_tx
                .send(stored_head(&pool).await)
                .expect("the test waits for it");
            // Held until the runtime goes: a kill, not a stop.
            std::future::pending::<()>().await;
            drop((outbox, pool));
        });
        let head = gathered_rx.recv().expect("the victim gathered");
        runtime.shutdown_background();
        // Its first transaction or two may be appended before it knows nobody listens (a
        // loaded machine); the rest are gathered, more than `GATHER_GROUPS` of them.
        assert!(
            u64::from(transactions) - head > u64::from(GATHER_GROUPS),
            "the victim gathers past GATHER_GROUPS: {head} of {transactions} appended"
        );
        head
    })
    .await
    .expect("the victim ran");
    assert_eq!(
        stored_head(&db.pool).await,
        head,
        "killed, the victim appended nothing more"
    );
    let outbox = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("start the next outbox");
    let head = u64::from(transactions);
    assert!(log_reaches(&db.pool, head).await, "the next fold logs them");
    assert_eq!(
        logged_positions(&db.pool).await,
        (1..=head).collect::<Vec<_>>()
    );
    outbox.shutdown().await;
    check_log(&db.pool, &ORDO)
        .await
        .expect("the log's invariants");
}
