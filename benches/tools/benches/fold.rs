//! The sequencer's fold, cold: an outbox starts over `EVENTS` stored events whose commit log is
//! empty, and the time until the log holds them all is measured, for groups of 1 and of 10
//! events, against a baseline in the same run: one paged read of the same rows' `(sequence,
//! commit_xid)`, the least any fold must do.
//!
//! ```sh
//! export DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres
//! cargo bench --bench fold
//! ```
//! The write-side figures (8 writers, fold capacity while they write, lag after they stop) are
//! in `examples/fold_load.rs`, which needs minutes of wall time rather than criterion samples.

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use ordo::{Outbox, OutboxConfig};
use sqlx::PgPool;
use tokio::runtime::Runtime;

#[path = "../examples/support/scratch.rs"]
mod scratch;

use scratch::Scratch;

const EVENTS: i64 = 20_000;

fn main() {
    let runtime = Runtime::new().expect("a tokio runtime");
    let server = scratch::server_url();
    let mut criterion = Criterion::default()
        .sample_size(10)
        .measurement_time(Duration::from_secs(8))
        .warm_up_time(Duration::from_secs(1))
        .configure_from_args();
    for group_size in [1i64, 10] {
        let (scratch, pool) = runtime.block_on(scratch(&server, group_size));
        let mut group = criterion.benchmark_group(format!("fold_groups_of_{group_size}"));
        group.throughput(Throughput::Elements(EVENTS as u64));
        group.bench_function("baseline_paged_read", |b| {
            b.to_async(&runtime).iter_custom(|iterations| {
                let pool = pool.clone();
                async move {
                    let started = Instant::now();
                    for _ in 0..iterations {
                        paged_read(&pool).await;
                    }
                    started.elapsed()
                }
            })
        });
        group.bench_function("ordo_cold_fold", |b| {
            b.to_async(&runtime).iter_custom(|iterations| {
                let pool = pool.clone();
                async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iterations {
                        total += cold_fold(&pool).await;
                    }
                    total
                }
            })
        });
        group.finish();
        runtime.block_on(async {
            pool.close().await;
            scratch.drop_db().await.expect("drop the scratch database");
        });
    }
    criterion.final_summary();
}

/// Empties the log, then times an outbox folding every stored event.
async fn cold_fold(pool: &PgPool) -> Duration {
    sqlx::raw_sql(
        "TRUNCATE ordo.commit_chunks;
         UPDATE ordo.sequencer_state SET last_commit_seq = 0, logged_through_sequence = 0;",
    )
    .execute(pool)
    .await
    .expect("reset the log");
    let started = Instant::now();
    let outbox = Outbox::<serde_json::Value>::new(
        pool.clone(),
        OutboxConfig::default().cross_process_wakeups(false),
    )
    .await
    .expect("outbox");
    while (outbox.commit_head().get() as i64) < EVENTS {
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    let elapsed = started.elapsed();
    outbox.shutdown().await;
    elapsed
}

async fn paged_read(pool: &PgPool) {
    let mut after = 0i64;
    loop {
        let page: Vec<(i64, Option<i64>)> = sqlx::query_as(
            "SELECT sequence, commit_xid FROM ordo.events WHERE sequence > $1 ORDER BY sequence LIMIT 2000",
        )
        .bind(after)
        .fetch_all(pool)
        .await
        .expect("page");
        match page.last() {
            Some((last, _)) => after = *last,
            None => break,
        }
    }
}

/// A scratch database holding `EVENTS` events in groups of `group_size`.
async fn scratch(server: &str, group_size: i64) -> (Scratch, PgPool) {
    let scratch = Scratch::create(server).await.expect("a scratch database");
    let pool = scratch.pool(6).await.expect("pool");
    // Groups of `group_size` (explicit commit_xid values above any real transaction id).
    sqlx::query(
        "INSERT INTO ordo.events (commit_xid, payload)
         SELECT 1000000000000 + g / $2, jsonb_build_object('n', g) FROM generate_series(0, $1 - 1) AS g ORDER BY g",
    )
    .bind(EVENTS)
    .bind(group_size)
    .execute(&pool)
    .await
    .expect("events");
    sqlx::query("ANALYZE ordo.events")
        .execute(&pool)
        .await
        .expect("analyze");
    (scratch, pool)
}
