//! Waits keyed by what a writer holds (the sequences `commit()` returned), from any process:
//! read-your-writes on the commit lane and through a subscription.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{Note, TestDb};
use ordo::{
    Delivery, Error, HandlerError, JobConfig, OnExhaustion, Ordering, Outbox, OutboxConfig,
    RetryPolicy, Subscriber,
};
use sqlx::PgConnection;
use tokio::sync::Semaphore;

const LIMIT: Duration = Duration::from_secs(30);

/// One row per event in `balances`.
struct Balances;

impl Subscriber<Note> for Balances {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        event: &Delivery<Note>,
    ) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO balances (writer, n) VALUES ($1, $2)")
            .bind(event.payload.writer as i32)
            .bind(event.payload.n as i32)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

async fn publish(outbox: &Outbox<Note>, writer: u32, events: u32) -> Vec<ordo::EventSequence> {
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish_all((0..events).map(|n| Note { writer, n }))
        .expect("publish");
    tx.commit().await.expect("commit")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_does_not_fold_learns_the_commit_positions_of_its_writes() {
    let db = TestDb::new().await;
    let folder = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("folder");
    // The writer is another "process" with no sequencer: the positions come from the database.
    let writer = Outbox::<Note>::new(
        db.another_pool(4).await,
        OutboxConfig::default().sequencer(false),
    )
    .await
    .expect("writer");
    publish(&writer, 1, 3).await;
    let sequences = publish(&writer, 2, 2).await;
    let positions = writer
        .wait_for_commit(&sequences, LIMIT)
        .await
        .expect("logged");
    let logged: Vec<i64> = sqlx::query_scalar(
        "SELECT commit_seq FROM ordo.commit_log WHERE sequence = ANY($1) ORDER BY sequence",
    )
    .bind(sequences.iter().map(|s| s.get() as i64).collect::<Vec<_>>())
    .fetch_all(&db.pool)
    .await
    .expect("log");
    let got: Vec<i64> = positions.iter().map(|p| p.get() as i64).collect();
    assert_eq!(got, logged);
    assert_eq!(
        got,
        vec![4, 5],
        "three events before them, one group of two"
    );
    folder.shutdown().await;
    writer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_the_commit_lane_with_nobody_folding_times_out_saying_so() {
    let db = TestDb::new().await;
    let writer = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default().sequencer(false))
        .await
        .expect("writer");
    let sequences = publish(&writer, 1, 1).await;
    let waited = writer
        .wait_for_commit(&sequences, Duration::from_millis(300))
        .await;
    assert!(
        matches!(waited, Err(Error::WaitTimedOut { .. })),
        "{waited:?}"
    );
    writer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_reads_its_write_through_a_subscription_run_by_another_process() {
    let db = TestDb::new().await;
    sqlx::query("CREATE TABLE balances (writer INT NOT NULL, n INT NOT NULL)")
        .execute(&db.pool)
        .await
        .expect("table");
    for ordering in [Ordering::Commit, Ordering::Insert] {
        let name = format!("balances-{}", ordering.as_str());
        let runner = Outbox::<Note>::new(db.another_pool(4).await, OutboxConfig::default())
            .await
            .expect("runner");
        let handle = runner
            .subscribe(JobConfig::new(name.clone()).ordering(ordering), Balances)
            .await
            .expect("subscribe");
        let writer = Outbox::<Note>::new(
            db.another_pool(4).await,
            OutboxConfig::default().sequencer(false),
        )
        .await
        .expect("writer");
        for round in 0..5u32 {
            let sequences = publish(&writer, round, 2).await;
            writer
                .wait_for_subscription(&name, &sequences, LIMIT)
                .await
                .expect("handled");
            // Read-your-writes: the projection holds this round's events, every time.
            let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM balances WHERE writer = $1")
                .bind(round as i32)
                .fetch_one(&db.pool)
                .await
                .expect("read");
            assert!(seen >= 2, "round {round} on {name}: {seen} rows");
        }
        handle.shutdown().await;
        runner.shutdown().await;
        writer.shutdown().await;
        sqlx::query("TRUNCATE balances")
            .execute(&db.pool)
            .await
            .expect("truncate");
    }
}

/// Always fails: the job halts on the first event.
struct Broken;

impl Subscriber<Note> for Broken {
    async fn handle(
        &self,
        _tx: &mut PgConnection,
        _event: &Delivery<Note>,
    ) -> Result<(), HandlerError> {
        Err("the ledger is closed".into())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_on_a_halted_subscription_says_it_is_halted_and_why() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let job = JobConfig::new("broken")
        .retry(RetryPolicy {
            max_attempts: 1,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(1),
        })
        .on_exhaustion(OnExhaustion::Halt);
    let handle = outbox.subscribe(job, Broken).await.expect("subscribe");
    let sequences = publish(&outbox, 1, 1).await;
    let waited = outbox
        .wait_for_subscription("broken", &sequences, LIMIT)
        .await;
    match waited {
        Err(Error::SubscriptionNotRunning {
            status, last_error, ..
        }) => {
            assert_eq!(status, "halted");
            assert!(last_error.is_some_and(|e| e.contains("ledger is closed")));
        }
        other => panic!("expected SubscriptionNotRunning, got {other:?}"),
    }
    handle.shutdown().await;
    outbox.shutdown().await;
}

/// Blocks in its handler until a permit is released.
struct Gate(Arc<Semaphore>);

impl Subscriber<Note> for Gate {
    async fn handle(
        &self,
        _tx: &mut PgConnection,
        _event: &Delivery<Note>,
    ) -> Result<(), HandlerError> {
        self.0.acquire().await?.forget();
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_wait_for_zero_lag_is_not_true_while_events_wait() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let gate = Arc::new(Semaphore::new(0));
    let handle = outbox
        .subscribe(JobConfig::new("gated"), Gate(Arc::clone(&gate)))
        .await
        .expect("subscribe");
    let sequences = publish(&outbox, 1, 3).await;
    // Once the lane has the events (its frontier passed them), the handler is held at the first.
    let last = sequences.iter().max().copied().expect("three sequences");
    let in_lane = common::eventually(LIMIT, || async { outbox.insert_frontier() >= last }).await;
    assert!(in_lane, "the insert lane did not reach {last}");
    let (status, held) = handle
        .wait_for(Duration::from_millis(500), |s| s.lag == 0)
        .await;
    assert!(!held, "lag 0 claimed while 3 events wait: {status:?}");
    gate.add_permits(3);
    outbox
        .wait_for_subscription("gated", &sequences, LIMIT)
        .await
        .expect("handled");
    let (status, held) = handle.wait_for(LIMIT, |s| s.lag == 0).await;
    assert!(held, "{status:?}");
    handle.shutdown().await;
    outbox.shutdown().await;
}
