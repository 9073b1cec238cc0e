//! A stuck key holds only itself however long it stays stuck: a keyed subscription's event
//! stalled under `Halt` and every later event of its key leave the window for
//! `ordo.key_backlogs`, the other keys' events flow past them for many windows' worth, a
//! restart keeps the key stuck, and an operator's retry takes the backlog back in order, each
//! event once.

mod common;

use common::keyed::{Ledger, Parcel, assert_key_order, assert_once_each, effects_table, publish};
use common::subscribers::{PATIENCE, fast_retries};
use common::{TestDb, eventually};
use ordo::{JobConfig, OnExhaustion, Outbox, OutboxConfig};

const WINDOW: usize = 20;

fn config() -> JobConfig {
    JobConfig::new("keyed")
        .keyed(4)
        .keyed_window(WINDOW)
        .retry(fast_retries(2))
        .on_exhaustion(OnExhaustion::Halt)
}

async fn count(db: &TestDb, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(&db.pool)
        .await
        .expect("count")
}

async fn effects_of(db: &TestDb, key: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM effects WHERE $1 = ANY(keys)")
        .bind(key)
        .fetch_one(&db.pool)
        .await
        .expect("effects")
}

/// Every other parcel is the stuck key's, the rest spread over ten healthy keys.
fn parcels(from: u32, to: u32) -> impl Iterator<Item = Parcel> {
    (from..to).map(|id| {
        if id % 2 == 0 {
            Parcel::new(id, &["bad"])
        } else {
            let key = format!("good-{}", id % 10);
            Parcel::new(id, &[key.as_str()])
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halted_key_holds_only_itself_past_ten_windows_and_a_retry_takes_its_backlog_back_in_order()
 {
    let db = TestDb::new().await;
    effects_table(&db.pool).await;
    let outbox: Outbox<Parcel> = Outbox::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let ledger = Ledger::default();
    ledger.behaviour.fail("bad", true);
    let handle = outbox
        .subscribe(config(), ledger.clone())
        .await
        .expect("subscribe");
    // 300 parcels: 150 of the stuck key, more than seven windows; every healthy one applied.
    publish(&outbox, parcels(0, 300)).await;
    assert!(
        eventually(PATIENCE, || async {
            count(&db, "SELECT count(*) FROM effects").await == 150
        })
        .await,
        "the healthy keys' events all took effect while one key is stuck"
    );
    assert!(
        eventually(PATIENCE, || async {
            count(&db, "SELECT count(*) FROM ordo.key_backlogs").await == 150
        })
        .await,
        "the stuck key's events wait in its backlog"
    );
    // The watermark went past the stuck key's events: nothing holds it.
    let (status, passed) = handle
        .wait_for(PATIENCE, |status| status.position.get() == 300)
        .await;
    assert!(passed, "the watermark moves past a stuck key: {status:?}");
    let stalled = ordo::admin::list_stalled_keys(&db.pool, "keyed")
        .await
        .expect("stalled keys");
    assert_eq!(stalled.len(), 1, "{stalled:?}");
    assert_eq!(stalled[0].key, "bad");
    assert!(!stalled[0].holds_watermark, "{stalled:?}");

    // A restart keeps the key stuck: its new events go to the backlog, the others flow on, for
    // more than ten windows in all.
    handle.shutdown().await;
    let handle = outbox
        .subscribe(config(), ledger.clone())
        .await
        .expect("subscribe again");
    publish(&outbox, parcels(300, 460)).await;
    assert!(
        eventually(PATIENCE, || async {
            count(&db, "SELECT count(*) FROM effects").await == 230
        })
        .await
    );
    assert!(
        eventually(PATIENCE, || async {
            count(&db, "SELECT count(*) FROM ordo.key_backlogs").await == 230
        })
        .await,
        "230 of the stuck key's events, more than ten windows of {WINDOW}, wait aside"
    );
    assert_eq!(effects_of(&db, "bad").await, 0);

    // The retry: the stalled event first, then its backlog, in order, once each.
    ledger.behaviour.fail("bad", false);
    let asked = ordo::admin::retry_stalled_keys(&db.pool, "keyed", Some("bad"))
        .await
        .expect("retry");
    assert_eq!(asked, 1);
    assert!(
        eventually(PATIENCE, || async { effects_of(&db, "bad").await == 230 }).await,
        "the backlog was taken back"
    );
    // Live events of the key flow again once the backlog is drained.
    publish(&outbox, parcels(460, 470)).await;
    let (status, done) = handle
        .wait_for(PATIENCE, |status| {
            status.position.get() == 470 && status.stalled.is_empty()
        })
        .await;
    assert!(done, "{status:?}");
    assert!(eventually(PATIENCE, || async { effects_of(&db, "bad").await == 235 }).await);
    handle.shutdown().await;
    assert_once_each(&db.pool).await;
    assert!(assert_key_order(&db.pool).await >= 460);
    assert_eq!(
        count(&db, "SELECT count(*) FROM ordo.key_backlogs").await,
        0
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM ordo.subscription_progress").await,
        0,
        "nothing left behind"
    );
}

/// An event with a stuck key and a healthy one goes aside, and takes its healthy key with it:
/// that key's later events must not overtake it. A retry gives both keys back, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_on_a_stuck_and_a_live_key_takes_the_live_key_with_it() {
    let db = TestDb::new().await;
    effects_table(&db.pool).await;
    let outbox: Outbox<Parcel> = Outbox::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let ledger = Ledger::default();
    ledger.behaviour.fail("bad", true);
    let handle = outbox
        .subscribe(config(), ledger.clone())
        .await
        .expect("subscribe");
    let mut sent = vec![Parcel::new(0, &["bad"]), Parcel::new(1, &["bad", "both"])];
    sent.extend((2..40).map(|id| Parcel::new(id, &[if id % 2 == 0 { "both" } else { "free" }])));
    publish(&outbox, sent).await;
    assert!(eventually(PATIENCE, || async { effects_of(&db, "free").await == 19 }).await);
    assert!(
        eventually(PATIENCE, || async {
            count(&db, "SELECT count(*) FROM ordo.key_backlogs").await == 21
        })
        .await,
        "the stalled event, the two-key one and every later event of both keys wait aside"
    );
    assert_eq!(effects_of(&db, "both").await, 0);
    ledger.behaviour.fail("bad", false);
    ordo::admin::retry_stalled_keys(&db.pool, "keyed", None)
        .await
        .expect("retry");
    assert!(eventually(PATIENCE, || async { effects_of(&db, "both").await == 20 }).await);
    handle.shutdown().await;
    assert_once_each(&db.pool).await;
    assert_key_order(&db.pool).await;
    assert_eq!(
        count(&db, "SELECT count(*) FROM ordo.key_backlogs").await,
        0
    );
}
