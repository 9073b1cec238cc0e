//! The consumer inbox in watermark mode, on a real PostgreSQL: one mark per source, gaps
//! refused until filled, duplicates absorbed, concurrent out-of-order delivery, failures.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::inbox::{Recording, all_effects, effects, effects_table};
use common::{TestDb, eventually};
use ordo::inbox::{self, Inbox, InboxConfig, InboxMessage, InboxMode, Receipt};
use rand::seq::SliceRandom;

const PATIENCE: Duration = Duration::from_secs(60);

async fn setup(max_attempts: u32) -> (TestDb, Inbox) {
    let db = TestDb::new().await;
    effects_table(&db.pool).await;
    let config = InboxConfig::new("replica")
        .mode(InboxMode::Watermark)
        .max_attempts(max_attempts);
    let inbox = Inbox::new(db.pool.clone(), config).expect("inbox");
    (db, inbox)
}

fn at(source: &str, position: u64) -> InboxMessage {
    InboxMessage::new(
        format!("{source}-{position}"),
        format!("{{\"n\":{position}}}"),
    )
    .with_source(source, position)
}

async fn marks(db: &TestDb) -> Vec<(String, u64)> {
    let marks = inbox::list_watermarks(&db.pool, Some("replica"))
        .await
        .expect("marks");
    marks.into_iter().map(|m| (m.source, m.position)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_is_refused_until_the_replay_fills_it_and_duplicates_are_absorbed() {
    let (db, inbox) = setup(5).await;
    let handler = Recording::default();
    let mut receipts = Vec::new();
    for (source, position) in [("a", 1), ("a", 3), ("a", 2), ("a", 3), ("a", 2), ("a", 1)] {
        let receipt = inbox.receive(&at(source, position), &handler).await;
        receipts.push(receipt.expect("receive"));
    }
    assert_eq!(
        receipts,
        [
            Receipt::Handled,
            Receipt::Gap { expected: 2 },
            Receipt::Handled,
            Receipt::Handled,
            Receipt::Duplicate,
            Receipt::Duplicate,
        ]
    );
    assert!(!receipts[1].settled());
    for position in 1..=3 {
        assert_eq!(effects(&db.pool, &format!("a-{position}")).await, 1);
    }
    // Another source has a mark of its own; still one row per source, none per message.
    for position in 1..=3 {
        let receipt = inbox.receive(&at("b", position), &handler).await;
        assert_eq!(receipt.expect("receive"), Receipt::Handled);
    }
    assert_eq!(marks(&db).await, [("a".to_owned(), 3), ("b".to_owned(), 3)]);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM ordo.inbox")
        .fetch_one(&db.pool)
        .await
        .expect("count");
    assert_eq!(rows, 0);
    // A message without a source and position is refused in this mode.
    let bare = inbox.receive(&InboxMessage::new("x", "{}"), &handler).await;
    assert!(matches!(bare, Err(ordo::Error::InvalidInboxMessage { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_out_of_order_redeliveries_take_effect_once_each_in_order() {
    let (db, _) = setup(5).await;
    sqlx::query("ALTER TABLE effects ADD COLUMN seq BIGINT GENERATED ALWAYS AS IDENTITY")
        .execute(&db.pool)
        .await
        .expect("order column");
    let handler = Arc::new(Recording::default());
    const N: u64 = 40;
    let mut tasks = Vec::new();
    for receiver in 0..6 {
        let pool = db.another_pool(2).await;
        let config = InboxConfig::new("replica").mode(InboxMode::Watermark);
        let inbox = Inbox::new(pool, config).expect("inbox");
        let handler = Arc::clone(&handler);
        tasks.push(tokio::spawn(async move {
            // Each receiver gets every position twice, shuffled: a redelivering transport.
            let mut todo: Vec<u64> = (1..=N).chain(1..=N).collect();
            todo.shuffle(&mut rand::rng());
            let deadline = tokio::time::Instant::now() + PATIENCE;
            while let Some(position) = todo.pop() {
                let receipt = inbox.receive(&at("a", position), &*handler).await;
                if !receipt.expect("receive").settled() {
                    // A gap or busy: redelivered later.
                    todo.insert(0, position);
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "receiver {receiver} stuck"
                    );
                    tokio::task::yield_now().await;
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("receiver");
    }
    assert_eq!(all_effects(&db.pool).await, N as i64);
    let order: Vec<String> = sqlx::query_scalar("SELECT message_id FROM effects ORDER BY seq")
        .fetch_all(&db.pool)
        .await
        .expect("order");
    let expected: Vec<String> = (1..=N).map(|p| format!("a-{p}")).collect();
    assert_eq!(order, expected);
    assert_eq!(handler.calls(), N as u32);
    assert_eq!(marks(&db).await, [("a".to_owned(), N)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_being_handled_elsewhere_is_busy_at_once() {
    let (db, inbox) = setup(5).await;
    let slow = Arc::new(Recording::holding(Duration::from_secs(2)));
    let running = {
        let (inbox, slow) = (inbox.clone(), Arc::clone(&slow));
        tokio::spawn(async move { inbox.receive(&at("a", 1), &*slow).await })
    };
    // The handler has written its effect (after the mark moved, under the mark's row lock).
    let in_handler = eventually(PATIENCE, || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE relation = 'effects'::regclass
                 AND mode = 'RowExclusiveLock' AND pid <> pg_backend_pid())",
        )
        .fetch_one(&db.pool)
        .await
        .expect("locks")
    })
    .await;
    assert!(in_handler);
    let other = Recording::default();
    for position in [1, 2] {
        let receipt = inbox.receive(&at("a", position), &other).await;
        assert_eq!(
            receipt.expect("receive"),
            Receipt::Busy,
            "position {position}"
        );
    }
    assert_eq!(other.calls(), 0);
    assert_eq!(
        running.await.expect("task").expect("receive"),
        Receipt::Handled
    );
    let next = inbox.receive(&at("a", 2), &other).await.expect("receive");
    assert_eq!(next, Receipt::Handled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_position_failing_to_the_maximum_is_dead_lettered_the_source_moves_on_and_replay_runs_it()
{
    let (db, inbox) = setup(2).await;
    let handler = Recording::failing(2);
    let first = inbox.receive(&at("a", 1), &handler).await.expect("receive");
    assert!(
        matches!(first, Receipt::Retry { attempts: 1, .. }),
        "{first:?}"
    );
    let stored = inbox::list_watermarks(&db.pool, None).await.expect("marks");
    assert_eq!(stored[0].position, 0);
    assert_eq!(stored[0].failing_position, Some(1));
    assert_eq!(stored[0].last_error.as_deref(), Some("planned failure 1"));
    let second = inbox.receive(&at("a", 1), &handler).await.expect("receive");
    assert!(
        matches!(second, Receipt::Failed { attempts: 2, .. }),
        "{second:?}"
    );
    assert!(second.settled());
    assert_eq!(marks(&db).await, [("a".to_owned(), 1)]);
    assert_eq!(effects(&db.pool, "a-1").await, 0);
    // The source goes on; a redelivery of the failed position is absorbed.
    let ok = Recording::default();
    let next = inbox.receive(&at("a", 2), &ok).await.expect("receive");
    assert_eq!(next, Receipt::Handled);
    let again = inbox.receive(&at("a", 1), &handler).await.expect("receive");
    assert_eq!(again, Receipt::Duplicate);
    let failed = inbox::list_failed(&db.pool, Some("replica"))
        .await
        .expect("list");
    assert_eq!(failed.len(), 1);
    assert_eq!(
        (failed[0].id.as_str(), failed[0].position),
        ("a-1", Some(1))
    );
    assert_eq!(failed[0].payload.as_deref(), Some(r#"{"n":1}"#));

    assert_eq!(
        inbox::replay_all(&db.pool, Some("replica"))
            .await
            .expect("replay"),
        1
    );
    let ran = inbox.run_pending(&handler, 10).await.expect("run");
    assert_eq!(ran, [("a-1".to_owned(), Receipt::Handled)]);
    assert_eq!(effects(&db.pool, "a-1").await, 1);
    assert!(
        inbox
            .run_pending(&handler, 10)
            .await
            .expect("run")
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_joining_late_starts_from_a_set_watermark() {
    let (db, inbox) = setup(5).await;
    let handler = Recording::default();
    let refused = inbox
        .receive(&at("a", 1001), &handler)
        .await
        .expect("receive");
    assert_eq!(refused, Receipt::Gap { expected: 1 });
    inbox::set_watermark(&db.pool, "replica", "a", 1000)
        .await
        .expect("set");
    let handled = inbox
        .receive(&at("a", 1001), &handler)
        .await
        .expect("receive");
    assert_eq!(handled, Receipt::Handled);
    assert_eq!(marks(&db).await, [("a".to_owned(), 1001)]);
}

/// `source`'s message at `position` of server history `history`, which began at `start`; its
/// id names the history, as a new event at a reused position has a new id.
fn on_history(source: &str, position: u64, history: u64, start: u64) -> InboxMessage {
    InboxMessage::new(
        format!("{source}-h{history}-{position}"),
        format!("{{\"n\":{position}}}"),
    )
    .with_source(source, position)
    .with_history(ordo::ServerHistory {
        id: history,
        first_position: start,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_history_below_the_mark_is_a_rewind_reported_and_taken_not_dropped() {
    let (db, inbox) = setup(5).await;
    let handler = Recording::default();
    for position in 1..=5 {
        let receipt = inbox
            .receive(&on_history("a", position, 1, 1), &handler)
            .await;
        assert_eq!(receipt.expect("receive"), Receipt::Handled);
    }
    // History 2 began at 3; its 3 was the same event as before (a broker dropped it as a
    // duplicate id), so 4 comes first: a rewind, and 4 is taken inside the rewound range.
    let mut receipts = Vec::new();
    for message in [
        on_history("a", 4, 2, 3),
        on_history("a", 5, 2, 3),
        // The old history above the mark: an event the sender lost.
        on_history("a", 6, 1, 1),
        // Past the rewound range, positions are dense again.
        on_history("a", 7, 2, 3),
        on_history("a", 6, 2, 3),
        on_history("a", 7, 2, 3),
        // Redeliveries of either history at or below the mark.
        on_history("a", 4, 2, 3),
        on_history("a", 2, 1, 1),
    ] {
        receipts.push(inbox.receive(&message, &handler).await.expect("receive"));
    }
    assert_eq!(
        receipts,
        [
            Receipt::Handled,
            Receipt::Handled,
            Receipt::Duplicate,
            Receipt::Gap { expected: 6 },
            Receipt::Handled,
            Receipt::Handled,
            Receipt::Duplicate,
            Receipt::Duplicate,
        ]
    );
    for id in ["a-h1-5", "a-h2-4", "a-h2-5", "a-h2-6", "a-h2-7"] {
        assert_eq!(effects(&db.pool, id).await, 1, "{id} took effect once");
    }
    assert_eq!(
        effects(&db.pool, "a-h1-6").await,
        0,
        "the lost event is not taken"
    );
    let marks = inbox::list_watermarks(&db.pool, Some("replica"))
        .await
        .expect("marks");
    let mark = &marks[0];
    assert_eq!((mark.position, mark.history), (7, Some(2)));
    let rewind = mark.rewind.as_ref().expect("the rewind is recorded");
    assert_eq!(
        (rewind.from, rewind.through, rewind.lost_history),
        (3, 5, Some(1))
    );
    let shown = ordo::admin::watermarks_table(&marks);
    assert!(
        shown.contains("positions 3 to 5 were given again"),
        "{shown}"
    );

    // A newer history that began above the mark is no rewind.
    let receipt = inbox.receive(&on_history("a", 8, 3, 8), &handler).await;
    assert_eq!(receipt.expect("receive"), Receipt::Handled);
    let marks = inbox::list_watermarks(&db.pool, Some("replica"))
        .await
        .expect("marks");
    assert_eq!(marks[0].rewind.as_ref().map(|r| r.from), Some(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_inside_a_rewound_range_is_retried_not_taken_for_a_duplicate() {
    let (db, inbox) = setup(5).await;
    let handler = Recording::default();
    for position in 1..=4 {
        let receipt = inbox
            .receive(&on_history("b", position, 1, 1), &handler)
            .await;
        assert_eq!(receipt.expect("receive"), Receipt::Handled);
    }
    // History 2 began at 2; 3 comes first, and its handler fails once.
    let failing = Recording::failing(1);
    let first = inbox.receive(&on_history("b", 3, 2, 2), &failing).await;
    assert!(
        matches!(first, Ok(Receipt::Retry { attempts: 1, .. })),
        "{first:?}"
    );
    let again = inbox.receive(&on_history("b", 3, 2, 2), &failing).await;
    assert_eq!(again.expect("receive"), Receipt::Handled);
    assert_eq!(effects(&db.pool, "b-h2-3").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_that_cannot_be_is_refused_for_good() {
    let (_db, inbox) = setup(5).await;
    let handler = Recording::default();
    for (position, start) in [(5, 0), (5, 6)] {
        let refused = inbox
            .receive(&on_history("c", position, 2, start), &handler)
            .await;
        assert!(
            matches!(refused, Err(ordo::Error::InvalidInboxMessage { .. })),
            "start {start} at {position}: {refused:?}"
        );
    }
    assert_eq!(handler.calls(), 0);
}
