//! Retention: keep range partitions ready ahead of the head, fold rows that landed in the
//! default partition back into a range partition, and drop whole partitions (events and their
//! commit-log rows together) once they are past the configured age and no consumer needs them.
//!
//! A pair of partitions covering sequences `[from, to)` is dropped only when all of:
//! - it is **sealed** (every sequence below `to` is resolved, so no event can enter it any
//!   more) and was first seen sealed longer than [`RetentionConfig::keep`] ago: every event in
//!   it committed before that moment. `recorded_at` is not used: it is the writing
//!   transaction's *start*, and a transaction that started early and published last would make
//!   the whole partition look old;
//! - nothing at or above `from` is still needed: not by the insert lane's frontier, not by the
//!   sequencer (`logged_through_sequence`), not by any subscription, paused and halted ones
//!   included (unless [`RetentionConfig::force`]);
//! - no source transaction has events on both sides of `to` (a group is never split);
//! - every older partition is dropped in the same run or before (drops go oldest first).
//!
//! Because groups are ordered by their lowest sequence, the log rows of the dropped events are
//! then exactly a prefix of the commit log: `commit_seq` stays dense above the new floor.
//!
//! Every change is its own short transaction (one partition pair created, folded or dropped),
//! re-checked under an advisory lock that serialises runs, with a short lock timeout: writers
//! never queue behind more than one step, and a step that cannot have its locks at once is
//! tried again for up to [`RetentionConfig::retry_for`]. No step holds a connection
//! while it waits for another.

mod maintain;
mod plan;
mod sql;
mod steps;

use serde::Serialize;
use sqlx::PgPool;

use crate::error::Result;

pub(crate) use maintain::maintain;
use steps::{Done, Extended, Step};
pub(crate) use steps::{INSUFFICIENT_PRIVILEGE, sqlstate};

pub(crate) use crate::config::{MAX_AHEAD, RetentionConfig};

/// One pair of partitions (events and log) and what retention makes of it.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct PartitionInfo {
    /// The events partition (`ordo.<name>`); the log partition has the same suffix.
    pub name: String,
    /// The first sequence it may hold (`None`: no lower bound).
    pub from: Option<u64>,
    /// One past the last sequence it may hold.
    pub to: u64,
    /// Dropped (or, in a plan, droppable) in this run.
    pub drop: bool,
    /// Why it is kept, or `"past retention"`.
    pub reason: String,
    /// How long ago it was first seen sealed, in seconds (`None`: not seen sealed yet).
    pub sealed_seconds: Option<f64>,
}

/// What a retention run saw and did.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct RetentionReport {
    /// Every range partition pair, oldest first, before this run's changes.
    pub partitions: Vec<PartitionInfo>,
    /// Partition pairs created ahead of the head.
    pub created: Vec<String>,
    /// Range partition pairs made of the default partitions' rows.
    pub folded: Vec<String>,
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
    /// One past the highest sequence the range partitions can hold after the run.
    pub covered_until: u64,
    /// The highest sequence drawn.
    pub head: u64,
    /// Range partitions wholly above the head after the run.
    pub partitions_ahead: u64,
    /// Events in the default partition after the run (0 unless the partitions ran out).
    pub default_rows: u64,
    /// What an operator must act on: rows in the default partition, or fewer partitions ahead
    /// than [`RetentionConfig::warn_below`].
    pub warning: Option<String>,
}

/// What a retention run would do, without doing it. Changes nothing.
///
/// # Errors
/// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for `ahead` above [`MAX_AHEAD`] or `retry_for` above
/// [`MAX_RETRY_FOR`](crate::MAX_RETRY_FOR); [`Error::Database`](crate::Error::Database) if the catalog or the tables cannot be read.
pub async fn plan_retention(pool: &PgPool, config: &RetentionConfig) -> Result<RetentionReport> {
    config.validate()?;
    let mut conn = pool.acquire().await?;
    look(&mut conn, config, Look::Plan).await
}

/// Records newly sealed partitions, folds the default partition's rows into a range partition,
/// creates partitions ahead of the head and drops the ones past retention (see the module docs
/// for the rules), one short transaction per partition pair. Safe to run from several
/// processes at once: steps are serialised by an advisory lock and re-checked under it.
///
/// # Errors
/// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for `ahead` above [`MAX_AHEAD`] or `retry_for` above
/// [`MAX_RETRY_FOR`](crate::MAX_RETRY_FOR). [`Error::Database`](crate::Error::Database) if a statement fails: SQLSTATE `55P03` when a step
/// could not have its locks (a long transaction holds the table) until
/// [`RetentionConfig::retry_for`] passed, `42501` when the role may not create or drop tables
/// (run it as the owner of `ordo.events`). Steps already done stay done; the next run goes on
/// from there.
pub async fn run_retention(pool: &PgPool, config: &RetentionConfig) -> Result<RetentionReport> {
    config.validate()?;
    // The plan, on one connection that is released before any step.
    let before = {
        let mut conn = pool.acquire().await?;
        look(&mut conn, config, Look::RecordSeals).await?
    };
    let mut folded = Vec::new();
    let mut created = Vec::new();
    let mut notes = Vec::new();
    // Bounded, should writers outrun the steps: the next run goes on from here.
    for _ in 0..2 * MAX_AHEAD {
        match steps::retrying(pool, config, Step::Extend).await? {
            Done::Extended(Extended::Folded(name)) => folded.push(name),
            Done::Extended(Extended::Created(name)) => created.push(name),
            Done::Extended(Extended::CannotFold(why)) => {
                notes.push(why);
                break;
            }
            Done::Extended(Extended::Enough) | Done::Dropped(_) => break,
        }
    }
    let mut dropped = Vec::new();
    for doomed in before.partitions.iter().filter(|p| p.drop) {
        let step = Step::DropOldest(&doomed.name);
        if !matches!(
            steps::retrying(pool, config, step).await?,
            Done::Dropped(true)
        ) {
            break;
        }
        dropped.push(doomed.name.clone());
    }
    let after = {
        let mut conn = pool.acquire().await?;
        look(&mut conn, config, Look::After).await?
    };
    let mut report = after;
    report.partitions = before.partitions;
    report.created = created;
    report.folded = folded;
    report.dropped = dropped;
    if !notes.is_empty() {
        let warning = report.warning.take().into_iter().chain(notes);
        report.warning = Some(warning.collect::<Vec<_>>().join("; "));
    }
    Ok(report)
}

/// The events in the default partition of `ordo.events` and, when there are any, what an
/// operator should do about them, for `ordo status`. Read through the parent table, as a role
/// with no right on the partitions may; an index range read beyond the range partitions, so
/// free while the default is empty.
pub(crate) async fn default_partition(pool: &PgPool) -> Result<(u64, Option<String>)> {
    let mut conn = pool.acquire().await?;
    let bounds = plan::partitions(&mut conn).await?;
    let default = plan::default_rows(&mut conn, &bounds).await?;
    Ok((default.rows, plan::default_warning(default)))
}

/// What [`look`] does besides reading.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Look {
    /// Reads and judges every partition.
    Plan,
    /// Records newly sealed partitions first, then as `Plan`.
    RecordSeals,
    /// After a run's changes: positions and room only (the verdicts were the plan's).
    After,
}

/// Reads everything a report shows.
async fn look(
    conn: &mut sqlx::PgConnection,
    config: &RetentionConfig,
    mode: Look,
) -> Result<RetentionReport> {
    let snapshot = plan::snapshot(conn, config.force).await?;
    if mode == Look::RecordSeals {
        plan::record_seals(conn, &snapshot).await?;
    }
    let ages = plan::seal_ages(conn).await?;
    let mut partitions = Vec::with_capacity(snapshot.bounds.len());
    let mut dropping = true;
    let judged = if mode == Look::After {
        0
    } else {
        snapshot.bounds.len()
    };
    for index in 0..judged {
        let info = if dropping {
            plan::verdict(conn, config, &snapshot, &ages, index).await?
        } else {
            let bound = &snapshot.bounds[index];
            PartitionInfo {
                name: bound.name.clone(),
                from: bound.from,
                to: bound.to,
                drop: false,
                reason: "an older partition is kept".to_owned(),
                sealed_seconds: ages.get(&bound.to).copied(),
            }
        };
        dropping &= info.drop;
        partitions.push(info);
    }
    let default = plan::default_rows(conn, &snapshot.bounds).await?;
    let covered_until = snapshot.top();
    let ahead = plan::partitions_ahead(&snapshot.bounds, snapshot.head);
    Ok(RetentionReport {
        partitions,
        created: Vec::new(),
        folded: Vec::new(),
        dropped: Vec::new(),
        needed_from: snapshot.needed_from,
        needed_by: snapshot.needed_by,
        events_floor: snapshot.events_floor,
        commit_floor: snapshot.commit_floor,
        partition_size: snapshot.size,
        covered_until,
        head: snapshot.head,
        partitions_ahead: ahead,
        default_rows: default.rows,
        warning: plan::warning(config, ahead, snapshot.head, covered_until, default),
    })
}
