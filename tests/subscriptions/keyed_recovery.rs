//! Keyed subscriptions across failures of their runner: killed mid-batch, a lease lost while
//! handlers run, a restart with hundreds of completions above the watermark, and killed during
//! a dead letter's retry. Each event takes effect exactly once and every key keeps its order.

use crate::common;

use std::sync::atomic::Ordering as AtomicOrdering;
use std::time::Duration;

use common::keyed::{
    Ledger, Parcel, assert_key_order, assert_once_each, effects, effects_table, publish,
};
use common::subscribers::{PATIENCE, fast_retries};
use common::{TestDb, eventually, run_then_kill};
use ordo::{JobConfig, OnExhaustion, Outbox, OutboxConfig, SubscriptionState};
use sqlx::PgPool;

fn parcels(count: u32, keys: u32) -> impl Iterator<Item = Parcel> {
    (0..count).map(move |id| {
        let one = format!("k{}", id % keys);
        let two = format!("k{}", (id * 7) % keys);
        Parcel::new(id, &[one.as_str(), two.as_str()])
    })
}

async fn effect_rows(pool: &PgPool) -> usize {
    effects(pool).await.len()
}

/// Runs the keyed subscription on its own runtime and pool until `at_least` effects are
/// committed, then drops the runtime: tasks die wherever they are, connections close
/// mid-transaction. A killed process.
fn run_until_then_kill(url: String, ledger: Ledger, at_least: usize) {
    run_then_kill(move || async move {
        let pool = PgPool::connect(&url).await.expect("victim pool");
        let outbox = Outbox::<Parcel>::new(pool.clone(), OutboxConfig::default())
            .await
            .expect("outbox");
        let config = JobConfig::new("keyed")
            .keyed(8)
            .lease(Duration::from_millis(300))
            .retry(fast_retries(5));
        let _handle = outbox.subscribe(config, ledger).await.expect("subscribe");
        assert!(eventually(PATIENCE, || async { effect_rows(&pool).await >= at_least }).await);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_killed_mid_batch_leaves_nothing_done_twice_or_skipped() {
    let db = TestDb::new().await;
    effects_table(&db.pool).await;
    let outbox = Outbox::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    publish(&outbox, parcels(300, 20)).await;
    let ledger = Ledger::default();
    ledger.behaviour.jitter_ms.store(20, AtomicOrdering::SeqCst);
    run_until_then_kill(db.url.clone(), ledger.clone(), 40);
    let at_kill = effect_rows(&db.pool).await;
    assert!(
        at_kill < 300,
        "the victim finished everything before it was killed"
    );
    let config = JobConfig::new("keyed")
        .keyed(8)
        .lease(Duration::from_millis(300))
        .retry(fast_retries(5));
    let handle = outbox.subscribe(config, ledger).await.expect("subscribe");
    assert!(eventually(PATIENCE, || async { effect_rows(&db.pool).await >= 300 }).await);
    handle.shutdown().await;
    assert_once_each(&db.pool).await;
    assert!(assert_key_order(&db.pool).await > 250);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_loses_its_lease_while_handlers_run_commits_nothing() {
    let db = TestDb::new().await;
    effects_table(&db.pool).await;
    let outbox = Outbox::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let ledger = Ledger::default();
    for key in ["a", "b", "c"] {
        ledger.behaviour.hold(key, true);
    }
    let config = JobConfig::new("keyed")
        .keyed(4)
        .lease(Duration::from_secs(3))
        .retry(fast_retries(5));
    let handle = outbox
        .subscribe(config, ledger.clone())
        .await
        .expect("subscribe");
    publish(
        &outbox,
        ["a", "b", "c", "a", "b", "c"]
            .iter()
            .enumerate()
            .map(|(id, key)| Parcel::new(id as u32, &[key])),
    )
    .await;
    let behaviour = &ledger.behaviour;
    assert!(
        eventually(PATIENCE, || async {
            behaviour.running.load(AtomicOrdering::SeqCst) == 3
        })
        .await
    );
    // Another owner takes the lease while three handlers are inside their transactions.
    sqlx::query("UPDATE ordo.subscriptions SET lease_owner = gen_random_uuid(), lease_expires_at = now() + interval '1 hour'")
        .execute(&db.pool)
        .await
        .expect("steal the lease");
    for key in ["a", "b", "c"] {
        behaviour.hold(key, false);
    }
    let (status, standing_by) = handle
        .wait_for(PATIENCE, |s| s.state == SubscriptionState::Standby)
        .await;
    assert!(standing_by, "{status:?}");
    assert_eq!(
        effect_rows(&db.pool).await,
        0,
        "a runner without the lease committed"
    );
    sqlx::query("UPDATE ordo.subscriptions SET lease_owner = NULL, lease_expires_at = NULL")
        .execute(&db.pool)
        .await
        .expect("give the lease back");
    assert!(eventually(PATIENCE, || async { effect_rows(&db.pool).await >= 6 }).await);
    handle.shutdown().await;
    assert_once_each(&db.pool).await;
    assert_key_order(&db.pool).await;
}

/// A runner killed while the first event's handler is still in hand (it holds the watermark)
/// and 400 later ones are done: the next runner repeats none of the 400 and runs the first
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_hundreds_of_completions_above_the_watermark_repeats_none() {
    let db = TestDb::new().await;
    effects_table(&db.pool).await;
    let outbox = Outbox::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let ledger = Ledger::default();
    ledger.behaviour.hold("slow", true);
    publish(&outbox, [Parcel::new(1000, &["slow"])]).await;
    publish(&outbox, parcels(400, 40)).await;
    run_until_then_kill(db.url.clone(), ledger.clone(), 400);
    let (position, done): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT position FROM ordo.subscriptions),
                (SELECT count(*) FROM ordo.subscription_progress WHERE state = 'done')",
    )
    .fetch_one(&db.pool)
    .await
    .expect("progress");
    assert_eq!((position, done), (0, 400));

    ledger.behaviour.hold("slow", false);
    let config = JobConfig::new("keyed")
        .keyed(8)
        .lease(Duration::from_millis(300))
        .retry(fast_retries(5));
    let handle = outbox
        .subscribe(config, ledger.clone())
        .await
        .expect("subscribe again");
    let (status, done) = handle.wait_for(PATIENCE, |s| s.position.get() == 401).await;
    assert!(done, "{status:?}");
    handle.shutdown().await;
    assert_once_each(&db.pool).await;
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM ordo.subscription_progress")
        .fetch_one(&db.pool)
        .await
        .expect("progress rows");
    assert_eq!(left, 0);
}

/// A keyed runner killed while a retried dead letter's handler has written its effect but not
/// committed: the effect rolls back with the dead letter's deletion, the request stays, and the
/// next runner takes it. The event takes effect once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_killed_during_a_dead_letter_retry_leaves_it_to_take_effect_once() {
    let db = TestDb::new().await;
    effects_table(&db.pool).await;
    let outbox = Outbox::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let ledger = Ledger::default();
    ledger.behaviour.fail("poison", true);
    let config = || {
        JobConfig::new("keyed")
            .keyed(4)
            .lease(Duration::from_millis(600))
            .retry(fast_retries(1))
            .on_exhaustion(OnExhaustion::DeadLetter)
    };
    let handle = outbox
        .subscribe(config(), ledger.clone())
        .await
        .expect("subscribe");
    publish(
        &outbox,
        [Parcel::new(0, &["bob", "poison"]), Parcel::new(1, &["bob"])],
    )
    .await;
    let (status, passed) = handle.wait_for(PATIENCE, |s| s.position.get() == 2).await;
    assert!(passed, "{status:?}");
    handle.shutdown().await;
    let letters = ordo::admin::list_dead_letters(&db.pool, Some("keyed"))
        .await
        .expect("list");
    assert_eq!(letters.len(), 1, "{letters:?}");
    ledger.behaviour.fail("poison", false);
    ledger.behaviour.hold_after_effect("poison", true);
    ordo::admin::retry_dead_letter(&db.pool, letters[0].id)
        .await
        .expect("retry");

    // The victim's retry writes its effect and waits before committing; then it dies.
    let victim = ledger.clone();
    let url = db.url.clone();
    run_then_kill(move || async move {
        let pool = PgPool::connect(&url).await.expect("victim pool");
        let outbox = Outbox::<Parcel>::new(pool, OutboxConfig::default())
            .await
            .expect("outbox");
        let _handle = outbox
            .subscribe(config(), victim.clone())
            .await
            .expect("subscribe");
        let behaviour = &victim.behaviour;
        assert!(
            eventually(PATIENCE, || async {
                behaviour.running.load(AtomicOrdering::SeqCst) == 1
            })
            .await,
            "the victim retries the dead letter"
        );
    });
    ledger.behaviour.running.store(0, AtomicOrdering::SeqCst);
    ledger.behaviour.hold_after_effect("poison", false);
    assert_eq!(effect_rows(&db.pool).await, 1, "the killed retry committed");
    let pending = ordo::admin::list_dead_letters(&db.pool, Some("keyed"))
        .await
        .expect("list");
    assert!(
        pending.len() == 1 && pending[0].retry_requested_at.is_some(),
        "the killed retry left its dead letter and request: {pending:?}"
    );

    let handle = outbox
        .subscribe(config(), ledger.clone())
        .await
        .expect("subscribe again");
    assert!(
        eventually(PATIENCE, || async {
            ordo::admin::list_dead_letters(&db.pool, Some("keyed"))
                .await
                .is_ok_and(|letters| letters.is_empty())
        })
        .await,
        "the next runner takes the retry"
    );
    handle.shutdown().await;
    assert_once_each(&db.pool).await;
}
