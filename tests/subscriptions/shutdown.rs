//! Shutdown: the outbox stops its subscriptions first, waits (bounded by each one's lease) for
//! the handler in hand, releases every lease this process holds, and only then stops the lanes.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{Note, TestDb, eventually};
use ordo::{Delivery, HandlerError, JobConfig, Outbox, OutboxConfig, RetryPolicy, Subscriber};
use sqlx::{PgConnection, PgPool};
use tokio::sync::Notify;

const PATIENCE: Duration = Duration::from_secs(30);

/// Long enough that only a released lease, never an expired one, lets a standby take over
/// within the test.
const LONG_LEASE: Duration = Duration::from_secs(60);

/// How long shutdown is given to return too early while a handler is blocked. It must not
/// return at all before the handler is released, so this bounds only the test's run time.
const EARLY: Duration = Duration::from_millis(300);

async fn handled_table(pool: &PgPool) {
    sqlx::query("CREATE TABLE handled (sequence BIGINT NOT NULL)")
        .execute(pool)
        .await
        .expect("handled table");
}

async fn record(tx: &mut PgConnection, event: &Delivery<Note>) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO handled (sequence) VALUES ($1)")
        .bind(event.sequence.get() as i64)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Records the event through its transaction, says so, then waits for `release`.
struct Blocking {
    entered: Arc<Notify>,
    release: Arc<Notify>,
}

impl Subscriber<Note> for Blocking {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        event: &Delivery<Note>,
    ) -> Result<(), HandlerError> {
        record(tx, event).await?;
        self.entered.notify_one();
        self.release.notified().await;
        Ok(())
    }
}

/// Records the event through its transaction, says so, and never returns.
struct Stuck {
    entered: Arc<Notify>,
}

impl Subscriber<Note> for Stuck {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        event: &Delivery<Note>,
    ) -> Result<(), HandlerError> {
        record(tx, event).await?;
        self.entered.notify_one();
        std::future::pending::<()>().await;
        Ok(())
    }
}

/// Records every event.
struct Record;

impl Subscriber<Note> for Record {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        event: &Delivery<Note>,
    ) -> Result<(), HandlerError> {
        record(tx, event).await?;
        Ok(())
    }
}

async fn publish_one(outbox: &Outbox<Note>, n: u32) -> i64 {
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(Note { writer: 0, n }).expect("publish");
    let sequences = tx.commit().await.expect("commit");
    sequences[0].get() as i64
}

/// Whether the event at `sequence` is handled (once) within `limit`.
async fn handled_within(pool: &PgPool, sequence: i64, limit: Duration) -> bool {
    eventually(limit, || async {
        let count: i64 = sqlx::query_scalar("SELECT count(*) FROM handled WHERE sequence = $1")
            .bind(sequence)
            .fetch_one(pool)
            .await
            .expect("handled count");
        count == 1
    })
    .await
}

/// (handled rows, stored position, lease owner) of the subscription `name`.
async fn stored(pool: &PgPool, name: &str) -> (i64, i64, Option<uuid::Uuid>) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM handled), position, lease_owner
         FROM ordo.subscriptions WHERE name = $1",
    )
    .bind(name)
    .fetch_one(pool)
    .await
    .expect("subscription row")
}

/// A lease short enough to be the shutdown bound in a test, with retries that fit it.
fn short_lease(name: &str) -> JobConfig {
    JobConfig::new(name)
        .lease(Duration::from_secs(1))
        .retry(RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(100),
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_returns_after_the_handler_in_hand_committed_and_released_the_lease() {
    let db = TestDb::new().await;
    handled_table(&db.pool).await;
    let outbox = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let blocking = Blocking {
        entered: Arc::clone(&entered),
        release: Arc::clone(&release),
    };
    outbox
        .subscribe(JobConfig::new("blocking"), blocking)
        .await
        .expect("subscribe")
        .detach();
    let sequence = publish_one(&outbox, 1).await;
    tokio::time::timeout(PATIENCE, entered.notified())
        .await
        .expect("the handler starts");

    let mut stopping = tokio::spawn({
        let outbox = outbox.clone();
        async move { outbox.shutdown().await }
    });
    let early = tokio::time::timeout(EARLY, &mut stopping).await;
    assert!(
        early.is_err(),
        "shutdown returned while a handler's transaction was still open"
    );
    release.notify_one();
    tokio::time::timeout(PATIENCE, stopping)
        .await
        .expect("shutdown returns once the handler does")
        .expect("the shutdown task");

    let (handled, position, owner) = stored(&db.pool, "blocking").await;
    assert_eq!(
        handled, 1,
        "the handler's row is committed when shutdown returns"
    );
    assert_eq!(position, sequence, "and so is its checkpoint");
    assert_eq!(owner, None, "the lease is released when shutdown returns");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_a_released_lease_long_before_it_would_expire() {
    let db = TestDb::new().await;
    handled_table(&db.pool).await;
    let first_pool = db.another_pool(4).await;
    let first = Outbox::<Note>::new(first_pool.clone(), OutboxConfig::default())
        .await
        .expect("first outbox");
    let second = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("second outbox");
    let config = JobConfig::new("takeover").lease(LONG_LEASE);
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let blocking = Blocking {
        entered: Arc::clone(&entered),
        release: Arc::clone(&release),
    };
    first
        .subscribe(config.clone(), blocking)
        .await
        .expect("subscribe the first")
        .detach();
    publish_one(&first, 1).await;
    tokio::time::timeout(PATIENCE, entered.notified())
        .await
        .expect("the first runner handles the first event");
    // The first runner holds the lease: the second waits on standby.
    let standby = second
        .subscribe(config, Record)
        .await
        .expect("subscribe the second");

    // The first process shuts down mid-handler, then exits (its pool closes): a lease it has
    // not released by then stays taken until it expires.
    let mut exiting = tokio::spawn(async move {
        first.shutdown().await;
        first_pool.close().await;
    });
    let _ = tokio::time::timeout(EARLY, &mut exiting).await;
    release.notify_one();
    tokio::time::timeout(PATIENCE, exiting)
        .await
        .expect("the first process exits")
        .expect("the exit task");

    let next = publish_one(&second, 2).await;
    let taken_over = handled_within(&db.pool, next, LONG_LEASE - Duration::from_secs(15)).await;
    assert!(
        taken_over,
        "the standby handles the next event before the first runner's lease would expire"
    );
    standby.shutdown().await;
    second.shutdown().await;
}

/// An outbox whose subscription `stuck` (short lease) is inside a handler that never returns.
async fn stuck_in_a_handler() -> (TestDb, Outbox<Note>, ordo::SubscriptionHandle) {
    let db = TestDb::new().await;
    handled_table(&db.pool).await;
    let outbox = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let entered = Arc::new(Notify::new());
    let stuck = Stuck {
        entered: Arc::clone(&entered),
    };
    let handle = outbox
        .subscribe(short_lease("stuck"), stuck)
        .await
        .expect("subscribe");
    publish_one(&outbox, 1).await;
    tokio::time::timeout(PATIENCE, entered.notified())
        .await
        .expect("the handler starts");
    (db, outbox, handle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_aborts_a_handler_that_never_returns_and_releases_its_lease() {
    let (db, outbox, _handle) = stuck_in_a_handler().await;

    tokio::time::timeout(PATIENCE, outbox.shutdown())
        .await
        .expect("shutdown returns though the handler never does");

    let (handled, position, owner) = stored(&db.pool, "stuck").await;
    assert_eq!(owner, None, "the lease is released when shutdown returns");
    assert_eq!(position, 0, "the aborted handler checkpointed nothing");
    assert_eq!(handled, 0, "nor committed its row");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_handle_shutdown_is_bounded_and_releases_the_lease() {
    let (db, outbox, handle) = stuck_in_a_handler().await;

    tokio::time::timeout(PATIENCE, handle.shutdown())
        .await
        .expect("the handle's shutdown returns though the handler never does");
    let (_, _, owner) = stored(&db.pool, "stuck").await;
    assert_eq!(
        owner, None,
        "the lease is released when the handle's shutdown returns"
    );

    // The outbox runs on: its other subscriptions still start and handle events.
    outbox
        .subscribe(JobConfig::new("after"), Record)
        .await
        .expect("subscribe after")
        .detach();
    let next = publish_one(&outbox, 2).await;
    let handled = handled_within(&db.pool, next, PATIENCE).await;
    assert!(
        handled,
        "the outbox goes on after one subscription's shutdown"
    );
    outbox.shutdown().await;
}
