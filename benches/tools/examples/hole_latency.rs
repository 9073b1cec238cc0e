//! Load tool for the abandonment proof: how long a committed event waits behind a rolled-back
//! hole on each lane, with and without an unrelated long transaction open on the server.
//!
//! ```sh
//! export DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres
//! cargo run --release --example hole_latency                # 5 rounds per sitting
//! cargo run --release --example hole_latency -- --rounds 10
//! ```
//!
//! Two fresh databases (`examples/support/scratch.rs`, dropped at exit): the outbox's, and
//! "elsewhere", another database of the same server. A reader (an `Outbox` with its own pool,
//! listening on both lanes from `Start::Now`, at default settings: it proves the holes and
//! folds) stands for the process downstream; the writes are plain SQL on another pool, as
//! another service's would be.
//!
//! Each round: a transaction inserts an event and rolls back (the hole), then one event
//! commits above it. The clock starts when that `COMMIT` returns and stops when each lane
//! hands the event over. Three conditions, in sittings ordered A B C C B A so that a drift of
//! the machine shows as a difference between the two sittings of one condition:
//! - A, `none`: nothing else open on the server.
//! - B, `other-db`: a transaction that wrote a table in "elsewhere" is open for the sitting.
//! - C, `same-db`: a transaction that wrote a table (not an ordo one) of the outbox's own
//!   database is open for the sitting.
//!
//! Before `ordo` proved holes by their drawers, B and C held every round until
//! `gap_fill_timeout` (5 s by default).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use ordo::{Outbox, OutboxConfig, Start};
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Postgres, Transaction};
use tokio::time::timeout;

#[path = "support/scratch.rs"]
mod scratch;
use scratch::{Scratch, server_url};

/// How long one round may wait for its event on either lane before the tool gives up.
const PATIENCE: Duration = Duration::from_secs(30);
/// A pause between rounds, so each round's hole is seen on its own.
const BETWEEN: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Probe {
    round: u32,
}

#[derive(Clone, Copy, PartialEq)]
enum Condition {
    None,
    OtherDatabase,
    SameDatabase,
}

impl Condition {
    fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::OtherDatabase => "other-db",
            Self::SameDatabase => "same-db",
        }
    }
}

struct Sitting {
    condition: Condition,
    insert_ms: Vec<f64>,
    commit_ms: Vec<f64>,
}

fn rounds_from_args() -> Result<u32> {
    let mut args = std::env::args().skip(1);
    let mut rounds = 5;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--rounds" => {
                rounds = args
                    .next()
                    .context("--rounds needs a number")?
                    .parse()
                    .context("--rounds needs a positive number")?;
                if rounds == 0 {
                    bail!("--rounds needs a positive number");
                }
            }
            other => bail!("unknown argument {other:?} (options: --rounds N)"),
        }
    }
    Ok(rounds)
}

/// A transaction with a transaction id that wrote `table`, left open.
async fn open_writer(pool: &PgPool, table: &str) -> Result<Transaction<'static, Postgres>> {
    let mut tx = pool.begin().await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {table} VALUES (1)"
    )))
    .execute(&mut *tx)
    .await?;
    Ok(tx)
}

async fn round(
    writer: &PgPool,
    inserted: &mut ordo::EventStream<Probe>,
    committed: &mut ordo::CommitStream<Probe>,
    n: u32,
) -> Result<(f64, f64)> {
    let mut hole = writer.begin().await?;
    sqlx::query("INSERT INTO ordo.events (payload) VALUES ('{\"round\": 0}')")
        .execute(&mut *hole)
        .await?;
    hole.rollback().await?;
    sqlx::query("INSERT INTO ordo.events (payload) VALUES (jsonb_build_object('round', $1::int))")
        .bind(i32::try_from(n)?)
        .execute(writer)
        .await?;
    let committed_at = Instant::now();
    let mut insert_ms = None;
    let mut commit_ms = None;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while insert_ms.is_none() || commit_ms.is_none() {
        let elapsed = || committed_at.elapsed().as_secs_f64() * 1e3;
        tokio::select! {
            item = inserted.next(), if insert_ms.is_none() => {
                let item = item.context("insert lane ended")??;
                if item.payload.round == n {
                    insert_ms = Some(elapsed());
                }
            }
            item = committed.next(), if commit_ms.is_none() => {
                let item = item.context("commit lane ended")??;
                if item.event.payload.round == n {
                    commit_ms = Some(elapsed());
                }
            }
            _ = tokio::time::sleep_until(deadline) => bail!("round {n} not delivered in {PATIENCE:?}"),
        }
    }
    Ok((insert_ms.unwrap_or_default(), commit_ms.unwrap_or_default()))
}

fn summary(values: &[f64]) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or_default();
    let max = sorted.last().copied().unwrap_or_default();
    format!("median {median:8.1} ms, max {max:8.1} ms")
}

#[tokio::main]
async fn main() -> Result<()> {
    let rounds = rounds_from_args()?;
    let server = server_url();
    let outbox_db = Scratch::create(&server).await?;
    let elsewhere = Scratch::create(&server).await?;
    let writer = outbox_db.pool(4).await?;
    let other = elsewhere.pool(2).await?;
    sqlx::query("CREATE TABLE app_orders (n int)")
        .execute(&writer)
        .await?;
    sqlx::query("CREATE TABLE batch_job (n int)")
        .execute(&other)
        .await?;

    let reader: Outbox<Probe> =
        Outbox::new(outbox_db.pool(8).await?, OutboxConfig::default()).await?;
    let mut inserted = reader.listen_inserted(Start::Now);
    let mut committed = reader.listen_committed(Start::Now);
    let settings: (String, String) =
        sqlx::query_as("SELECT current_setting('server_version'), current_setting('jit')")
            .fetch_one(&writer)
            .await?;
    println!(
        "PostgreSQL {}, jit={}; {rounds} rounds per sitting; reader at OutboxConfig::default()",
        settings.0, settings.1
    );

    use Condition::{None as Idle, OtherDatabase, SameDatabase};
    let mut sittings = Vec::new();
    let mut n = 0;
    for condition in [
        Idle,
        OtherDatabase,
        SameDatabase,
        SameDatabase,
        OtherDatabase,
        Idle,
    ] {
        let long = match condition {
            Idle => None,
            OtherDatabase => Some(open_writer(&other, "batch_job").await?),
            SameDatabase => Some(open_writer(&writer, "app_orders").await?),
        };
        let mut sitting = Sitting {
            condition,
            insert_ms: Vec::new(),
            commit_ms: Vec::new(),
        };
        for _ in 0..rounds {
            n += 1;
            let (insert, commit) = timeout(
                PATIENCE * 2,
                round(&writer, &mut inserted, &mut committed, n),
            )
            .await
            .context("a round hung")??;
            sitting.insert_ms.push(insert);
            sitting.commit_ms.push(commit);
            tokio::time::sleep(BETWEEN).await;
        }
        if let Some(long) = long {
            long.rollback().await?;
        }
        println!(
            "{:>9}: insert lane {} | commit lane {}",
            condition.name(),
            summary(&sitting.insert_ms),
            summary(&sitting.commit_ms)
        );
        sittings.push(sitting);
    }
    println!("over both sittings of each condition:");
    for condition in [Idle, OtherDatabase, SameDatabase] {
        let of = |lane: fn(&Sitting) -> &Vec<f64>| -> Vec<f64> {
            sittings
                .iter()
                .filter(|s| s.condition == condition)
                .flat_map(|s| lane(s).iter().copied())
                .collect()
        };
        println!(
            "{:>9}: insert lane {} | commit lane {}",
            condition.name(),
            summary(&of(|s| &s.insert_ms)),
            summary(&of(|s| &s.commit_ms))
        );
    }
    reader.shutdown().await;
    writer.close().await;
    other.close().await;
    outbox_db.drop_db().await?;
    elsewhere.drop_db().await?;
    Ok(())
}
