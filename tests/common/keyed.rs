//! The keyed subscription tests' subscriber and checks: a `Parcel` names its keys; the
//! `Ledger` handler writes one `effects` row per event in its transaction, stamped with ticks
//! of a shared clock taken when the handler started and just before it finished, so a check
//! can prove that no event of a key started before the previous event of that key finished.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ordo::{Delivery, Envelope, HandlerError, Keys, Outbox, Subscriber};
use rand::Rng;
use sqlx::{PgConnection, PgPool};

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Parcel {
    pub keys: Vec<String>,
    pub id: u32,
}

impl Parcel {
    pub fn new(id: u32, keys: &[&str]) -> Self {
        Self {
            keys: keys.iter().map(|key| key.to_string()).collect(),
            id,
        }
    }
}

pub async fn effects_table(pool: &PgPool) {
    sqlx::query(
        "CREATE TABLE effects (sequence BIGINT NOT NULL, position BIGINT NOT NULL, keys TEXT[] NOT NULL,
                               started BIGINT NOT NULL, ended BIGINT NOT NULL)",
    )
    .execute(pool)
    .await
    .expect("effects table");
}

/// What the handler does, shared with the test so it can change it while the runner runs.
#[derive(Default)]
pub struct Behaviour {
    /// Events with one of these keys fail.
    pub failing: Mutex<HashSet<String>>,
    /// Events with one of these keys wait until the key is removed.
    pub held: Mutex<HashSet<String>>,
    /// Events with one of these keys, once their effect is written (not committed), wait until
    /// the key is removed.
    pub held_after_effect: Mutex<HashSet<String>>,
    /// Up to this many milliseconds of random work per event.
    pub jitter_ms: AtomicU64,
    /// Handlers running now, and the most at once.
    pub running: AtomicUsize,
    pub most_at_once: AtomicUsize,
}

impl Behaviour {
    pub fn fail(&self, key: &str, on: bool) {
        set(&self.failing, key, on);
    }

    pub fn hold(&self, key: &str, on: bool) {
        set(&self.held, key, on);
    }

    pub fn hold_after_effect(&self, key: &str, on: bool) {
        set(&self.held_after_effect, key, on);
    }

    fn touches(set: &Mutex<HashSet<String>>, keys: &[String]) -> bool {
        let set = set.lock().expect("behaviour lock");
        keys.iter().any(|key| set.contains(key))
    }
}

fn set(set: &Mutex<HashSet<String>>, key: &str, on: bool) {
    let mut set = set.lock().expect("behaviour lock");
    if on {
        set.insert(key.to_owned());
    } else {
        set.remove(key);
    }
}

#[derive(Clone, Default)]
pub struct Ledger {
    pub ticks: Arc<AtomicU64>,
    pub behaviour: Arc<Behaviour>,
}

impl Subscriber<Parcel> for Ledger {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        event: &Delivery<Parcel>,
    ) -> Result<(), HandlerError> {
        let b = &self.behaviour;
        let now = b.running.fetch_add(1, Ordering::SeqCst) + 1;
        b.most_at_once.fetch_max(now, Ordering::SeqCst);
        let result = self.apply(tx, event).await;
        b.running.fetch_sub(1, Ordering::SeqCst);
        result
    }

    fn keys(&self, event: &Envelope<Parcel>) -> Keys {
        event.payload.keys.iter().cloned().collect()
    }
}

impl Ledger {
    async fn apply(
        &self,
        tx: &mut PgConnection,
        event: &Delivery<Parcel>,
    ) -> Result<(), HandlerError> {
        let started = self.ticks.fetch_add(1, Ordering::SeqCst);
        let b = &self.behaviour;
        while Behaviour::touches(&b.held, &event.payload.keys) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if Behaviour::touches(&b.failing, &event.payload.keys) {
            return Err(format!("parcel {} fails", event.payload.id).into());
        }
        let jitter = b.jitter_ms.load(Ordering::SeqCst);
        if jitter > 0 {
            let wait = rand::rng().random_range(0..=jitter);
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
        let ended = self.ticks.fetch_add(1, Ordering::SeqCst);
        sqlx::query("INSERT INTO effects (sequence, position, keys, started, ended) VALUES ($1, $2, $3, $4, $5)")
            .bind(event.sequence.get() as i64)
            .bind(event.position().get() as i64)
            .bind(&event.payload.keys)
            .bind(started as i64)
            .bind(ended as i64)
            .execute(&mut *tx)
            .await?;
        while Behaviour::touches(&b.held_after_effect, &event.payload.keys) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }
}

/// Publishes one transaction per parcel.
pub async fn publish(outbox: &Outbox<Parcel>, parcels: impl IntoIterator<Item = Parcel>) {
    for parcel in parcels {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish(parcel).expect("publish");
        tx.commit().await.expect("commit");
    }
}

/// Rows of `effects`, by position: (sequence, position, keys, started, ended).
pub async fn effects(pool: &PgPool) -> Vec<(i64, i64, Vec<String>, i64, i64)> {
    sqlx::query_as("SELECT sequence, position, keys, started, ended FROM effects ORDER BY position")
        .fetch_all(pool)
        .await
        .expect("effects")
}

/// Every real event took effect exactly once.
pub async fn assert_once_each(pool: &PgPool) {
    let (events, rows, distinct, missing): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM ordo.events WHERE payload IS NOT NULL),
                (SELECT count(*) FROM effects),
                (SELECT count(DISTINCT sequence) FROM effects),
                (SELECT count(*) FROM ordo.events e WHERE e.payload IS NOT NULL
                   AND NOT EXISTS (SELECT 1 FROM effects f WHERE f.sequence = e.sequence))",
    )
    .fetch_one(pool)
    .await
    .expect("effect counts");
    assert_eq!(
        rows, distinct,
        "an event took effect twice ({rows} rows, {distinct} events)"
    );
    assert_eq!(missing, 0, "{missing} events never took effect");
    assert_eq!(rows, events);
}

/// For every key, each event started after the previous event of that key (in lane order)
/// finished. Returns how many pairs it checked.
pub async fn assert_key_order(pool: &PgPool) -> usize {
    let mut last: HashMap<String, (i64, i64)> = HashMap::new();
    let mut checked = 0;
    for (_, position, mut keys, started, ended) in effects(pool).await {
        keys.sort();
        keys.dedup();
        for key in keys {
            if let Some((before, finished)) = last.get(&key) {
                assert!(
                    started > *finished,
                    "key {key}: position {position} started at tick {started}, before position {before} finished at {finished}"
                );
                checked += 1;
            }
            last.insert(key, (position, ended));
        }
    }
    checked
}
