//! Retention: keep partitions ahead of the head, and drop whole partitions of events (and the
//! commit-log entries of exactly those events) once they are past the configured age and no
//! consumer needs them.
//!
//! A pair of partitions covering sequences `[from, to)` is dropped only when all of:
//! - every event in it is older than [`RetentionConfig::keep`] (by `recorded_at`);
//! - nothing at or above `from` is still needed: not by the insert lane's frontier, not by the
//!   sequencer (`logged_through_sequence`), not by any subscription, paused and halted ones
//!   included (unless [`RetentionConfig::force`]);
//! - no source transaction has events on both sides of `to` (a group is never split);
//! - every older partition is dropped in the same run or before (drops go oldest first).
//!
//! Because groups are ordered by their lowest sequence, the log entries of the dropped events
//! are then exactly a prefix of the commit log: the chunks holding them are deleted (the one
//! straddling the new floor trimmed) in the same transaction, and `commit_seq` stays dense
//! above the new floor.

use std::time::Duration;

use serde::Serialize;
use sqlx::{PgPool, Row};

use crate::error::{Error, Result};
use crate::insert_lane::rows::{initial_frontier, to_i64, to_u64};

/// Retention settings, with documented defaults.
#[derive(Debug, Clone)]
pub struct RetentionConfig {
    pub(crate) keep: Option<Duration>,
    pub(crate) ahead: u32,
    pub(crate) force: bool,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            keep: None,
            ahead: 2,
            force: false,
        }
    }
}

impl RetentionConfig {
    /// Only create partitions ahead; drop nothing. The default.
    pub fn new() -> Self {
        Self::default()
    }

    /// Drop partitions whose newest event is older than `keep`. Default: never drop.
    pub fn keep(mut self, keep: Duration) -> Self {
        self.keep = Some(keep);
        self
    }

    /// How many empty partitions to keep ready above the head. Default 2.
    pub fn ahead(mut self, partitions: u32) -> Self {
        self.ahead = partitions.max(1);
        self
    }

    /// Drop even what subscriptions still need (they then halt with
    /// [`Error::BelowRetentionFloor`]). Never splits a group, never drops what the lanes and
    /// the sequencer need. Default off.
    pub fn force(mut self, force: bool) -> Self {
        self.force = force;
        self
    }
}

/// One pair of partitions (events and log) and what retention makes of it.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct PartitionInfo {
    /// The events partition (`ordo.<name>`).
    pub name: String,
    /// The first sequence it may hold (`None`: no lower bound).
    pub from: Option<u64>,
    /// One past the last sequence it may hold.
    pub to: u64,
    /// Dropped (or, in a plan, droppable) in this run.
    pub drop: bool,
    /// Why it is kept, or `"past retention"`.
    pub reason: String,
}

/// What a retention run saw and did.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct RetentionReport {
    /// Every partition pair, oldest first, before this run's drops.
    pub partitions: Vec<PartitionInfo>,
    /// Partition pairs created ahead of the head.
    pub created: Vec<String>,
    /// Partition pairs dropped.
    pub dropped: Vec<String>,
    /// The lowest sequence a consumer still needs, and who.
    pub needed_from: u64,
    /// Who needs `needed_from`.
    pub needed_by: String,
    /// The lowest sequence still stored after the run.
    pub events_floor: u64,
    /// The highest commit sequence dropped after the run.
    pub commit_floor: u64,
    /// The partition size (sequences per partition).
    pub partition_size: u64,
    /// One past the highest sequence the partitions can hold after the run.
    pub covered_until: u64,
}

const PARTITIONS: &str = r#"
SELECT c.relname AS name, pg_get_expr(c.relpartbound, c.oid) AS bound
FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = 'ordo.events'::regclass
"#;

const STATE: &str = r#"
SELECT p.partition_size, p.events_floor, p.commit_floor,
       (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM ordo.events_sequence) AS head,
       s.logged_through_sequence, s.last_commit_seq
FROM ordo.partitioning AS p, ordo.sequencer_state AS s
"#;

const SUBSCRIPTIONS: &str = r#"
SELECT s.name, s.lane, s.position,
       CASE s.lane
       WHEN 'insert' THEN s.position + 1
       ELSE (SELECT min(c.min_sequence) FROM ordo.commit_chunks AS c WHERE c.last_commit_seq > s.position)
       END AS needs
FROM ordo.subscriptions AS s
"#;

const NEWEST: &str = r#"
SELECT recorded_at < now() - make_interval(secs => $3) AS old_enough
FROM ordo.events WHERE sequence >= $1 AND sequence < $2
ORDER BY sequence DESC LIMIT 1
"#;

const STRADDLES: &str = r#"
SELECT EXISTS (
    SELECT 1 FROM ordo.events AS a
    JOIN ordo.events AS b ON b.commit_xid = a.commit_xid
    WHERE a.sequence >= $1 AND a.sequence < $2 AND a.commit_xid IS NOT NULL AND b.sequence >= $2)
"#;

const LOCK: &str = "SELECT pg_advisory_xact_lock(hashtext('ordo.retention'))";
/// Creating or dropping a partition takes an exclusive lock on the parent table, and a waiting
/// lock request queues every writer behind it. So the maintainer waits briefly and tries again
/// on its next look (within 250 ms while partitions run short) rather than stall writers behind
/// a long transaction.
const LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '100ms'";

const FLOORS: &str = r#"
UPDATE ordo.partitioning
SET events_floor = $1,
    commit_floor = $2,
    updated_at = now()
RETURNING events_floor, commit_floor
"#;

struct Bound {
    name: String,
    from: Option<u64>,
    to: u64,
}

fn parse_bound(name: String, bound: &str) -> Option<Bound> {
    // "FOR VALUES FROM (MINVALUE) TO ('1000001')" or "... FROM ('1000001') TO ('2000001')"
    let (from, to) = bound.split_once(" TO ")?;
    let number = |text: &str| -> Option<u64> {
        text.trim_matches(|c: char| !c.is_ascii_digit())
            .parse()
            .ok()
    };
    let from = from.rsplit_once("FROM")?.1;
    Some(Bound {
        name,
        from: if from.contains("MINVALUE") {
            None
        } else {
            Some(number(from)?)
        },
        to: number(to)?,
    })
}

async fn partitions(pool: &PgPool) -> Result<Vec<Bound>> {
    let rows = sqlx::query(PARTITIONS).fetch_all(pool).await?;
    let mut bounds = Vec::new();
    for row in &rows {
        let name: String = row.try_get("name")?;
        let bound: String = row.try_get("bound")?;
        let parsed = parse_bound(name.clone(), &bound).ok_or_else(|| Error::InvalidConfig {
            setting: "ordo.events partitions",
            reason: format!("partition {name} has a bound ordo does not understand: {bound}"),
        })?;
        bounds.push(parsed);
    }
    bounds.sort_by_key(|b| b.to);
    Ok(bounds)
}

/// What a retention run would do, without doing it.
///
/// # Errors
/// [`Error::Database`] if the catalog or the tables cannot be read.
pub async fn plan_retention(pool: &PgPool, config: &RetentionConfig) -> Result<RetentionReport> {
    retention(pool, config, false).await
}

/// Creates partitions ahead of the head and drops the ones past retention (see the module
/// docs for the rules). Safe to run from several processes at once: runs are serialised by an
/// advisory lock.
///
/// # Errors
/// [`Error::Database`] if a statement fails, for instance a lock not granted within 100 ms (a
/// long transaction holds the table); nothing is half-done, and the next run tries again.
pub async fn run_retention(pool: &PgPool, config: &RetentionConfig) -> Result<RetentionReport> {
    let mut attempt = 1;
    loop {
        match retention(pool, config, true).await {
            Err(Error::Database(sqlx::Error::Database(error)))
                if error.code().as_deref() == Some(LOCK_NOT_AVAILABLE) && attempt < 3 =>
            {
                // Someone held the table for a moment (a query, a short transaction): again.
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
}

const LOCK_NOT_AVAILABLE: &str = "55P03";

async fn retention(
    pool: &PgPool,
    config: &RetentionConfig,
    apply: bool,
) -> Result<RetentionReport> {
    // Runs are serialised before anything is read, so each plans on what the previous one left.
    // The advisory lock queues no writer; only the DDL below is bounded by the lock timeout.
    let mut serialised = match apply {
        true => {
            let mut tx = pool.begin().await?;
            sqlx::query(LOCK).execute(&mut *tx).await?;
            Some(tx)
        }
        false => None,
    };
    let state = sqlx::query(STATE).fetch_one(pool).await?;
    let size = to_u64(state.try_get("partition_size")?);
    let head = to_u64(state.try_get("head")?);
    let logged_through = to_u64(state.try_get("logged_through_sequence")?);
    let frontier = initial_frontier(pool).await?;

    let mut needed_from = frontier + 1;
    let mut needed_by = format!("the insert lane's frontier ({frontier})");
    if logged_through + 1 < needed_from {
        needed_from = logged_through + 1;
        needed_by = format!("the sequencer (logged through {logged_through})");
    }
    if !config.force {
        for row in sqlx::query(SUBSCRIPTIONS).fetch_all(pool).await? {
            let needs: Option<i64> = row.try_get("needs")?;
            let Some(needs) = needs.map(to_u64) else {
                continue;
            };
            if needs < needed_from {
                needed_from = needs;
                let name: String = row.try_get("name")?;
                let lane: String = row.try_get("lane")?;
                let position: i64 = row.try_get("position")?;
                needed_by = format!("subscription {name:?} ({lane} lane, position {position})");
            }
        }
    }

    let bounds = partitions(pool).await?;
    let mut infos = Vec::with_capacity(bounds.len());
    let mut dropping = true;
    for (index, bound) in bounds.iter().enumerate() {
        let reason = if !dropping {
            "an older partition is kept".to_owned()
        } else if index + 1 >= bounds.len() || bound.to > head {
            "holds the head".to_owned()
        } else if bound.to > needed_from {
            format!("needed by {needed_by}")
        } else if !past_retention(pool, config, bound).await? {
            "within retention".to_owned()
        } else if straddles(pool, bound).await? {
            format!("a transaction has events on both sides of {}", bound.to)
        } else {
            "past retention".to_owned()
        };
        let drop = reason == "past retention";
        dropping &= drop;
        infos.push(PartitionInfo {
            name: bound.name.clone(),
            from: bound.from,
            to: bound.to,
            drop,
            reason,
        });
    }

    let mut created = Vec::new();
    let mut dropped = Vec::new();
    let top = bounds.last().map_or(1, |b| b.to);
    let wanted_top = head + u64::from(config.ahead) * size + 1;
    let mut floors = (
        to_u64(state.try_get("events_floor")?),
        to_u64(state.try_get("commit_floor")?),
    );
    if let Some(mut tx) = serialised.take() {
        let doomed: Vec<&PartitionInfo> = infos.iter().filter(|p| p.drop).collect();
        sqlx::query(LOCK_TIMEOUT).execute(&mut *tx).await?;
        let mut from = top;
        while from < wanted_top {
            let suffix = from.to_string();
            // Names and bounds are numbers ordo computed, never user input.
            let sql = format!(
                "CREATE TABLE IF NOT EXISTS ordo.events_{suffix} PARTITION OF ordo.events FOR VALUES FROM ({from}) TO ({to});",
                to = from + size
            );
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut *tx)
                .await?;
            created.push(format!("events_{suffix}"));
            from += size;
        }
        for partition in &doomed {
            let sql = format!("DROP TABLE IF EXISTS ordo.{}", partition.name);
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut *tx)
                .await?;
            dropped.push(partition.name.clone());
        }
        if let Some(last) = doomed.last() {
            let commit_floor = crate::commit_lane::trim_below(&mut tx, last.to).await?;
            let row = sqlx::query(FLOORS)
                .bind(to_i64(last.to))
                .bind(to_i64(commit_floor))
                .fetch_one(&mut *tx)
                .await?;
            floors = (
                to_u64(row.try_get("events_floor")?),
                to_u64(row.try_get("commit_floor")?),
            );
        }
        tx.commit().await?;
    }
    Ok(RetentionReport {
        partitions: infos,
        created,
        dropped,
        needed_from,
        needed_by,
        events_floor: floors.0,
        commit_floor: floors.1,
        partition_size: size,
        covered_until: if apply {
            top.max(wanted_top_aligned(top, wanted_top, size))
        } else {
            top
        },
    })
}

/// The maintainer task of an [`Outbox`](crate::Outbox).
pub(crate) async fn maintain(
    pool: PgPool,
    config: RetentionConfig,
    every: Duration,
    mut stop: crate::task::StopSignal,
) {
    // Between full runs, a cheap look at the head: a burst that eats into the partitions
    // ahead triggers a run at once, instead of waiting out the interval while writers would
    // fail for want of a partition.
    const LOOK: Duration = Duration::from_millis(250);
    let mut margin: Option<(u64, u64)> = None; // (covered until, partition size)
    let mut next_run = tokio::time::Instant::now();
    loop {
        let due = tokio::time::Instant::now() >= next_run;
        let crowded = match margin {
            Some((until, size)) => match crate::insert_lane::rows::head(&pool).await {
                Ok(head) => head + size >= until,
                Err(_) => false,
            },
            None => false,
        };
        if due || crowded {
            match run_retention(&pool, &config).await {
                Ok(report) => {
                    margin = Some((report.covered_until, report.partition_size));
                    if !report.created.is_empty() || !report.dropped.is_empty() {
                        tracing::info!(created = ?report.created, dropped = ?report.dropped, "partitions maintained");
                    }
                }
                Err(error) => tracing::warn!(%error, "partition maintenance failed; will retry"),
            }
            next_run = tokio::time::Instant::now() + every;
        }
        tokio::select! {
            biased;
            _ = stop.stopped() => return,
            _ = tokio::time::sleep(LOOK.min(every)) => {}
        }
    }
}

/// Where the partitions end once `wanted` is covered in steps of `size` from `top`.
fn wanted_top_aligned(top: u64, wanted: u64, size: u64) -> u64 {
    if wanted <= top {
        top
    } else {
        top + (wanted - top).div_ceil(size) * size
    }
}

async fn past_retention(pool: &PgPool, config: &RetentionConfig, bound: &Bound) -> Result<bool> {
    let Some(keep) = config.keep else {
        return Ok(false);
    };
    let old: Option<bool> = sqlx::query_scalar(NEWEST)
        .bind(to_i64(bound.from.unwrap_or(0)))
        .bind(to_i64(bound.to))
        .bind(keep.as_secs_f64())
        .fetch_optional(pool)
        .await?;
    // An empty partition below the head is past retention.
    Ok(old.unwrap_or(true))
}

async fn straddles(pool: &PgPool, bound: &Bound) -> Result<bool> {
    Ok(sqlx::query_scalar(STRADDLES)
        .bind(to_i64(bound.from.unwrap_or(0)))
        .bind(to_i64(bound.to))
        .fetch_one(pool)
        .await?)
}
