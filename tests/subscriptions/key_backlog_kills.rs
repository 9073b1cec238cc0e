//! Stuck keys' backlogs across failures of their runner: killed (its runtime dropped, its
//! connections cut mid-statement) again and again while it moves a stuck key's events aside,
//! and again while it takes the backlog back after a retry; and a zombie whose lease was taken
//! writes no backlog row. Every event takes effect once, every key keeps its order.

use crate::common;

use std::time::Duration;

use common::keyed::{Ledger, Parcel, assert_key_order, assert_once_each, effects_table, publish};
use common::subscribers::{PATIENCE, fast_retries};
use common::{TestDb, eventually, run_then_kill};
use ordo::{JobConfig, OnExhaustion, Outbox, OutboxConfig, SubscriptionState};
use sqlx::PgPool;

fn config() -> JobConfig {
    JobConfig::new("keyed")
        .keyed(4)
        .keyed_window(16)
        .lease(Duration::from_millis(300))
        .retry(fast_retries(1))
        .on_exhaustion(OnExhaustion::Halt)
}

/// Every third parcel is the stuck key's; the rest spread over five keys.
fn parcels(from: u32, to: u32) -> impl Iterator<Item = Parcel> {
    (from..to).map(|id| {
        let key = if id % 3 == 0 {
            "bad".to_owned()
        } else {
            format!("k{}", id % 5)
        };
        Parcel::new(id, &[key.as_str()])
    })
}

async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await
        .expect("count")
}

async fn bad_effects(pool: &PgPool) -> i64 {
    count(pool, "SELECT count(*) FROM effects WHERE 'bad' = ANY(keys)").await
}

/// The keyed subscription on a runtime of its own until `done` says so, then killed.
fn run_until_then_kill<F, Fut>(url: &str, ledger: &Ledger, done: F)
where
    F: Fn(PgPool) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = bool>,
{
    let (url, ledger) = (url.to_owned(), ledger.clone());
    run_then_kill(move || async move {
        let pool = PgPool::connect(&url).await.expect("victim pool");
        let outbox = Outbox::<Parcel>::new(pool.clone(), OutboxConfig::default())
            .await
            .expect("outbox");
        let _handle = outbox.subscribe(config(), ledger).await.expect("subscribe");
        assert!(eventually(PATIENCE, || done(pool.clone())).await);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runners_killed_while_moving_a_stuck_keys_events_aside_and_while_taking_them_back_lose_and_repeat_nothing()
 {
    let db = TestDb::new().await;
    effects_table(&db.pool).await;
    let outbox: Outbox<Parcel> = Outbox::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    publish(&outbox, parcels(0, 600)).await;
    let ledger = Ledger::default();
    ledger.behaviour.fail("bad", true);
    // Three runners killed while the stuck key's 200 events go aside, each later than the last.
    for at_least in [20, 80, 140] {
        run_until_then_kill(&db.url, &ledger, move |pool| async move {
            count(&pool, "SELECT count(*) FROM ordo.key_backlogs").await >= at_least
        });
    }
    let moved = count(&db.pool, "SELECT count(*) FROM ordo.key_backlogs").await;
    assert!(
        moved < 200,
        "the victims moved everything before they were killed: {moved}"
    );
    // The stuck key's stalled event is retried while no runner runs; three more runners are
    // killed while they take the backlog back.
    ledger.behaviour.fail("bad", false);
    ordo::admin::retry_stalled_keys(&db.pool, "keyed", Some("bad"))
        .await
        .expect("retry");
    for at_least in [30, 90, 150] {
        run_until_then_kill(&db.url, &ledger, move |pool| async move {
            bad_effects(&pool).await >= at_least
        });
    }
    assert!(
        bad_effects(&db.pool).await < 200,
        "the victims drained everything"
    );
    let handle = outbox
        .subscribe(config(), ledger.clone())
        .await
        .expect("subscribe");
    assert!(
        eventually(PATIENCE, || async {
            count(&db.pool, "SELECT count(*) FROM effects").await == 600
        })
        .await,
        "every event took effect"
    );
    handle.shutdown().await;
    assert_once_each(&db.pool).await;
    assert!(assert_key_order(&db.pool).await >= 590);
    assert_eq!(
        count(&db.pool, "SELECT count(*) FROM ordo.key_backlogs").await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_whose_lease_was_taken_writes_no_backlog_row() {
    let db = TestDb::new().await;
    effects_table(&db.pool).await;
    let outbox: Outbox<Parcel> = Outbox::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let ledger = Ledger::default();
    ledger.behaviour.fail("bad", true);
    let handle = outbox
        .subscribe(config().lease(Duration::from_secs(3)), ledger.clone())
        .await
        .expect("subscribe");
    publish(&outbox, parcels(0, 30)).await;
    assert!(
        eventually(PATIENCE, || async {
            count(&db.pool, "SELECT count(*) FROM ordo.key_backlogs").await == 10
        })
        .await
    );
    // Another owner takes the lease; the zombie reads on and must store nothing more.
    sqlx::query("UPDATE ordo.subscriptions SET lease_owner = gen_random_uuid(), lease_expires_at = now() + interval '1 hour'")
        .execute(&db.pool)
        .await
        .expect("steal the lease");
    publish(&outbox, parcels(30, 60)).await;
    let (status, standing_by) = handle
        .wait_for(PATIENCE, |s| s.state == SubscriptionState::Standby)
        .await;
    assert!(standing_by, "{status:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        count(&db.pool, "SELECT count(*) FROM ordo.key_backlogs").await,
        10,
        "a runner without the lease wrote backlog rows"
    );
    sqlx::query("UPDATE ordo.subscriptions SET lease_owner = NULL, lease_expires_at = NULL")
        .execute(&db.pool)
        .await
        .expect("give the lease back");
    assert!(
        eventually(PATIENCE, || async {
            count(&db.pool, "SELECT count(*) FROM ordo.key_backlogs").await == 20
        })
        .await
    );
    handle.shutdown().await;
}
