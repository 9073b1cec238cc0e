//! The operator's side of subscriptions: a takeover that happens although the owner stalled
//! holding the subscription's row lock; resets that refuse to skip past the head; deleting a
//! subscription; dead letters listed, retried and purged.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::Duration;

use common::subscribers::{
    PATIENCE, Poisoned, assert_exactly_once, fast_retries, project, projected_outbox, publish,
};
use common::{Note, TestDb, eventually};
use ordo::{
    CommitSequence, Delivery, Error, EventSequence, HandlerError, JobConfig, Ordering, Outbox,
    OutboxConfig, Position, Subscriber, SubscriptionState,
};
use sqlx::{PgConnection, PgPool};
use tokio::sync::Notify;

/// Projects each event. On `stall_on`, once, it also locks the subscription's row (as the
/// runner's checkpoint does) and then stalls until released: an owner frozen between its
/// checkpoint and its COMMIT.
struct FreezesHoldingTheRow {
    subscription: &'static str,
    stall_on: u32,
    stalled: Arc<AtomicBool>,
    release: Arc<Notify>,
}

impl Subscriber<Note> for FreezesHoldingTheRow {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        event: &Delivery<Note>,
    ) -> Result<(), HandlerError> {
        project(tx, event).await?;
        if event.payload.writer == self.stall_on && !self.stalled.load(AtomicOrdering::SeqCst) {
            sqlx::query("UPDATE ordo.subscriptions SET updated_at = now() WHERE name = $1")
                .bind(self.subscription)
                .execute(&mut *tx)
                .await?;
            self.stalled.store(true, AtomicOrdering::SeqCst);
            // Far longer than the lease; the test releases it once it has seen the takeover.
            let _ = tokio::time::timeout(Duration::from_secs(40), self.release.notified()).await;
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_from_an_owner_stalled_holding_the_row_lock() {
    let db = TestDb::new().await;
    let outbox = projected_outbox(&db).await;
    publish(&outbox, 20, 1).await;
    let config = JobConfig::new("frozen")
        .lease(Duration::from_millis(400))
        .retry(fast_retries(5));
    let stalled = Arc::new(AtomicBool::new(false));
    let release = Arc::new(Notify::new());
    let owner = outbox
        .subscribe(
            config.clone(),
            FreezesHoldingTheRow {
                subscription: "frozen",
                stall_on: 5,
                stalled: Arc::clone(&stalled),
                release: Arc::clone(&release),
            },
        )
        .await
        .expect("owner");
    assert!(eventually(PATIENCE, || async { stalled.load(AtomicOrdering::SeqCst) }).await);

    let other = Outbox::<Note>::new(db.another_pool(4).await, OutboxConfig::default())
        .await
        .expect("outbox");
    // The owner is frozen far longer than this: starting the standby (which creates the row if
    // missing) and its takeover must not wait for it.
    let takeover = tokio::time::timeout(Duration::from_secs(10), async {
        let standby = other
            .subscribe(
                config,
                FreezesHoldingTheRow {
                    subscription: "frozen",
                    stall_on: u32::MAX,
                    stalled: Arc::new(AtomicBool::new(true)),
                    release: Arc::new(Notify::new()),
                },
            )
            .await
            .expect("standby");
        let (status, done) = standby
            .wait_for(Duration::from_secs(10), |s| s.position.get() >= 20)
            .await;
        (standby, status, done)
    })
    .await;
    release.notify_one();
    let Ok((standby, status, true)) = takeover else {
        panic!("the standby did not take over from the stalled owner within 10 s");
    };
    assert!(status.position.get() >= 20);
    // The owner wakes to a transaction the server ended: nothing of it commits, and it stands by.
    let (status, fenced) = owner
        .wait_for(PATIENCE, |s| s.state == SubscriptionState::Standby)
        .await;
    assert!(fenced, "the stalled owner stands by: {status:?}");
    owner.shutdown().await;
    standby.shutdown().await;
    assert_exactly_once(&db.pool).await;
}

/// Three events (head 3) and two idle subscriptions, one per lane, at position 0.
async fn idle_subscriptions(pool: &PgPool) {
    sqlx::query("INSERT INTO ordo.events (payload) VALUES ('1'), ('2'), ('3')")
        .execute(pool)
        .await
        .expect("events");
    sqlx::query(
        "INSERT INTO ordo.subscriptions (name, lane, position) VALUES ('ins', 'insert', 0), ('com', 'commit', 0)",
    )
    .execute(pool)
    .await
    .expect("subscriptions");
}

async fn position_of(pool: &PgPool, name: &str) -> i64 {
    sqlx::query_scalar("SELECT position FROM ordo.subscriptions WHERE name = $1")
        .bind(name)
        .fetch_one(pool)
        .await
        .expect("position")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_past_the_head_is_refused_unless_forced() {
    let db = TestDb::new().await;
    idle_subscriptions(&db.pool).await;
    let refused = ordo::admin::reset_subscription(
        &db.pool,
        "ins",
        Position::Insert(EventSequence::new(999)),
        false,
    )
    .await;
    match refused {
        Err(Error::PastHead {
            head: 3,
            skipped: 996,
            lane: Ordering::Insert,
            ..
        }) => {
            let message = refused.unwrap_err().to_string();
            assert!(message.contains("--force"), "says what to do: {message}");
        }
        other => panic!("expected PastHead at head 3, got {other:?}"),
    }
    assert_eq!(position_of(&db.pool, "ins").await, 0, "nothing moved");

    ordo::admin::reset_subscription(
        &db.pool,
        "ins",
        Position::Insert(EventSequence::new(3)),
        false,
    )
    .await
    .expect("up to the head is fine");
    assert_eq!(position_of(&db.pool, "ins").await, 3);
    ordo::admin::reset_subscription(
        &db.pool,
        "ins",
        Position::Insert(EventSequence::new(999)),
        true,
    )
    .await
    .expect("forced");
    assert_eq!(position_of(&db.pool, "ins").await, 999);

    // The commit lane's head is the log's (nothing folded yet: 0), not the events'.
    let refused = ordo::admin::reset_subscription(
        &db.pool,
        "com",
        Position::Commit(CommitSequence::new(2)),
        false,
    )
    .await;
    assert!(
        matches!(refused, Err(Error::PastHead { head: 0, .. })),
        "{refused:?}"
    );
    assert_eq!(position_of(&db.pool, "com").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_with_a_position_of_the_other_lane_is_refused_naming_the_lane() {
    let db = TestDb::new().await;
    idle_subscriptions(&db.pool).await;
    let refused = ordo::admin::reset_subscription(
        &db.pool,
        "com",
        Position::Insert(EventSequence::new(1)),
        true,
    )
    .await;
    match &refused {
        Err(error @ Error::PositionLaneMismatch { lane, given, .. }) => {
            assert_eq!((*lane, *given), (Ordering::Commit, Ordering::Insert));
            assert!(
                error.to_string().contains("Commit(CommitSequence)"),
                "{error}"
            );
        }
        other => panic!("expected PositionLaneMismatch, got {other:?}"),
    }
    let unknown = ordo::admin::reset_subscription(
        &db.pool,
        "nope",
        Position::Insert(EventSequence::new(1)),
        false,
    )
    .await;
    assert!(
        matches!(unknown, Err(Error::UnknownSubscription { .. })),
        "{unknown:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_is_refused_while_a_live_lease_is_held_unless_forced() {
    let db = TestDb::new().await;
    idle_subscriptions(&db.pool).await;
    sqlx::query(
        "UPDATE ordo.subscriptions SET lease_owner = gen_random_uuid(), lease_expires_at = now() + interval '1 hour' WHERE name = 'ins'",
    )
    .execute(&db.pool)
    .await
    .expect("a live lease");
    sqlx::query(
        "UPDATE ordo.subscriptions SET lease_owner = gen_random_uuid(), lease_expires_at = now() - interval '1 minute' WHERE name = 'com'",
    )
    .execute(&db.pool)
    .await
    .expect("an expired lease");

    let refused = ordo::admin::delete_subscription(&db.pool, "ins", false).await;
    match &refused {
        Err(error @ Error::SubscriptionLeased { name, .. }) => {
            assert_eq!(name, "ins");
            assert!(error.to_string().contains("--force"), "{error}");
        }
        other => panic!("expected SubscriptionLeased, got {other:?}"),
    }
    ordo::admin::delete_subscription(&db.pool, "com", false)
        .await
        .expect("an expired lease does not protect the row");
    ordo::admin::delete_subscription(&db.pool, "ins", true)
        .await
        .expect("forced");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM ordo.subscriptions")
        .fetch_one(&db.pool)
        .await
        .expect("count");
    assert_eq!(left, 0);
    let again = ordo::admin::delete_subscription(&db.pool, "ins", true).await;
    assert!(
        matches!(again, Err(Error::UnknownSubscription { .. })),
        "{again:?}"
    );
}

async fn some_dead_letters(pool: &PgPool) {
    sqlx::query(
        "INSERT INTO ordo.dead_letters (subscription, lane, position, sequence, payload, error, attempts, created_at)
         VALUES ('a', 'insert', 1, 1, '1', 'old failure', 3, now() - interval '2 days'),
                ('a', 'insert', 2, 2, '2', 'new failure', 3, now()),
                ('b', 'commit', 1, 3, '3', 'other failure', 1, now())",
    )
    .execute(pool)
    .await
    .expect("dead letters");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_and_purged_by_subscription_and_age() {
    let db = TestDb::new().await;
    some_dead_letters(&db.pool).await;
    let all = ordo::admin::list_dead_letters(&db.pool, None)
        .await
        .expect("list");
    assert_eq!(all.len(), 3);
    let of_a = ordo::admin::list_dead_letters(&db.pool, Some("a"))
        .await
        .expect("list a");
    assert_eq!(
        of_a.iter().map(|d| d.error.as_str()).collect::<Vec<_>>(),
        ["old failure", "new failure"]
    );
    let purged = ordo::admin::purge_dead_letters(&db.pool, Some("a"), Duration::from_secs(86_400))
        .await
        .expect("purge old");
    assert_eq!(purged, 1, "only a's letter older than a day");
    let purged = ordo::admin::purge_dead_letters(&db.pool, None, Duration::ZERO)
        .await
        .expect("purge all");
    assert_eq!(purged, 2);
    assert!(
        ordo::admin::list_dead_letters(&db.pool, None)
            .await
            .expect("list")
            .is_empty()
    );
}

#[cfg(feature = "cli")]
mod cli {
    use super::*;
    use std::process::Command;

    fn ordo(db: &TestDb, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_ordo"))
            .args(args)
            .env("DATABASE_URL", &db.url)
            .output()
            .expect("run ordo")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cli_reset_needs_a_target_and_refuses_to_skip_past_the_head() {
        let db = TestDb::new().await;
        idle_subscriptions(&db.pool).await;
        sqlx::query("UPDATE ordo.subscriptions SET position = 2 WHERE name = 'ins'")
            .execute(&db.pool)
            .await
            .expect("position 2");

        let no_target = ordo(&db, &["subscriptions", "reset", "ins"]);
        assert!(!no_target.status.success(), "--to is required");
        assert_eq!(
            position_of(&db.pool, "ins").await,
            2,
            "no silent replay from 0"
        );

        let past = ordo(&db, &["subscriptions", "reset", "ins", "--to", "999"]);
        assert!(!past.status.success(), "999 is past the head (3)");
        let stderr = String::from_utf8_lossy(&past.stderr);
        assert!(stderr.contains("--force"), "says what to do: {stderr}");
        assert_eq!(position_of(&db.pool, "ins").await, 2, "nothing skipped");

        let forced = ordo(
            &db,
            &["subscriptions", "reset", "ins", "--to", "999", "--force"],
        );
        assert!(
            forced.status.success(),
            "{}",
            String::from_utf8_lossy(&forced.stderr)
        );
        assert_eq!(position_of(&db.pool, "ins").await, 999);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cli_deletes_subscriptions_and_lists_and_purges_dead_letters() {
        let db = TestDb::new().await;
        idle_subscriptions(&db.pool).await;
        some_dead_letters(&db.pool).await;
        let deleted = ordo(&db, &["subscriptions", "delete", "ins"]);
        assert!(
            deleted.status.success(),
            "{}",
            String::from_utf8_lossy(&deleted.stderr)
        );
        assert!(
            !ordo(&db, &["subscriptions", "delete", "ins"])
                .status
                .success()
        );

        let listed = ordo(
            &db,
            &["dead-letters", "list", "--subscription", "a", "--json"],
        );
        assert!(
            listed.status.success(),
            "{}",
            String::from_utf8_lossy(&listed.stderr)
        );
        let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&listed.stdout)
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON row"))
            .collect();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0]["error"], "old failure");

        let unbounded = ordo(&db, &["dead-letters", "purge"]);
        assert!(
            !unbounded.status.success(),
            "purge needs --older-than or --all"
        );
        let purged = ordo(&db, &["dead-letters", "purge", "--older-than", "1d"]);
        assert!(
            purged.status.success(),
            "{}",
            String::from_utf8_lossy(&purged.stderr)
        );
        assert_eq!(
            ordo::admin::list_dead_letters(&db.pool, None)
                .await
                .expect("list")
                .len(),
            2
        );
        assert!(
            ordo(&db, &["dead-letters", "purge", "--all"])
                .status
                .success()
        );
        assert!(
            ordo::admin::list_dead_letters(&db.pool, None)
                .await
                .expect("list")
                .is_empty()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_dead_letter_is_handled_once_by_the_runner_and_a_failed_retry_stays() {
    let db = TestDb::new().await;
    let outbox = projected_outbox(&db).await;
    publish(&outbox, 6, 1).await;
    let broken = Arc::new(AtomicBool::new(true));
    let config = JobConfig::new("retrying")
        .lease(Duration::from_millis(300))
        .retry(fast_retries(2))
        .on_exhaustion(ordo::OnExhaustion::DeadLetter);
    let handle = outbox
        .subscribe(
            config,
            Poisoned {
                broken: Arc::clone(&broken),
            },
        )
        .await
        .expect("subscribe");
    let (status, done) = handle.wait_for(PATIENCE, |s| s.position.get() >= 6).await;
    assert!(done, "moved past the poisoned event: {status:?}");
    let letters = ordo::admin::list_dead_letters(&db.pool, Some("retrying"))
        .await
        .expect("list");
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!((letter.sequence.get(), letter.attempts), (4, 2));

    // Still broken: the retry is one more attempt, and the row stays with the request cleared.
    ordo::admin::retry_dead_letter(&db.pool, letter.id)
        .await
        .expect("retry one");
    let failed_again = eventually(PATIENCE, || async {
        let rows = ordo::admin::list_dead_letters(&db.pool, Some("retrying"))
            .await
            .unwrap_or_default();
        rows.len() == 1 && rows[0].retry_requested_at.is_none() && rows[0].attempts == 3
    })
    .await;
    assert!(
        failed_again,
        "a failed retry leaves the dead letter, attempts + 1"
    );

    // Fixed: the runner hands it to the handler again, once, and the dead letter goes.
    broken.store(false, AtomicOrdering::SeqCst);
    let marked = ordo::admin::retry_dead_letters(&db.pool, "retrying")
        .await
        .expect("retry all");
    assert_eq!(marked, 1);
    let retried = eventually(PATIENCE, || async {
        ordo::admin::list_dead_letters(&db.pool, Some("retrying"))
            .await
            .map(|rows| rows.is_empty())
            .unwrap_or(false)
    })
    .await;
    assert!(retried, "the retried dead letter is handled and removed");
    assert_eq!(
        handle.status().position.get(),
        6,
        "the position did not move"
    );
    handle.shutdown().await;
    assert_exactly_once(&db.pool).await;

    let unknown = ordo::admin::retry_dead_letter(&db.pool, 999).await;
    assert!(
        matches!(unknown, Err(Error::UnknownDeadLetter { id: 999 })),
        "{unknown:?}"
    );
}

#[tokio::test]
async fn the_subscriptions_table_says_who_runs_each_one_and_when_nobody_does() {
    let db = TestDb::new().await;
    let outbox = projected_outbox(&db).await;
    let handle = outbox
        .subscribe(
            JobConfig::new("watched"),
            common::subscribers::Project { fail_rate: 0.0 },
        )
        .await
        .expect("subscribe");
    let running = eventually(PATIENCE, || async {
        let rows = ordo::admin::list_subscriptions(&db.pool)
            .await
            .expect("list");
        ordo::admin::subscriptions_table(&rows).contains("s left)")
    })
    .await;
    assert!(running, "a running subscription shows its lease holder");

    handle.shutdown().await;
    let rows = ordo::admin::list_subscriptions(&db.pool)
        .await
        .expect("list");
    let table = ordo::admin::subscriptions_table(&rows);
    let line = table
        .lines()
        .find(|line| line.starts_with("watched"))
        .expect("a line for the subscription");
    assert!(
        line.contains("active") && line.contains("nobody"),
        "active but run by nobody must show as such: {line}"
    );
    outbox.shutdown().await;
}
