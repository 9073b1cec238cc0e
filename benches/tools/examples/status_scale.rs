//! How long `ordo::admin::status` takes on a large outbox: loads N events (default 10,000,000, in
//! transactions of 10) and their commit log into a scratch database (`examples/support/scratch.rs`), with a sequencer state
//! that is caught up, then times `status()` against a `SELECT 1` round trip in the same run.
//!
//! ```sh
//! cargo run --release --example status_scale                      # 10 million events
//! ORDO_SCALE_EVENTS=1000000 cargo run --release --example status_scale
//! ```
//! Uses `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`); the scratch
//! database is dropped at the end. Loading 10 million rows takes a few minutes.

use std::time::{Duration, Instant};

use anyhow::Result;
use sqlx::PgPool;

#[path = "support/scratch.rs"]
mod scratch;
use scratch::Scratch;

#[tokio::main]
async fn main() -> Result<()> {
    let events: i64 = std::env::var("ORDO_SCALE_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let scratch = Scratch::create(&scratch::server_url()).await?;
    let result = run(scratch.url(), events).await;
    scratch.drop_db().await?;
    result
}

async fn run(url: &str, events: i64) -> Result<()> {
    let pool = PgPool::connect(url).await?;
    let started = Instant::now();
    // Partitions of 1,000,000 ahead of the load, then events in groups of ten, by chunks.
    ordo::admin::run_retention(
        &pool,
        &ordo::RetentionConfig::new().ahead((events / 1_000_000 + 2) as u32),
    )
    .await?;
    let chunk = 1_000_000i64;
    let mut from = 1i64;
    while from <= events {
        let to = (from + chunk - 1).min(events);
        sqlx::query(
            "INSERT INTO ordo.events (commit_xid, sequence, payload, recorded_at)
             SELECT 1000000000000 + (g - 1) / 10, g, '{\"kind\": \"load\"}'::jsonb, now() - interval '1 hour'
             FROM generate_series($1::bigint, $2::bigint) AS g",
        )
        .bind(from)
        .bind(to)
        .execute(&pool)
        .await?;
        sqlx::query(
            "INSERT INTO ordo.commit_chunks
                 (first_commit_seq, last_commit_seq, min_sequence, max_sequence, sequences, group_last)
             SELECT min(g), max(g), min(g), max(g), array_agg(g ORDER BY g), array_agg(g % 10 = 0 ORDER BY g)
             FROM generate_series($1::bigint, $2::bigint) AS g
             GROUP BY (g - 1) / 1000",
        )
        .bind(from)
        .bind(to)
        .execute(&pool)
        .await?;
        from = to + 1;
    }
    sqlx::query("SELECT setval('ordo.events_sequence', $1)")
        .bind(events)
        .execute(&pool)
        .await?;
    sqlx::query(
        "UPDATE ordo.sequencer_state SET last_commit_seq = $1, logged_through_sequence = $1",
    )
    .bind(events)
    .execute(&pool)
    .await?;
    // Two subscriptions: one caught up, one far behind.
    sqlx::query(
        "INSERT INTO ordo.subscriptions (name, lane, position) VALUES ('caught-up', 'commit', $1), ('behind', 'insert', $2)",
    )
    .bind(events)
    .bind(events / 2)
    .execute(&pool)
    .await?;
    for table in ["ordo.events", "ordo.commit_chunks"] {
        sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {table}")))
            .execute(&pool)
            .await?;
    }
    println!(
        "loaded {events} events and their commit log in {:.1}s",
        started.elapsed().as_secs_f64()
    );

    let mut baseline = Vec::new();
    let mut timings = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        sqlx::query("SELECT 1").execute(&pool).await?;
        baseline.push(t.elapsed());
        let t = Instant::now();
        let status = ordo::admin::status(&pool).await?;
        timings.push(t.elapsed());
        anyhow::ensure!(
            status.insert_frontier.get() == events as u64,
            "frontier {}",
            status.insert_frontier
        );
    }
    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
    timings.sort();
    baseline.sort();
    println!(
        "ordo::admin::status on {events} events: median {:.1} ms, max {:.1} ms (20 runs); SELECT 1 median {:.2} ms",
        ms(&timings[10]),
        ms(&timings[19]),
        ms(&baseline[10])
    );
    let status = ordo::admin::status(&pool).await?;
    print!("{}", ordo::admin::status_table(&status));
    Ok(())
}
