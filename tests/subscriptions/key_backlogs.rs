//! A stuck key holds only itself however long it stays stuck: a keyed subscription's event
//! stalled under `Halt` and every later event of its key leave the window for
//! `ordo.key_backlogs`, the other keys' events flow past them for many windows' worth, a
//! restart keeps the key stuck, and an operator's retry takes the backlog back in order, each
//! event once.

use crate::common;

use common::keyed::{Ledger, Parcel, assert_key_order, assert_once_each, effects_table, publish};
use common::subscribers::{PATIENCE, fast_retries};
use common::{TestDb, eventually};
use ordo::{JobConfig, OnExhaustion, Outbox, OutboxConfig, SubscriptionHandle};

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

/// A keyed subscription whose handler fails every event of `key`, with the effects table.
async fn subscribed_failing(key: &str) -> (TestDb, Outbox<Parcel>, Ledger, SubscriptionHandle) {
    let db = TestDb::new().await;
    effects_table(&db.pool).await;
    let outbox: Outbox<Parcel> = Outbox::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let ledger = Ledger::default();
    ledger.behaviour.fail(key, true);
    let handle = outbox
        .subscribe(config(), ledger.clone())
        .await
        .expect("subscribe");
    (db, outbox, ledger, handle)
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
    let (db, outbox, ledger, handle) = subscribed_failing("bad").await;
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
    let (db, outbox, ledger, handle) = subscribed_failing("bad").await;
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

/// A key is whatever an event says: 12 kB that do not compress, a newline, quotes and a
/// terminal escape. Stuck, its events go aside like any key's (nothing about the key is
/// indexed), the other keys flow, the status escapes it, and a retry takes it back in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_key_goes_aside_and_comes_back_like_any_other() {
    let hostile: String = (0..400)
        .map(|i| {
            format!(
                "{:032x}",
                u128::from(i as u32).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)
            )
        })
        .collect::<String>()
        + "\n\"quoted\" \u{1b}[31mred";
    let (db, outbox, ledger, handle) = subscribed_failing(&hostile).await;
    let sent = (0..60).map(|id| {
        if id % 3 == 0 {
            Parcel::new(id, &[hostile.as_str()])
        } else {
            Parcel::new(id, &["free"])
        }
    });
    publish(&outbox, sent).await;
    assert!(eventually(PATIENCE, || async { effects_of(&db, "free").await == 40 }).await);
    assert!(
        eventually(PATIENCE, || async {
            count(&db, "SELECT count(*) FROM ordo.key_backlogs").await == 20
        })
        .await,
        "the hostile key's 20 events wait aside"
    );
    let status = ordo::admin::status(&db.pool).await.expect("status");
    let text = ordo::admin::status_table(&status);
    assert!(
        !text.contains('\u{1b}') && text.contains("STUCK"),
        "the status names the stuck key, escaped: {text}"
    );
    ledger.behaviour.fail(&hostile, false);
    ordo::admin::retry_stalled_keys(&db.pool, "keyed", Some(&hostile))
        .await
        .expect("retry");
    assert!(eventually(PATIENCE, || async { effects_of(&db, &hostile).await == 20 }).await);
    handle.shutdown().await;
    assert_once_each(&db.pool).await;
    assert_key_order(&db.pool).await;
    assert_eq!(
        count(&db, "SELECT count(*) FROM ordo.key_backlogs").await,
        0
    );
}

/// Delivers every message except its refused key's (a permanent refusal: the relay parks it
/// at once), recording each delivered message's parcel and event id.
#[derive(Clone, Default)]
struct Refusing {
    refused: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    received: std::sync::Arc<std::sync::Mutex<Vec<(uuid::Uuid, Parcel)>>>,
}

impl Refusing {
    fn received(&self) -> Vec<(uuid::Uuid, Parcel)> {
        self.received
            .lock()
            .map(|received| received.clone())
            .unwrap_or_default()
    }
}

impl ordo::relay::Sink for Refusing {
    async fn send(
        &mut self,
        batch: &[ordo::relay::Message],
        outcomes: &mut ordo::relay::Outcomes,
    ) -> Result<(), ordo::relay::SendError> {
        let refused = self.refused.lock().map(|r| r.clone()).unwrap_or_default();
        for (index, message) in batch.iter().enumerate() {
            if refused.is_some() && message.key == refused {
                outcomes.failed(index, ordo::relay::SendError::permanent("400 Bad Request"));
                continue;
            }
            let parcel: Parcel = serde_json::from_slice(&message.payload).expect("a parcel");
            if let Ok(mut received) = self.received.lock() {
                received.push((message.id, parcel));
            }
            outcomes.delivered(index);
        }
        Ok(())
    }

    async fn reset(&mut self) -> Result<(), ordo::relay::SendError> {
        Ok(())
    }

    fn describe(&self) -> String {
        "refusing (test)".to_owned()
    }
}

/// A relay whose one key is parked by a permanent refusal delivers every other key for many
/// windows, while retention with a zero keep runs: the stuck key's events survive in its
/// backlog, and a requeue delivers them in order, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_key_holds_only_itself_through_retention_and_a_requeue_delivers_its_backlog_in_order()
 {
    let db = TestDb::with_partition_size(Some(100)).await;
    let outbox: Outbox<Parcel> = Outbox::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let sink = Refusing::default();
    *sink.refused.lock().expect("refused") = Some("bad".to_owned());
    let config = ordo::relay::RelayConfig::new("hooks")
        .window(WINDOW, 1 << 20)
        .batch_size(10)
        .backoff(
            std::time::Duration::from_millis(5),
            std::time::Duration::from_millis(50),
        );
    let keys = |event: &ordo::Envelope<Parcel>| -> ordo::Keys {
        event.payload.keys.iter().cloned().collect()
    };
    let relay = outbox
        .relay(config, sink.clone(), keys)
        .await
        .expect("relay");
    publish(&outbox, parcels(0, 400)).await;
    assert!(
        eventually(PATIENCE, || async { sink.received().len() == 200 }).await,
        "every healthy key's event was delivered past the parked one: {}",
        sink.received().len()
    );
    let (status, passed) = relay
        .wait_for(PATIENCE, |status| status.position.get() >= 400)
        .await;
    assert!(passed, "{status:?}");
    assert_eq!(status.stalled.len(), 1, "{status:?}");
    assert_eq!(status.stalled[0].key, "bad");
    // Retention keeps nothing it is not asked to: the backlog's copies are all that is left
    // of the stuck key's events.
    let report = ordo::admin::run_retention(
        &db.pool,
        &ordo::RetentionConfig::new().keep(std::time::Duration::ZERO),
    )
    .await
    .expect("retention");
    assert!(report.events_floor > 300, "{report:#?}");
    assert_eq!(
        count(&db, "SELECT count(*) FROM ordo.key_backlogs").await,
        200
    );

    *sink.refused.lock().expect("refused") = None;
    ordo::admin::retry_stalled_keys(&db.pool, "hooks", Some("bad"))
        .await
        .expect("requeue");
    assert!(
        eventually(PATIENCE, || async { sink.received().len() == 400 }).await,
        "the backlog was delivered: {}",
        sink.received().len()
    );
    relay.shutdown().await;
    let received = sink.received();
    let ids: std::collections::HashSet<uuid::Uuid> = received.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids.len(), 400, "each event once");
    let bad: Vec<u32> = received
        .iter()
        .filter(|(_, parcel)| parcel.keys[0] == "bad")
        .map(|(_, parcel)| parcel.id)
        .collect();
    let in_order: Vec<u32> = (0..400).filter(|id| id % 2 == 0).collect();
    assert_eq!(bad, in_order, "the stuck key's events in order");
    assert_eq!(
        count(&db, "SELECT count(*) FROM ordo.key_backlogs").await,
        0
    );
}
