//! Durable subscriptions: exactly-once effects across handler failures, killed runners and a
//! zombie that lost its lease, on both lanes; groups, lane mismatch, halt, dead letters and
//! shutdown under load.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering as AtomicOrdering};
use std::time::Duration;

use common::subscribers::{
    PATIENCE, Poisoned, Project, assert_exactly_once, fast_retries, project, projected_outbox,
    publish, wait_projected,
};
use common::{Note, TestDb, eventually};
use ordo::{
    Batch, Delivery, Error, EventSequence, HandlerError, JobConfig, OnExhaustion, Ordering, Outbox,
    OutboxConfig, Position, Subscriber, SubscriptionState,
};
use rand::Rng;
use sqlx::{PgConnection, PgPool};

async fn handler_failures_and_retries_apply_each_event_once(ordering: Ordering) {
    let db = TestDb::new().await;
    let outbox = projected_outbox(&db).await;
    let config = JobConfig::new("flaky")
        .ordering(ordering)
        .retry(fast_retries(100));
    let handle = outbox
        .subscribe(config, Project { fail_rate: 0.3 })
        .await
        .expect("subscribe");
    publish(&outbox, 40, 3).await;
    assert!(wait_projected(&db.pool, 120).await, "all events projected");
    let (status, settled) = handle.wait_for(PATIENCE, |s| s.position.get() >= 120).await;
    assert!(settled, "position reached the end: {status:?}");
    handle.shutdown().await;
    assert_exactly_once(&db.pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_failures_and_retries_apply_each_event_once_on_the_insert_lane() {
    handler_failures_and_retries_apply_each_event_once(Ordering::Insert).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_failures_and_retries_apply_each_event_once_on_the_commit_lane() {
    handler_failures_and_retries_apply_each_event_once(Ordering::Commit).await;
}

/// Runs a subscription on its own runtime and pool for `lifetime`, then drops the runtime:
/// every task is dropped wherever it is, connections close mid-statement. A killed process.
fn run_and_kill(url: String, ordering: Ordering, lifetime: Duration) {
    std::thread::spawn(move || {
        let runtime = common::victim_runtime();
        runtime.block_on(async {
            let pool = PgPool::connect(&url).await.expect("victim pool");
            let outbox = Outbox::<Note>::new(pool, OutboxConfig::default().sequencer(false))
                .await
                .expect("outbox");
            let config = JobConfig::new("killed")
                .ordering(ordering)
                .lease(Duration::from_millis(150))
                .retry(fast_retries(50))
                .batch(Batch::UpTo(3));
            let _handle = outbox
                .subscribe(config, Project { fail_rate: 0.1 })
                .await
                .expect("subscribe");
            tokio::time::sleep(lifetime).await;
        });
        runtime.shutdown_background();
    })
    .join()
    .expect("victim thread");
}

async fn killed_runners_apply_each_event_once(ordering: Ordering) {
    let db = TestDb::new().await;
    let outbox = projected_outbox(&db).await;
    publish(&outbox, 60, 2).await;
    for _ in 0..8 {
        let lifetime = Duration::from_millis(rand::rng().random_range(20..250));
        run_and_kill(db.url.clone(), ordering, lifetime);
    }
    // A last runner, with the same name, finishes the job once the dead one's lease expires.
    let config = JobConfig::new("killed")
        .ordering(ordering)
        .lease(Duration::from_millis(150))
        .retry(fast_retries(50));
    let handle = outbox
        .subscribe(config, Project { fail_rate: 0.0 })
        .await
        .expect("subscribe");
    let (status, done) = handle.wait_for(PATIENCE, |s| s.position.get() >= 120).await;
    assert!(done, "the last runner finished: {status:?}");
    handle.shutdown().await;
    assert_exactly_once(&db.pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runners_killed_at_random_points_apply_each_event_once_on_the_insert_lane() {
    killed_runners_apply_each_event_once(Ordering::Insert).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runners_killed_at_random_points_apply_each_event_once_on_the_commit_lane() {
    killed_runners_apply_each_event_once(Ordering::Commit).await;
}

/// Writes its projection row, then stalls past its lease on one chosen event (a zombie).
struct Stalls {
    stall_on: u32,
    stall: Duration,
    stalled: Arc<AtomicBool>,
}

impl Subscriber<Note> for Stalls {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        event: &Delivery<Note>,
    ) -> Result<(), HandlerError> {
        project(tx, event).await?;
        if event.payload.writer == self.stall_on && !self.stalled.swap(true, AtomicOrdering::SeqCst)
        {
            tokio::time::sleep(self.stall).await;
        }
        Ok(())
    }
}

async fn zombie_that_lost_its_lease_cannot_commit(ordering: Ordering) {
    let db = TestDb::new().await;
    let outbox = projected_outbox(&db).await;
    publish(&outbox, 20, 1).await;
    let lease = Duration::from_millis(300);
    let config = JobConfig::new("contested")
        .ordering(ordering)
        .lease(lease)
        .retry(fast_retries(5));
    let stalled = Arc::new(AtomicBool::new(false));
    let zombie = outbox
        .subscribe(
            config.clone(),
            Stalls {
                stall_on: 5,
                stall: Duration::from_millis(1_500),
                stalled: Arc::clone(&stalled),
            },
        )
        .await
        .expect("first runner");
    assert!(eventually(PATIENCE, || async { stalled.load(AtomicOrdering::SeqCst) }).await);
    // A second process competes for the same subscription.
    let other = Outbox::<Note>::new(db.another_pool(4).await, OutboxConfig::default())
        .await
        .expect("outbox");
    let rival = other
        .subscribe(
            config,
            Stalls {
                stall_on: u32::MAX,
                stall: Duration::ZERO,
                stalled: Arc::new(AtomicBool::new(true)),
            },
        )
        .await
        .expect("second runner");
    let (status, done) = rival.wait_for(PATIENCE, |s| s.position.get() >= 20).await;
    assert!(done, "the rival took over and finished: {status:?}");
    // The zombie wakes, tries to checkpoint, is refused (its writes roll back), and finds the
    // lease taken: it stands by.
    let (status, refused) = zombie
        .wait_for(PATIENCE, |s| s.state == SubscriptionState::Standby)
        .await;
    assert!(
        refused,
        "the zombie stands by after its refused checkpoint: {status:?}"
    );
    zombie.shutdown().await;
    rival.shutdown().await;
    assert_exactly_once(&db.pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_that_lost_its_lease_mid_handler_cannot_commit_on_the_insert_lane() {
    zombie_that_lost_its_lease_cannot_commit(Ordering::Insert).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_that_lost_its_lease_mid_handler_cannot_commit_on_the_commit_lane() {
    zombie_that_lost_its_lease_cannot_commit(Ordering::Commit).await;
}

/// Records every group it is handed, checking each is one whole transaction.
struct Groups {
    calls: Arc<AtomicU32>,
}

impl Subscriber<Note> for Groups {
    async fn handle(
        &self,
        _tx: &mut PgConnection,
        _event: &Delivery<Note>,
    ) -> Result<(), HandlerError> {
        Err("handle is not used in group mode".into())
    }

    async fn handle_group(
        &self,
        tx: &mut PgConnection,
        events: &[Delivery<Note>],
    ) -> Result<(), HandlerError> {
        let xid = events[0].commit_xid;
        if events.iter().any(|e| e.commit_xid != xid) {
            return Err("a group mixes transactions".into());
        }
        let size: i64 =
            sqlx::query_scalar("SELECT count(*) FROM ordo.events WHERE commit_xid = $1")
                .bind(xid)
                .fetch_one(&mut *tx)
                .await?;
        if size != events.len() as i64 {
            return Err(format!("got {} of the transaction's {size} events", events.len()).into());
        }
        for event in events {
            project(tx, event).await?;
        }
        self.calls.fetch_add(1, AtomicOrdering::SeqCst);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handle_group_sees_whole_source_transactions_only() {
    let db = TestDb::new().await;
    let outbox = projected_outbox(&db).await;
    let calls = Arc::new(AtomicU32::new(0));
    let config = JobConfig::new("groups")
        .ordering(Ordering::Commit)
        .batch(Batch::Groups)
        .retry(fast_retries(1));
    let handle = outbox
        .subscribe(
            config,
            Groups {
                calls: Arc::clone(&calls),
            },
        )
        .await
        .expect("subscribe");
    for n in 0..30u32 {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish_all((0..(1 + n % 5)).map(|k| Note { writer: n, n: k }))
            .expect("publish");
        tx.commit().await.expect("commit");
    }
    let total: u64 = (0..30u64).map(|n| 1 + n % 5).sum();
    let (status, done) = handle
        .wait_for(PATIENCE, |s| s.position.get() >= total)
        .await;
    assert!(done, "all groups handled: {status:?}");
    assert_eq!(
        calls.load(AtomicOrdering::SeqCst),
        30,
        "one call per source transaction"
    );
    assert_eq!(status.state, SubscriptionState::Running);
    handle.shutdown().await;
    assert_exactly_once(&db.pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_lane_that_differs_from_the_configured_one_is_refused() {
    let db = TestDb::new().await;
    let outbox = projected_outbox(&db).await;
    let handle = outbox
        .subscribe(JobConfig::new("orders"), Project { fail_rate: 0.0 })
        .await
        .expect("subscribe");
    handle.shutdown().await;
    let refused = outbox
        .subscribe(
            JobConfig::new("orders").ordering(Ordering::Commit),
            Project { fail_rate: 0.0 },
        )
        .await;
    match refused {
        Err(Error::LaneMismatch {
            subscription,
            stored,
            requested,
        }) => {
            assert_eq!(
                (subscription.as_str(), stored, requested),
                ("orders", Ordering::Insert, Ordering::Commit)
            );
        }
        Err(other) => panic!("expected a lane mismatch, got {other}"),
        Ok(_) => panic!("expected a lane mismatch, got a running subscription"),
    }
    let groups_on_insert = outbox
        .subscribe(
            JobConfig::new("other").batch(Batch::Groups),
            Project { fail_rate: 0.0 },
        )
        .await;
    assert!(matches!(groups_on_insert, Err(Error::InvalidConfig { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn halt_stops_at_the_poisoned_event_visibly_and_resumes_where_it_stopped() {
    let db = TestDb::new().await;
    let outbox = projected_outbox(&db).await;
    publish(&outbox, 6, 1).await;
    let broken = Arc::new(AtomicBool::new(true));
    let config = JobConfig::new("halting")
        .retry(fast_retries(3))
        .on_exhaustion(OnExhaustion::Halt)
        .lease(Duration::from_millis(300));
    let handle = outbox
        .subscribe(
            config,
            Poisoned {
                broken: Arc::clone(&broken),
            },
        )
        .await
        .expect("subscribe");
    let (status, halted) = handle
        .wait_for(PATIENCE, |s| s.state == SubscriptionState::Halted)
        .await;
    assert!(halted, "halted: {status:?}");
    assert_eq!(
        status.position.get(),
        3,
        "stopped right before the poisoned event"
    );
    assert!(
        status
            .last_error
            .as_deref()
            .unwrap_or_default()
            .contains("poison")
    );
    let (stored, attempts): (String, i32) =
        sqlx::query_as("SELECT status, attempts FROM ordo.subscriptions WHERE name = 'halting'")
            .fetch_one(&db.pool)
            .await
            .expect("row");
    assert_eq!((stored.as_str(), attempts), ("halted", 3));
    let projected: i64 = sqlx::query_scalar("SELECT count(*) FROM projection")
        .fetch_one(&db.pool)
        .await
        .expect("count");
    assert_eq!(projected, 3, "nothing after the poisoned event was handled");

    // The operator fixes the cause and resumes (what `ordo subscriptions resume` does).
    broken.store(false, AtomicOrdering::SeqCst);
    sqlx::query("UPDATE ordo.subscriptions SET status = 'active', attempts = 0, last_error = NULL WHERE name = 'halting'")
        .execute(&db.pool)
        .await
        .expect("resume");
    let (status, done) = handle.wait_for(PATIENCE, |s| s.position.get() >= 6).await;
    assert!(done, "resumed and finished: {status:?}");
    handle.shutdown().await;
    assert_exactly_once(&db.pool).await;
}

/// Fails on writer 3's event; on the attempt numbered `last` it first tells the test and waits
/// for its go.
struct HeldPoison {
    last: u32,
    reached: tokio::sync::mpsc::UnboundedSender<()>,
    go: Arc<tokio::sync::Notify>,
}

impl Subscriber<Note> for HeldPoison {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        event: &Delivery<Note>,
    ) -> Result<(), HandlerError> {
        if event.payload.writer == 3 {
            if event.attempt() == self.last {
                let _ = self.reached.send(());
                self.go.notified().await;
            }
            return Err("writer 3 is poison".into());
        }
        Project { fail_rate: 0.0 }.handle(tx, event).await
    }
}

/// A halt is fenced by the lease and the position: the handler exhausts its attempts on a
/// poisoned event while an operator moves the subscription past it (which also ends the
/// runner's lease). The halt is refused; the runner claims again and goes on from where the
/// operator put it, never halted, the poisoned event never applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halt_after_an_operator_moved_the_subscription_is_refused_and_the_runner_goes_on() {
    let db = TestDb::new().await;
    let outbox = projected_outbox(&db).await;
    // Writer 3's event is the fourth: position 4.
    publish(&outbox, 6, 1).await;
    let (reached, mut at_last_attempt) = tokio::sync::mpsc::unbounded_channel();
    let go = Arc::new(tokio::sync::Notify::new());
    let config = JobConfig::new("fenced")
        .retry(fast_retries(3))
        .on_exhaustion(OnExhaustion::Halt)
        .lease(Duration::from_secs(5));
    let subscriber = HeldPoison {
        last: 3,
        reached,
        go: Arc::clone(&go),
    };
    let handle = outbox
        .subscribe(config, subscriber)
        .await
        .expect("subscribe");
    tokio::time::timeout(PATIENCE, at_last_attempt.recv())
        .await
        .expect("the poisoned event's last attempt")
        .expect("the handler's sender");
    ordo::admin::reset_subscription(
        &db.pool,
        "fenced",
        Position::Insert(EventSequence::new(4)),
        false,
    )
    .await
    .expect("move the subscription past the poisoned event");
    go.notify_one();

    let (status, done) = handle.wait_for(PATIENCE, |s| s.position.get() >= 6).await;
    assert!(done, "went on from where the operator put it: {status:?}");
    let stored: String =
        sqlx::query_scalar("SELECT status FROM ordo.subscriptions WHERE name = 'fenced'")
            .fetch_one(&db.pool)
            .await
            .expect("row");
    assert_eq!(stored, "active", "the refused halt left the row as it was");
    let projected: i64 = sqlx::query_scalar("SELECT count(*) FROM projection")
        .fetch_one(&db.pool)
        .await
        .expect("count");
    assert_eq!(projected, 5, "every event but the poisoned one, once");
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_records_the_event_with_its_error_and_moves_on_including_undecodable_ones() {
    let db = TestDb::new().await;
    let outbox = projected_outbox(&db).await;
    publish(&outbox, 5, 1).await;
    sqlx::query(r#"INSERT INTO ordo.events (payload) VALUES ('{"not": "a note"}')"#)
        .execute(&db.pool)
        .await
        .expect("undecodable event");
    publish(&outbox, 2, 1).await;
    let config = JobConfig::new("dead-lettering")
        .ordering(Ordering::Commit)
        .retry(fast_retries(2))
        .on_exhaustion(OnExhaustion::DeadLetter);
    let handle = outbox
        .subscribe(
            config,
            Poisoned {
                broken: Arc::new(AtomicBool::new(true)),
            },
        )
        .await
        .expect("subscribe");
    let (status, done) = handle.wait_for(PATIENCE, |s| s.position.get() >= 8).await;
    assert!(done, "moved past both failures: {status:?}");
    handle.shutdown().await;
    let letters: Vec<(i64, String, i32, Option<serde_json::Value>)> = sqlx::query_as(
        "SELECT sequence, error, attempts, payload FROM ordo.dead_letters WHERE subscription = 'dead-lettering' ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await
    .expect("dead letters");
    assert_eq!(letters.len(), 2, "{letters:?}");
    assert_eq!(
        (letters[0].0, letters[0].2),
        (4, 2),
        "writer 3's event after two attempts"
    );
    assert!(letters[0].1.contains("poison"));
    assert_eq!(
        (letters[1].0, letters[1].2),
        (6, 1),
        "the undecodable event is not retried"
    );
    assert!(letters[1].1.contains("does not decode"));
    assert_eq!(letters[1].3, Some(serde_json::json!({"not": "a note"})));
    let projected: i64 = sqlx::query_scalar("SELECT count(*) FROM projection")
        .fetch_one(&db.pool)
        .await
        .expect("count");
    assert_eq!(projected, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_under_load_finishes_the_event_in_hand_and_checkpoints_it() {
    let db = TestDb::new().await;
    let outbox = projected_outbox(&db).await;
    let writing = tokio::spawn({
        let outbox = outbox.clone();
        async move { publish(&outbox, 300, 1).await }
    });
    let config = JobConfig::new("busy").batch(Batch::UpTo(5));
    let handle = outbox
        .subscribe(config, Project { fail_rate: 0.0 })
        .await
        .expect("subscribe");
    assert!(wait_projected(&db.pool, 50).await);
    handle.shutdown().await;
    let status = handle.status();
    assert_eq!(status.state, SubscriptionState::Stopped);
    let (position, owner): (i64, Option<uuid::Uuid>) =
        sqlx::query_as("SELECT position, lease_owner FROM ordo.subscriptions WHERE name = 'busy'")
            .fetch_one(&db.pool)
            .await
            .expect("row");
    assert!(owner.is_none(), "the lease is released");
    let (rows, beyond): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(*) FILTER (WHERE sequence > $1) FROM projection")
            .bind(position)
            .fetch_one(&db.pool)
            .await
            .expect("projection");
    assert_eq!(beyond, 0, "nothing applied past the checkpoint");
    assert_eq!(
        rows, position,
        "everything up to the checkpoint applied once"
    );
    writing.await.expect("writer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backoff_longer_than_half_the_lease_is_refused_naming_both_settings() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let config = JobConfig::new("impatient").lease(Duration::from_secs(1));
    match outbox.subscribe(config, Project { fail_rate: 0.0 }).await {
        Err(Error::InvalidConfig { setting, .. }) => assert_eq!(setting, "retry.max_backoff/lease"),
        Err(other) => panic!("expected an invalid config, got {other}"),
        Ok(_) => panic!("expected an invalid config, got a running subscription"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_outside_its_bounds_is_refused_naming_it() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let too_short = ordo::MIN_LEASE / 2;
    // A century: the server would refuse it as the handler transaction's idle limit.
    let too_long = Duration::from_secs(100 * 365 * 24 * 3600);
    for lease in [
        too_short,
        ordo::MAX_LEASE + Duration::from_secs(1),
        too_long,
    ] {
        let config = JobConfig::new("bounded")
            .lease(lease)
            .retry(ordo::RetryPolicy {
                max_attempts: 3,
                initial_backoff: Duration::from_millis(1),
                max_backoff: Duration::from_millis(10),
            });
        match outbox.subscribe(config, Project { fail_rate: 0.0 }).await {
            Err(Error::InvalidConfig { setting, reason }) => {
                assert_eq!(setting, "lease");
                assert!(reason.contains("100 ms to 24 hours"), "{reason}");
            }
            Err(other) => panic!("expected an invalid config for {lease:?}, got {other}"),
            Ok(_) => panic!("a lease of {lease:?} was accepted"),
        }
    }
    let config = JobConfig::new("bounded").lease(ordo::MAX_LEASE);
    let handle = outbox
        .subscribe(config, Project { fail_rate: 0.0 })
        .await
        .expect("the longest lease is taken");
    handle.shutdown().await;
}
