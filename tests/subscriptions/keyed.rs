//! Keyed subscriptions: a slow or failing key holds only itself, every key keeps its order
//! under concurrent writers and rollbacks, `Halt` stalls one key until an operator's retry,
//! `DeadLetter` moves the key on, and bad configurations are refused.

use crate::common;

use std::sync::atomic::Ordering as AtomicOrdering;

use common::keyed::{
    Ledger, Parcel, assert_key_order, assert_once_each, effects, effects_table, publish,
};
use common::subscribers::{PATIENCE, fast_retries};
use common::{TestDb, eventually};
use ordo::{Batch, Error, JobConfig, OnExhaustion, Ordering, Outbox, OutboxConfig};
use rand::Rng;
use rand::seq::IndexedRandom;

async fn keyed_outbox(db: &TestDb) -> Outbox<Parcel> {
    effects_table(&db.pool).await;
    Outbox::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox")
}

async fn effect_count(db: &TestDb, key: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM effects WHERE $1 = ANY(keys)")
        .bind(key)
        .fetch_one(&db.pool)
        .await
        .expect("count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_handler_waits_does_not_hold_the_other_keys() {
    let db = TestDb::new().await;
    let outbox = keyed_outbox(&db).await;
    let ledger = Ledger::default();
    ledger.behaviour.hold("slow", true);
    let handle = outbox
        .subscribe(JobConfig::new("keyed").keyed(4), ledger.clone())
        .await
        .expect("subscribe");
    let parcels = (0..40).map(|id| Parcel::new(id, &[if id % 4 == 0 { "slow" } else { "fast" }]));
    publish(&outbox, parcels).await;
    // Every fast event is handled while the first slow one is still in its handler.
    assert!(eventually(PATIENCE, || async { effect_count(&db, "fast").await == 30 }).await);
    assert_eq!(effect_count(&db, "slow").await, 0);
    assert_eq!(
        ledger.behaviour.running.load(AtomicOrdering::SeqCst),
        1,
        "only the slow key's first event runs"
    );
    ledger.behaviour.hold("slow", false);
    assert!(eventually(PATIENCE, || async { effect_count(&db, "slow").await == 10 }).await);
    handle.shutdown().await;
    assert_once_each(&db.pool).await;
    assert!(assert_key_order(&db.pool).await >= 38);
}

/// Four writers publish parcels with 1 to 3 of 12 keys in transactions of 1 to 3 events;
/// a fifth of the transactions write their rows and roll back (gaps in the sequence). Handlers
/// take random time; 16 run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_with_several_keys_keep_every_keys_order_under_concurrent_writers() {
    let db = TestDb::new().await;
    let outbox = keyed_outbox(&db).await;
    let ledger = Ledger::default();
    ledger.behaviour.jitter_ms.store(3, AtomicOrdering::SeqCst);
    let handle = outbox
        .subscribe(
            JobConfig::new("keyed").ordering(Ordering::Commit).keyed(16),
            ledger.clone(),
        )
        .await
        .expect("subscribe");
    let keys: Vec<String> = (0..12).map(|k| format!("k{k}")).collect();
    let mut writers = Vec::new();
    for writer in 0..4u32 {
        let outbox = outbox.clone();
        let keys = keys.clone();
        writers.push(tokio::spawn(async move {
            for t in 0..40u32 {
                let parcels: Vec<Parcel> = {
                    let mut rng = rand::rng();
                    (0..rng.random_range(1..=3))
                        .map(|e| {
                            let count = rng.random_range(1..=3);
                            let chosen: Vec<&str> = keys
                                .choose_multiple(&mut rng, count)
                                .map(String::as_str)
                                .collect();
                            Parcel::new(writer * 10_000 + t * 10 + e, &chosen)
                        })
                        .collect()
                };
                let mut tx = outbox.begin().await.expect("begin");
                if rand::rng().random_bool(0.2) {
                    sqlx::query("INSERT INTO ordo.events (id, payload, headers) VALUES (gen_random_uuid(), '{}', '{}')")
                        .execute(&mut **tx.transaction())
                        .await
                        .expect("doomed row");
                    tx.rollback().await.expect("rollback");
                } else {
                    tx.publish_all(parcels).expect("publish");
                    tx.commit().await.expect("commit");
                }
            }
        }));
    }
    for writer in writers {
        writer.await.expect("writer");
    }
    let total: i64 =
        sqlx::query_scalar("SELECT count(*) FROM ordo.events WHERE payload IS NOT NULL")
            .fetch_one(&db.pool)
            .await
            .expect("events");
    assert!(
        eventually(PATIENCE, || async {
            effects(&db.pool).await.len() as i64 == total
        })
        .await
    );
    handle.shutdown().await;
    assert_once_each(&db.pool).await;
    let pairs = assert_key_order(&db.pool).await;
    assert!(pairs > 100, "only {pairs} same-key pairs were checked");
    assert!(
        ledger.behaviour.most_at_once.load(AtomicOrdering::SeqCst) > 1,
        "nothing ran concurrently"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn halt_stalls_one_key_and_the_operators_retry_resumes_it() {
    let db = TestDb::new().await;
    let outbox = keyed_outbox(&db).await;
    let ledger = Ledger::default();
    ledger.behaviour.fail("bad", true);
    let config = JobConfig::new("keyed")
        .keyed(4)
        .retry(fast_retries(3))
        .on_exhaustion(OnExhaustion::Halt);
    let handle = outbox
        .subscribe(config, ledger.clone())
        .await
        .expect("subscribe");
    let parcels = (0..30).map(|id| Parcel::new(id, &[if id % 3 == 1 { "bad" } else { "good" }]));
    publish(&outbox, parcels).await;
    assert!(eventually(PATIENCE, || async { effect_count(&db, "good").await == 20 }).await);
    let (status, stalled) = handle.wait_for(PATIENCE, |s| !s.stalled.is_empty()).await;
    assert!(stalled, "the handle shows the stalled key: {status:?}");
    assert_eq!(status.stalled[0].key, "bad");
    assert_eq!(status.stalled[0].attempts, 3);
    assert!(
        status.stalled[0].error.contains("parcel 1 fails"),
        "{:?}",
        status.stalled[0]
    );
    // The stalled event and its key's later events wait in the key's backlog: the watermark
    // moves past them; the operator sees the key.
    assert!(!status.stalled[0].holds_watermark, "{status:?}");
    let (status, passed) = handle.wait_for(PATIENCE, |s| s.position.get() == 30).await;
    assert!(passed, "{status:?}");
    let listed = ordo::admin::list_stalled_keys(&db.pool, "keyed")
        .await
        .expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].key, "bad");
    let all = ordo::admin::list_subscriptions(&db.pool)
        .await
        .expect("subscriptions");
    assert_eq!(all[0].stalled, listed);
    assert_eq!(effect_count(&db, "bad").await, 0);
    let unknown = ordo::admin::retry_stalled_keys(&db.pool, "keyed", Some("other")).await;
    assert!(
        matches!(&unknown, Err(ordo::Error::UnknownStalledKey { key, .. }) if key == "other"),
        "a key nothing is stalled on is refused: {unknown:?}"
    );

    ledger.behaviour.fail("bad", false);
    assert_eq!(
        ordo::admin::retry_stalled_keys(&db.pool, "keyed", Some("bad"))
            .await
            .expect("retry"),
        1
    );
    assert!(eventually(PATIENCE, || async { effect_count(&db, "bad").await == 10 }).await);
    let (status, done) = handle
        .wait_for(PATIENCE, |s| s.position.get() == 30 && s.stalled.is_empty())
        .await;
    assert!(done, "{status:?}");
    handle.shutdown().await;
    assert_once_each(&db.pool).await;
    assert_key_order(&db.pool).await;
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM ordo.subscription_progress")
        .fetch_one(&db.pool)
        .await
        .expect("progress");
    assert_eq!(
        left, 0,
        "the watermark passed every completion and pruned it"
    );
    let unknown = ordo::admin::retry_stalled_keys(&db.pool, "nope", None).await;
    assert!(
        matches!(unknown, Err(Error::UnknownSubscription { .. })),
        "{unknown:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_moves_a_failing_keys_lane_on() {
    let db = TestDb::new().await;
    let outbox = keyed_outbox(&db).await;
    let ledger = Ledger::default();
    ledger.behaviour.fail("poison", true);
    let config = JobConfig::new("keyed")
        .keyed(4)
        .retry(fast_retries(2))
        .on_exhaustion(OnExhaustion::DeadLetter);
    let handle = outbox
        .subscribe(config, ledger.clone())
        .await
        .expect("subscribe");
    publish(
        &outbox,
        [
            Parcel::new(0, &["a"]),
            Parcel::new(1, &["a", "poison"]),
            Parcel::new(2, &["a"]),
        ],
    )
    .await;
    let (status, done) = handle.wait_for(PATIENCE, |s| s.position.get() == 3).await;
    assert!(done, "{status:?}");
    handle.shutdown().await;
    let dead = ordo::admin::list_dead_letters(&db.pool, Some("keyed"))
        .await
        .expect("dead letters");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].attempts, 2);
    assert_eq!(effect_count(&db, "a").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keyed_configurations_are_refused_with_the_setting_named() {
    let db = TestDb::new().await;
    let outbox = keyed_outbox(&db).await;
    for (config, setting) in [
        (JobConfig::new("k").keyed(0), "keyed"),
        (JobConfig::new("k").keyed(8).keyed_window(4), "keyed_window"),
        (
            JobConfig::new("k").keyed(8).batch(Batch::UpTo(10)),
            "batch/keyed",
        ),
    ] {
        let refused = outbox.subscribe(config, Ledger::default()).await;
        assert!(
            matches!(&refused, Err(Error::InvalidConfig { setting: s, .. }) if *s == setting),
            "{refused:?}"
        );
    }
    // A subscription with keyed progress above its position is not run serially.
    let ledger = Ledger::default();
    ledger.behaviour.fail("stuck", true);
    let config = JobConfig::new("k").keyed(2).retry(fast_retries(1));
    let handle = outbox.subscribe(config, ledger).await.expect("subscribe");
    publish(
        &outbox,
        [Parcel::new(0, &["stuck"]), Parcel::new(1, &["free"])],
    )
    .await;
    assert!(eventually(PATIENCE, || async { effect_count(&db, "free").await == 1 }).await);
    handle.shutdown().await;
    let serial = outbox
        .subscribe(JobConfig::new("k"), Ledger::default())
        .await;
    assert!(
        matches!(
            &serial,
            Err(Error::InvalidConfig {
                setting: "keyed",
                ..
            })
        ),
        "{serial:?}"
    );
}

/// Each event's first attempt takes a transaction-scoped advisory lock of its own and fails;
/// the retry records whether that lock was free when it started.
#[derive(Clone, Default)]
struct LockProbe {
    retries: std::sync::Arc<std::sync::Mutex<Vec<(u32, bool)>>>,
}

impl ordo::Subscriber<Parcel> for LockProbe {
    async fn handle(
        &self,
        tx: &mut sqlx::PgConnection,
        event: &ordo::Delivery<Parcel>,
    ) -> Result<(), ordo::HandlerError> {
        let lock = i64::from(event.payload.id);
        if event.attempt() == 1 {
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(lock)
                .execute(&mut *tx)
                .await?;
            return Err(format!("parcel {} fails holding its lock", event.payload.id).into());
        }
        let free: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
            .bind(lock)
            .fetch_one(&mut *tx)
            .await?;
        self.retries
            .lock()
            .expect("probe lock")
            .push((event.payload.id, free));
        Ok(())
    }

    fn keys(&self, event: &ordo::Envelope<Parcel>) -> ordo::Keys {
        event.payload.keys.iter().cloned().collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_is_rolled_back_before_its_retry_starts() {
    let db = TestDb::new().await;
    effects_table(&db.pool).await;
    // A pool that takes its time to take a connection back (an `after_release` hook, as
    // applications use to reset session state): sqlx flushes the ROLLBACK that dropping a
    // transaction queued only after that hook, so a failed attempt that left its rollback to
    // the drop still held its locks when the retry began on another connection.
    let slow_release = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .after_release(|_, _| {
            Box::pin(async {
                tokio::time::sleep(std::time::Duration::from_millis(1_000)).await;
                Ok(true)
            })
        })
        .connect(&db.url)
        .await
        .expect("pool");
    let outbox = Outbox::new(slow_release, OutboxConfig::default())
        .await
        .expect("outbox");
    let probe = LockProbe::default();
    let handle = outbox
        .subscribe(
            JobConfig::new("keyed").keyed(4).retry(fast_retries(3)),
            probe.clone(),
        )
        .await
        .expect("subscribe");
    let keys = ["a", "b", "c", "d"];
    publish(
        &outbox,
        (0..4).map(|id| Parcel::new(id, &[keys[id as usize % 4]])),
    )
    .await;
    let retried = || probe.retries.lock().expect("probe lock").len();
    assert!(eventually(PATIENCE, || async { retried() == 4 }).await);
    handle.shutdown().await;
    let held: Vec<u32> = probe
        .retries
        .lock()
        .expect("probe lock")
        .iter()
        .filter(|(_, free)| !free)
        .map(|(id, _)| *id)
        .collect();
    assert!(
        held.is_empty(),
        "retries started while their failed attempt still held its lock: parcels {held:?}"
    );
}
