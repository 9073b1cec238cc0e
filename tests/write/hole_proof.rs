//! The insert lane's abandonment proof waits only for the transactions that drew an event
//! sequence: an unrelated long transaction, in another database of the server or in this one,
//! never holds a rolled-back hole, and a possible writer of the hole always does (open, with a
//! rolled-back savepoint that drew it, or prepared).
//!
//! Every test here sets `gap_fill_timeout` to an hour, so the time-out path (the placeholder
//! written under a conflict check) never runs: whatever resolves a hole within the test's
//! patience is the proof.

use crate::common;

use std::time::Duration;

use common::{Note, TestDb};
use futures::StreamExt;
use ordo::{Outbox, OutboxConfig, Start};
use sqlx::{Connection, PgConnection, PgPool, Postgres, Transaction};
use tokio::time::timeout;

const PATIENCE: Duration = Duration::from_secs(30);

/// How long a hole with an open possible writer is watched to stay unresolved: many times the
/// grace and the proof's polls, which back off to the resync interval (100 ms).
const HELD: Duration = Duration::from_millis(1_500);

/// Only the proof can resolve a hole within a test.
fn proof_only() -> OutboxConfig {
    OutboxConfig::default()
        .gap_grace(Duration::from_millis(20))
        .gap_fill_timeout(Duration::from_secs(3_600))
}

async fn outbox(pool: &PgPool) -> Outbox<Note> {
    Outbox::new(pool.clone(), proof_only())
        .await
        .expect("start the outbox")
}

/// A hole at the next sequence: a plain-SQL insert rolled back.
async fn rolled_back_hole(pool: &PgPool) {
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query(r#"INSERT INTO ordo.events (payload) VALUES ('{"writer": 0, "n": 0}')"#)
        .execute(&mut *tx)
        .await
        .expect("insert");
    tx.rollback().await.expect("roll back");
}

async fn commit_note(outbox: &Outbox<Note>, n: u32) {
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(Note { writer: 1, n }).expect("publish");
    tx.commit().await.expect("commit");
}

/// A transaction that has a transaction id and stays open: `pg_current_snapshot()` lists it
/// on every database of the server.
async fn open_writer(pool: &PgPool, write: &str) -> Transaction<'static, Postgres> {
    let mut tx = pool.begin().await.expect("begin the long transaction");
    sqlx::query(sqlx::AssertSqlSafe(write.to_owned()))
        .execute(&mut *tx)
        .await
        .expect("the long transaction's write");
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut *tx)
        .await
        .expect("an xid");
    tx
}

async fn placeholders(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM ordo.events WHERE payload IS NULL")
        .fetch_one(pool)
        .await
        .expect("count placeholders")
}

/// A rolled-back hole below a committed event, while `long` (opened before the hole) stays
/// open: both lanes deliver the event, by proof.
async fn hole_is_proven_while(db: &TestDb, long: Transaction<'static, Postgres>) {
    let outbox = outbox(&db.pool).await;
    let mut inserted = outbox.listen_inserted(Start::Beginning);
    let mut committed = outbox.listen_committed(Start::Beginning);
    rolled_back_hole(&db.pool).await;
    commit_note(&outbox, 1).await;

    let first = timeout(PATIENCE, inserted.next())
        .await
        .expect("the insert lane passed the hole while the unrelated transaction is open")
        .expect("open")
        .expect("an event");
    assert_eq!(first.payload, Note { writer: 1, n: 1 });
    assert_eq!(first.sequence.get(), 2, "behind the hole at 1");
    let logged = timeout(PATIENCE, committed.next())
        .await
        .expect("the commit lane passed the hole while the unrelated transaction is open")
        .expect("open")
        .expect("an event");
    assert_eq!(logged.event.payload, Note { writer: 1, n: 1 });
    assert_eq!(logged.commit_sequence.get(), 1);
    assert_eq!(
        placeholders(&db.pool).await,
        1,
        "the hole got one placeholder"
    );
    long.rollback().await.expect("end the long transaction");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hole_is_proven_abandoned_while_a_transaction_writes_in_another_database() {
    let db = TestDb::new().await;
    let elsewhere = TestDb::new().await;
    sqlx::query("CREATE TABLE batch_job (n int)")
        .execute(&elsewhere.pool)
        .await
        .expect("create");
    let long = open_writer(&elsewhere.pool, "INSERT INTO batch_job VALUES (1)").await;
    hole_is_proven_while(&db, long).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hole_is_proven_abandoned_while_a_transaction_writes_other_tables_of_this_database() {
    let db = TestDb::new().await;
    sqlx::query("CREATE TABLE orders (n int)")
        .execute(&db.pool)
        .await
        .expect("create");
    let long = open_writer(&db.pool, "INSERT INTO orders VALUES (1)").await;
    hole_is_proven_while(&db, long).await;
}

/// What is wrong, if anything, after watching the hole at sequence 1 for [`HELD`] while its
/// possible writer is open: the lane must not pass it, no placeholder may be written, and no
/// placeholder write may be waiting on the writer (the fill's conflict check would hold the
/// lane too, but only the time-out path may get there: the proof must hold first).
async fn held_problem(db: &TestDb, stream: &mut ordo::EventStream<Note>) -> Option<String> {
    if let Ok(item) = timeout(HELD, stream.next()).await {
        return Some(format!(
            "the lane passed a hole whose writer is open: {item:?}"
        ));
    }
    let written = placeholders(&db.pool).await;
    if written != 0 {
        return Some(format!(
            "{written} placeholder(s) written while the hole's writer is open"
        ));
    }
    let waiting: Vec<String> = sqlx::query_scalar(
        "SELECT left(query, 120) FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .fetch_all(&db.pool)
    .await
    .expect("waiting backends");
    (!waiting.is_empty())
        .then(|| format!("the proof let a fill through to wait on the open writer: {waiting:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hole_drawn_by_a_rolled_back_savepoint_waits_for_its_top_level_transaction() {
    let db = TestDb::new().await;
    let outbox = outbox(&db.pool).await;
    let mut inserted = outbox.listen_inserted(Start::Beginning);
    let mut writer = db.pool.begin().await.expect("begin");
    sqlx::raw_sql(
        r#"SAVEPOINT s;
           INSERT INTO ordo.events (payload) VALUES ('{"writer": 0, "n": 0}');
           ROLLBACK TO SAVEPOINT s;"#,
    )
    .execute(&mut *writer)
    .await
    .expect("draw in a savepoint and roll it back");
    commit_note(&outbox, 1).await;

    if let Some(problem) = held_problem(&db, &mut inserted).await {
        panic!("{problem}");
    }
    writer
        .commit()
        .await
        .expect("end the top-level transaction");
    let next = timeout(PATIENCE, inserted.next())
        .await
        .expect("delivered once the top-level transaction ended")
        .expect("open")
        .expect("an event");
    assert_eq!(next.payload, Note { writer: 1, n: 1 });
    assert_eq!(placeholders(&db.pool).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hole_whose_writer_idles_in_its_transaction_waits_for_it() {
    let db = TestDb::new().await;
    let outbox = outbox(&db.pool).await;
    let mut inserted = outbox.listen_inserted(Start::Beginning);
    let mut writer = db.pool.begin().await.expect("begin");
    sqlx::query(r#"INSERT INTO ordo.events (payload) VALUES ('{"writer": 0, "n": 0}')"#)
        .execute(&mut *writer)
        .await
        .expect("draw");
    commit_note(&outbox, 1).await;

    if let Some(problem) = held_problem(&db, &mut inserted).await {
        panic!("{problem}");
    }
    writer.commit().await.expect("commit the writer");
    for expected in [Note { writer: 0, n: 0 }, Note { writer: 1, n: 1 }] {
        let next = timeout(PATIENCE, inserted.next())
            .await
            .expect("delivered once the writer committed")
            .expect("open")
            .expect("an event");
        assert_eq!(next.payload, expected);
    }
    assert_eq!(placeholders(&db.pool).await, 0);
}

/// Whether this server can prepare transactions (`max_prepared_transactions` above 0; CI sets
/// it, see `.ci/run`).
async fn can_prepare(pool: &PgPool, test: &str) -> bool {
    let slots: String = sqlx::query_scalar("SHOW max_prepared_transactions")
        .fetch_one(pool)
        .await
        .expect("show");
    if slots == "0" {
        eprintln!(
            "SKIPPED {test}: max_prepared_transactions is 0 on this server, so no transaction \
             can be prepared (.ci/run sets it)"
        );
    }
    slots != "0"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hole_drawn_by_a_prepared_transaction_waits_for_commit_prepared() {
    let db = TestDb::new().await;
    if !can_prepare(&db.pool, "a_hole_drawn_by_a_prepared_transaction_waits").await {
        return;
    }
    let outbox = outbox(&db.pool).await;
    let mut inserted = outbox.listen_inserted(Start::Beginning);
    let gid = format!("ordo-test-{}", uuid::Uuid::new_v4().simple());
    let mut preparer = PgConnection::connect(&db.url).await.expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        r#"BEGIN;
           INSERT INTO ordo.events (payload) VALUES ('{{"writer": 0, "n": 0}}');
           PREPARE TRANSACTION '{gid}';"#
    )))
    .execute(&mut preparer)
    .await
    .expect("draw and prepare");
    // The preparing session is gone: only the prepared transaction holds the hole now.
    preparer.close().await.expect("close");
    commit_note(&outbox, 1).await;

    // Nothing may panic while the transaction is prepared: it would outlive the test and keep
    // its database from being dropped. So the outcome is taken first, and asserted after.
    let problem = held_problem(&db, &mut inserted).await;
    sqlx::query(sqlx::AssertSqlSafe(format!("COMMIT PREPARED '{gid}'")))
        .execute(&db.pool)
        .await
        .expect("commit prepared");
    if let Some(problem) = problem {
        panic!("held by a prepared transaction: {problem}");
    }
    for expected in [Note { writer: 0, n: 0 }, Note { writer: 1, n: 1 }] {
        let next = timeout(PATIENCE, inserted.next())
            .await
            .expect("delivered once the prepared transaction committed")
            .expect("open")
            .expect("an event");
        assert_eq!(next.payload, expected);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hole_whose_writer_is_killed_is_proven_abandoned_once_its_backend_is_gone() {
    let db = TestDb::new().await;
    let outbox = outbox(&db.pool).await;
    let mut inserted = outbox.listen_inserted(Start::Beginning);
    let mut committed = outbox.listen_committed(Start::Beginning);
    let mut writer = PgConnection::connect(&db.url).await.expect("connect");
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut writer)
        .await
        .expect("pid");
    sqlx::raw_sql(r#"BEGIN; INSERT INTO ordo.events (payload) VALUES ('{"writer": 0, "n": 0}');"#)
        .execute(&mut writer)
        .await
        .expect("draw and stay open");
    commit_note(&outbox, 1).await;
    if let Some(problem) = held_problem(&db, &mut inserted).await {
        panic!("{problem}");
    }
    // The writer's process dies: the server ends its backend, and its transaction with it.
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&db.pool)
        .await
        .expect("terminate");
    assert!(killed);
    let next = timeout(PATIENCE, inserted.next())
        .await
        .expect("the insert lane passed the hole once its writer was gone")
        .expect("open")
        .expect("an event");
    assert_eq!(next.payload, Note { writer: 1, n: 1 });
    let logged = timeout(PATIENCE, committed.next())
        .await
        .expect("the commit lane passed the hole once its writer was gone")
        .expect("open")
        .expect("an event");
    assert_eq!(logged.event.payload, Note { writer: 1, n: 1 });
    assert_eq!(placeholders(&db.pool).await, 1);
    drop(writer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_prove_the_same_hole_while_an_unrelated_transaction_is_open() {
    let db = TestDb::new().await;
    let elsewhere = TestDb::new().await;
    sqlx::query("CREATE TABLE batch_job (n int)")
        .execute(&elsewhere.pool)
        .await
        .expect("create");
    let long = open_writer(&elsewhere.pool, "INSERT INTO batch_job VALUES (1)").await;
    let first = outbox(&db.pool).await;
    let second = outbox(&db.another_pool(4).await).await;
    let mut streams = [
        first.listen_inserted(Start::Beginning),
        second.listen_inserted(Start::Beginning),
    ];
    for n in 1..=3 {
        rolled_back_hole(&db.pool).await;
        commit_note(&first, n).await;
    }
    for stream in &mut streams {
        for n in 1..=3 {
            let next = timeout(PATIENCE, stream.next())
                .await
                .expect("each process passes the holes by proof")
                .expect("open")
                .expect("an event");
            assert_eq!(next.payload, Note { writer: 1, n });
        }
    }
    assert_eq!(placeholders(&db.pool).await, 3, "one placeholder per hole");
    long.rollback().await.expect("end the long transaction");
}
