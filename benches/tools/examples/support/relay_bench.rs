//! What the relay load tools share, whatever the broker: relay throughput from a written,
//! folded lane, and commit → arrival latency at a paced rate.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use futures::{Stream, StreamExt};
use hdrhistogram::Histogram;
use ordo::relay::{Message, Outcomes, RelayConfig, Sink};
use ordo::{Keys, Outbox, OutboxConfig};
use serde::{Deserialize, Serialize};

use super::scratch::Scratch;

/// The payload every tool sends.
#[derive(Serialize, Deserialize)]
pub struct Item {
    pub n: u64,
    pub key: u64,
}

/// 1,000 keys.
pub fn keys(event: &ordo::Envelope<Item>) -> Keys {
    Keys::one(event.payload.key.to_string())
}

pub fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Events/s of a relay through `sinks` (one batch in flight per sink): `events` events are
/// written and folded first, then the relay runs from the commit lane's start until its
/// watermark reaches the last one.
pub async fn relay_rate<K: Sink>(server: &str, events: u64, sinks: Vec<K>) -> Result<f64> {
    let scratch = Scratch::create(server).await?;
    let pool = scratch.pool(8).await?;
    sqlx::query(
        "INSERT INTO ordo.events (commit_xid, payload)
         SELECT 1000000000000 + g, jsonb_build_object('n', g, 'key', g % 1000)
         FROM generate_series(0, $1 - 1) AS g ORDER BY g",
    )
    .bind(events as i64)
    .execute(&pool)
    .await?;
    let outbox = Outbox::<Item>::new(pool.clone(), OutboxConfig::default()).await?;
    while outbox.commit_head().get() < events {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let config = RelayConfig::new("load")
        .batch_size(500)
        .per_event_budget(Duration::from_millis(10));
    let started = Instant::now();
    let handle = outbox.relay_with_sinks(config, sinks, keys).await?;
    let (status, done) = handle
        .wait_for(Duration::from_secs(600), |s| s.position.get() >= events)
        .await;
    let elapsed = started.elapsed();
    anyhow::ensure!(done, "the relay did not finish: {status:?}");
    handle.shutdown().await;
    outbox.shutdown().await;
    pool.close().await;
    scratch.drop_db().await?;
    Ok(events as f64 / elapsed.as_secs_f64())
}

/// Events/s of `sink` alone, no database: the messages a relay would build for `events` events
/// (the same payloads, ids, keys, positions and headers), sent in batches of 500 with one batch
/// in flight, as a relay with one sink sends them. Between the raw client and the relay, it
/// tells the sink's own cost from the relay's (reading the lane, the schedule, the marks).
pub async fn sink_rate<K: Sink>(events: u64, mut sink: K) -> Result<f64> {
    let messages: Vec<Message> = (0..events)
        .map(|g| {
            let payload = serde_json::to_vec(&Item {
                n: g,
                key: g % 1000,
            })?;
            Ok(Message::new(payload)
                .with_id(uuid::Uuid::now_v7())
                .with_position(g + 1)
                .with_key(Some(&(g % 1000).to_string())))
        })
        .collect::<Result<_>>()?;
    let started = Instant::now();
    for batch in messages.chunks(500) {
        let mut outcomes = Outcomes::new(batch.len());
        sink.send(batch, &mut outcomes).await?;
        anyhow::ensure!(outcomes.all_delivered(), "the sink failed a message");
    }
    Ok(events as f64 / started.elapsed().as_secs_f64())
}

/// Commit → arrival, at `rate` single-event transactions per second for `seconds`: each
/// clock starts just before its COMMIT and stops when `arrivals` yields its payload (a
/// subscriber or consumer that sees a message after the broker took it).
pub async fn latency<K, A>(
    server: &str,
    rate: u64,
    seconds: u64,
    sink: K,
    mut arrivals: A,
) -> Result<Histogram<u64>>
where
    K: Sink,
    A: Stream<Item = Vec<u8>> + Unpin,
{
    let scratch = Scratch::create(server).await?;
    let pool = scratch.pool(8).await?;
    let outbox = Outbox::<Item>::new(pool.clone(), OutboxConfig::default()).await?;
    let sent: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let handle = outbox
        .relay(RelayConfig::new("latency"), sink, keys)
        .await?;
    let total = rate * seconds;
    let writer = {
        let (outbox, sent) = (outbox.clone(), Arc::clone(&sent));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate));
            for n in 0..total {
                tick.tick().await;
                let mut tx = outbox.begin().await?;
                tx.publish(Item { n, key: n % 1000 })?;
                if let Ok(mut sent) = sent.lock() {
                    sent.insert(n, Instant::now());
                }
                tx.commit().await?;
            }
            anyhow::Ok(())
        })
    };
    let mut seen = 0;
    while seen < total {
        let Ok(Some(payload)) =
            tokio::time::timeout(Duration::from_secs(30), arrivals.next()).await
        else {
            anyhow::bail!("only {seen} of {total} arrived");
        };
        let item: Item = serde_json::from_slice(&payload)?;
        let at = sent.lock().ok().and_then(|sent| sent.get(&item.n).copied());
        if let Some(at) = at {
            histogram.record(at.elapsed().as_micros() as u64)?;
        }
        seen += 1;
    }
    writer.await??;
    handle.shutdown().await;
    outbox.shutdown().await;
    pool.close().await;
    scratch.drop_db().await?;
    Ok(histogram)
}

/// Prints a latency line.
pub fn report(rate: u64, seconds: u64, h: &Histogram<u64>) {
    println!(
        "latency at {rate}/s for {seconds} s: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} events)",
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        h.max() as f64 / 1000.0,
        h.len()
    );
}
