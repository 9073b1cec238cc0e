//! The consumer inbox in row-per-message mode, on a real PostgreSQL: deduplication across
//! redeliveries, receivers and pools; never two runs at once; failures counted across the
//! rollback, dead-lettered and replayed; crashed attempts.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::inbox::{
    Recording, deliver_until_settled, effects, effects_table, receive_when_free, status,
};
use common::{TestDb, eventually};
use ordo::inbox::{self, Inbox, InboxConfig, InboxMessage, Receipt};

const PATIENCE: Duration = Duration::from_secs(30);

async fn setup(consumer: &str) -> (TestDb, Inbox) {
    let db = TestDb::new().await;
    effects_table(&db.pool).await;
    let inbox = Inbox::new(db.pool.clone(), InboxConfig::new(consumer)).expect("inbox");
    (db, inbox)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_received_three_times_runs_its_handler_once() {
    let (db, inbox) = setup("billing").await;
    let handler = Recording::default();
    let message = InboxMessage::new("m-1", r#"{"order":1}"#);
    let mut receipts = Vec::new();
    for _ in 0..3 {
        receipts.push(inbox.receive(&message, &handler).await.expect("receive"));
    }
    assert_eq!(
        receipts,
        [Receipt::Handled, Receipt::Duplicate, Receipt::Duplicate]
    );
    assert!(receipts.iter().all(Receipt::settled));
    assert_eq!(handler.calls(), 1);
    assert_eq!(effects(&db.pool, "m-1").await, 1);
    assert_eq!(
        status(&db.pool, "billing", "m-1").await.as_deref(),
        Some("completed")
    );
    // Another consumer name handles the same message once more, for itself.
    let other = Inbox::new(db.pool.clone(), InboxConfig::new("audit")).expect("inbox");
    assert_eq!(
        other.receive(&message, &handler).await.expect("receive"),
        Receipt::Handled
    );
    assert_eq!(effects(&db.pool, "m-1").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_receivers_on_several_pools_run_each_message_once_and_never_twice_at_once() {
    let (db, _) = setup("billing").await;
    // The first run of each message fails after its effect, so each runs at least twice, and
    // every run holds its transaction long enough for the others to arrive meanwhile.
    let handler = Arc::new(Recording::new(1, Duration::from_millis(50)));
    let mut inboxes = Vec::new();
    for _ in 0..3 {
        let pool = db.another_pool(4).await;
        inboxes.push(Inbox::new(pool, InboxConfig::new("billing")).expect("inbox"));
    }
    let mut tasks = Vec::new();
    for receiver in 0..9 {
        let inbox = inboxes[receiver % 3].clone();
        let handler = Arc::clone(&handler);
        tasks.push(tokio::spawn(async move {
            for n in 0..3 {
                let message = InboxMessage::new(format!("m-{n}"), "{}");
                // Three deliveries per receiver, each retried until settled.
                for _ in 0..3 {
                    deliver_until_settled(&inbox, &message, &handler).await;
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("receiver task");
    }
    for n in 0..3 {
        assert_eq!(effects(&db.pool, &format!("m-{n}")).await, 1, "m-{n}");
    }
    assert_eq!(
        handler.most_at_once(),
        1,
        "a message ran in two receivers at once"
    );
    // One failed run and one that committed per message.
    assert_eq!(handler.calls(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_message_delivered_at_once_through_three_pools_runs_its_handler_once() {
    let (db, _) = setup("billing").await;
    let handler = Arc::new(Recording::holding(Duration::from_millis(100)));
    let barrier = Arc::new(tokio::sync::Barrier::new(3));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let inbox =
            Inbox::new(db.another_pool(2).await, InboxConfig::new("billing")).expect("inbox");
        let (handler, barrier) = (Arc::clone(&handler), Arc::clone(&barrier));
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let message = InboxMessage::new("m-1", "{}");
            inbox.receive(&message, &*handler).await.expect("receive")
        }));
    }
    let mut receipts = Vec::new();
    for task in tasks {
        receipts.push(task.await.expect("receiver"));
    }
    let handled = receipts.iter().filter(|r| **r == Receipt::Handled).count();
    assert_eq!(handled, 1, "{receipts:?}");
    assert!(
        receipts
            .iter()
            .all(|r| matches!(r, Receipt::Handled | Receipt::Busy | Receipt::Duplicate)),
        "{receipts:?}"
    );
    assert_eq!(handler.calls(), 1);
    assert_eq!(effects(&db.pool, "m-1").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_being_handled_elsewhere_is_busy_at_once_and_processing_is_visible() {
    let (db, inbox) = setup("billing").await;
    let slow = Arc::new(Recording::holding(Duration::from_secs(2)));
    let message = InboxMessage::new("m-1", "{}");
    let running = {
        let (inbox, slow, message) = (inbox.clone(), Arc::clone(&slow), message.clone());
        tokio::spawn(async move { inbox.receive(&message, &*slow).await })
    };
    let seen = eventually(PATIENCE, || async {
        status(&db.pool, "billing", "m-1").await.as_deref() == Some("processing")
    })
    .await;
    assert!(seen, "the claim is not visible as processing");
    let other = Recording::default();
    assert_eq!(
        inbox.receive(&message, &other).await.expect("receive"),
        Receipt::Busy
    );
    assert_eq!(other.calls(), 0);
    let first = running.await.expect("task").expect("receive");
    assert_eq!(first, Receipt::Handled);
    assert_eq!(
        inbox.receive(&message, &other).await.expect("receive"),
        Receipt::Duplicate
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_failing_three_times_is_failed_with_its_error_and_runs_once_when_replayed() {
    let db = TestDb::new().await;
    effects_table(&db.pool).await;
    let config = InboxConfig::new("billing").max_attempts(3);
    let inbox = Inbox::new(db.pool.clone(), config).expect("inbox");
    let handler = Recording::failing(3);
    let message = InboxMessage::new("m-1", r#"{"order":1}"#);
    let mut receipts = Vec::new();
    for _ in 0..4 {
        receipts.push(inbox.receive(&message, &handler).await.expect("receive"));
    }
    let planned = |n: u32| format!("planned failure {n}");
    assert_eq!(
        receipts,
        [
            Receipt::Retry {
                attempts: 1,
                error: planned(1)
            },
            Receipt::Retry {
                attempts: 2,
                error: planned(2)
            },
            Receipt::Failed {
                attempts: 3,
                error: planned(3)
            },
            // Failed for good: not run again.
            Receipt::Failed {
                attempts: 3,
                error: planned(3)
            },
        ]
    );
    assert_eq!(handler.calls(), 3);
    assert_eq!(
        effects(&db.pool, "m-1").await,
        0,
        "a failed run's effect stayed"
    );
    let failed = inbox::list_failed(&db.pool, Some("billing"))
        .await
        .expect("list");
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].id, "m-1");
    assert_eq!(failed[0].attempts, 3);
    assert_eq!(failed[0].error.as_deref(), Some(planned(3).as_str()));
    assert_eq!(failed[0].payload.as_deref(), Some(r#"{"order":1}"#));

    let unknown = inbox::replay(&db.pool, Some("billing"), "m-2").await;
    assert!(matches!(
        unknown,
        Err(ordo::Error::UnknownInboxMessage { .. })
    ));
    assert_eq!(
        inbox::replay(&db.pool, None, "m-1").await.expect("replay"),
        1
    );
    assert_eq!(
        status(&db.pool, "billing", "m-1").await.as_deref(),
        Some("pending")
    );
    let ran = inbox.run_pending(&handler, 100).await.expect("run pending");
    assert_eq!(ran, [("m-1".to_owned(), Receipt::Handled)]);
    assert!(
        inbox
            .run_pending(&handler, 100)
            .await
            .expect("run")
            .is_empty()
    );
    assert_eq!(
        inbox.receive(&message, &handler).await.expect("receive"),
        Receipt::Duplicate
    );
    assert_eq!(handler.calls(), 4);
    assert_eq!(effects(&db.pool, "m-1").await, 1);
    assert!(
        inbox::list_failed(&db.pool, None)
            .await
            .expect("list")
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_dies_in_the_handler_is_counted_and_the_message_runs_again() {
    let db = TestDb::new().await;
    effects_table(&db.pool).await;
    let inbox =
        Inbox::new(db.pool.clone(), InboxConfig::new("billing").max_attempts(2)).expect("inbox");
    let stuck = Recording::holding(Duration::from_secs(3600));
    let message = InboxMessage::new("m-1", "{}");
    // The receiver is dropped mid-handler, as a process that dies there.
    let dropped = tokio::time::timeout(Duration::from_millis(300), inbox.receive(&message, &stuck));
    assert!(dropped.await.is_err(), "the stuck handler returned");
    assert_eq!(
        status(&db.pool, "billing", "m-1").await.as_deref(),
        Some("processing")
    );
    let handler = Recording::default();
    let receipt = receive_when_free(&inbox, &message, &handler).await;
    assert_eq!(receipt, Receipt::Handled);
    assert_eq!(effects(&db.pool, "m-1").await, 1);
    let attempts: i32 =
        sqlx::query_scalar("SELECT attempts FROM ordo.inbox WHERE message_id = 'm-1'")
            .fetch_one(&db.pool)
            .await
            .expect("attempts");
    assert_eq!(attempts, 1, "the dead attempt was not counted");

    // A message whose every attempt dies is failed at the maximum, without a run.
    let poison = InboxMessage::new("m-2", "{}");
    for _ in 0..2 {
        let gone = tokio::time::timeout(Duration::from_millis(300), inbox.receive(&poison, &stuck));
        assert!(gone.await.is_err());
        // Wait for the dropped connection's lock to go.
        let free = eventually(PATIENCE, || async {
            sqlx::query_scalar::<_, bool>(
                "SELECT NOT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))",
            )
            .fetch_one(&db.pool)
            .await
            .expect("locks")
        })
        .await;
        assert!(free);
    }
    let last = inbox.receive(&poison, &handler).await.expect("receive");
    assert!(
        matches!(last, Receipt::Failed { attempts: 2, .. }),
        "{last:?}"
    );
    assert_eq!(effects(&db.pool, "m-2").await, 0);
}

/// Writes a row whose deferred foreign key fails only at `COMMIT`.
struct ViolatesAtCommit;

impl ordo::inbox::InboxHandler for ViolatesAtCommit {
    async fn handle(
        &self,
        tx: &mut sqlx::PgConnection,
        _message: &InboxMessage,
    ) -> Result<(), ordo::HandlerError> {
        sqlx::query("INSERT INTO child (parent) VALUES (1)")
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_refused_by_the_server_is_a_failed_attempt() {
    let (db, inbox) = setup("billing").await;
    for statement in [
        "CREATE TABLE parent (id INT PRIMARY KEY)",
        "CREATE TABLE child (parent INT REFERENCES parent DEFERRABLE INITIALLY DEFERRED)",
    ] {
        sqlx::query(statement)
            .execute(&db.pool)
            .await
            .expect("table");
    }
    let message = InboxMessage::new("m-1", "{}");
    let receipt = inbox
        .receive(&message, &ViolatesAtCommit)
        .await
        .expect("receive");
    let Receipt::Retry { attempts, error } = receipt else {
        panic!("{receipt:?}");
    };
    assert_eq!(attempts, 1);
    assert!(
        error.contains("did not commit") && error.contains("foreign key"),
        "{error}"
    );
    assert_eq!(
        status(&db.pool, "billing", "m-1").await.as_deref(),
        Some("pending")
    );
    let handler = Recording::default();
    let receipt = inbox.receive(&message, &handler).await.expect("receive");
    assert_eq!(receipt, Receipt::Handled);
}
