//! What retention sees: the partitions, the positions consumers need, the seals, and the verdict
//! on each partition. Everything here runs on one connection the caller holds.

use std::collections::HashMap;

use sqlx::PgConnection;

use super::sql;
use super::{PartitionInfo, RetentionConfig};
use crate::error::{Error, Result};
use crate::insert_lane::heads::frontier_on;
use crate::position::EventSequence;

/// A range partition pair, named after its `ordo.events` partition.
#[derive(Debug, Clone)]
pub(super) struct Bound {
    pub(super) name: String,
    pub(super) from: Option<u64>,
    pub(super) to: u64,
}

/// Rows in the default partition of `ordo.events`.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct DefaultRows {
    pub(super) rows: u64,
    pub(super) low: Option<u64>,
    pub(super) high: Option<u64>,
}

/// The positions and partitions a decision is made on.
pub(super) struct Snapshot {
    pub(super) size: u64,
    pub(super) head: u64,
    pub(super) events_floor: u64,
    pub(super) commit_floor: u64,
    pub(super) frontier: u64,
    /// The lowest sequence a consumer still needs, and who.
    pub(super) needed_from: u64,
    pub(super) needed_by: String,
    /// Range partitions, oldest first.
    pub(super) bounds: Vec<Bound>,
}

impl Snapshot {
    /// One past the highest sequence the range partitions cover (1 when there are none).
    pub(super) fn top(&self) -> u64 {
        self.bounds.last().map_or(1, |b| b.to)
    }
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

/// The range partitions of `ordo.events`, oldest first (the default partition is not one).
///
/// # Errors
/// [`Error::UnreadablePartitionBound`] for a partition that is not a range of sequences.
pub(super) async fn partitions(conn: &mut PgConnection) -> Result<Vec<Bound>> {
    let mut bounds = Vec::new();
    for (name, bound) in sql::partitions(conn).await? {
        if bound == "DEFAULT" {
            continue;
        }
        let Some(parsed) = parse_bound(name.clone(), &bound) else {
            return Err(Error::UnreadablePartitionBound {
                partition: name,
                bound,
            });
        };
        bounds.push(parsed);
    }
    bounds.sort_by_key(|b| b.to);
    Ok(bounds)
}

/// The rows in the default partition of `ordo.events`, whose range partitions are `bounds`.
pub(super) async fn default_rows(conn: &mut PgConnection, bounds: &[Bound]) -> Result<DefaultRows> {
    let top = EventSequence::new(bounds.last().map_or(0, |b| b.to));
    let low = bounds.first().and_then(|b| b.from).map(EventSequence::new);
    Ok(sql::default_rows(conn, top, low).await?)
}

/// The lowest and highest sequence in the default partition that a fold has just detached.
pub(super) async fn detached_range(conn: &mut PgConnection) -> Result<(Option<u64>, Option<u64>)> {
    let (low, high) = sql::detached_range(conn).await?;
    Ok((low.map(EventSequence::get), high.map(EventSequence::get)))
}

/// The drawn head and the partition size, for the steps that only extend the partitions.
pub(super) async fn head_and_size(conn: &mut PgConnection) -> Result<(u64, u64)> {
    let state = sql::state(conn).await?;
    Ok((state.head.get(), state.partition_size))
}

/// Reads the positions, what consumers need (subscriptions too, unless `force`), and the
/// partitions.
pub(super) async fn snapshot(conn: &mut PgConnection, force: bool) -> Result<Snapshot> {
    let state = sql::state(conn).await?;
    let logged_through = state.logged_through_sequence.get();
    let frontier = frontier_on(conn).await?;
    let mut needed_from = frontier + 1;
    let mut needed_by = format!("the insert lane's frontier ({frontier})");
    if logged_through + 1 < needed_from {
        needed_from = logged_through + 1;
        needed_by = format!("the sequencer (logged through {logged_through})");
    }
    if !force {
        for need in sql::subscription_needs(conn).await? {
            let Some(needs) = need.needs.map(EventSequence::get) else {
                continue;
            };
            if needs < needed_from {
                needed_from = needs;
                needed_by = format!(
                    "subscription {:?} ({} lane, position {})",
                    need.name, need.lane, need.position
                );
            }
        }
    }
    Ok(Snapshot {
        size: state.partition_size,
        head: state.head.get(),
        events_floor: state.events_floor.get(),
        commit_floor: state.commit_floor.get(),
        frontier,
        needed_from,
        needed_by,
        bounds: partitions(conn).await?,
    })
}

/// Records the first sighting of every sealed partition: one whose every sequence is at or
/// below the frontier (resolved: a committed event or a placeholder), so no event can enter it
/// any more and every event in it committed before this statement runs.
pub(super) async fn record_seals(conn: &mut PgConnection, snapshot: &Snapshot) -> Result<()> {
    let sealed: Vec<EventSequence> = snapshot
        .bounds
        .iter()
        .filter(|b| b.to <= snapshot.frontier + 1)
        .map(|b| EventSequence::new(b.to))
        .collect();
    if !sealed.is_empty() {
        sql::record_seals(conn, &sealed).await?;
    }
    Ok(())
}

/// How long ago each partition (by upper bound) was first seen sealed, in seconds.
///
/// A role that may not read the seals (an application role watching, with maintenance off)
/// sees none: every partition then counts as sealed just now, so a plan drops nothing.
pub(super) async fn seal_ages(conn: &mut PgConnection) -> Result<HashMap<u64, f64>> {
    let ages = match sql::seal_ages(conn).await {
        Ok(ages) => ages,
        Err(sqlx::Error::Database(error))
            if error.code().as_deref() == Some(super::INSUFFICIENT_PRIVILEGE) =>
        {
            return Ok(HashMap::new());
        }
        Err(error) => return Err(error.into()),
    };
    Ok(ages
        .into_iter()
        .map(|(bound, age)| (bound.get(), age))
        .collect())
}

/// The verdict on the partition at `index` of the snapshot, assuming every older one goes.
pub(super) async fn verdict(
    conn: &mut PgConnection,
    config: &RetentionConfig,
    snapshot: &Snapshot,
    ages: &HashMap<u64, f64>,
    index: usize,
) -> Result<PartitionInfo> {
    let bound = &snapshot.bounds[index];
    let sealed_seconds = ages.get(&bound.to).copied();
    let reason = if index + 1 >= snapshot.bounds.len() || bound.to > snapshot.head {
        "holds the head".to_owned()
    } else if bound.to > snapshot.needed_from {
        format!("needed by {}", snapshot.needed_by)
    } else if let Some(reason) = within_retention(config, sealed_seconds) {
        reason
    } else if straddles(conn, bound).await? {
        format!("a transaction has events on both sides of {}", bound.to)
    } else {
        PAST_RETENTION.to_owned()
    };
    Ok(PartitionInfo {
        name: bound.name.clone(),
        from: bound.from,
        to: bound.to,
        drop: reason == PAST_RETENTION,
        reason,
        sealed_seconds,
    })
}

pub(super) const PAST_RETENTION: &str = "past retention";

/// Why a sealed partition is still within retention, or `None` when it is past it. A partition
/// not yet seen sealed counts as sealed just now.
fn within_retention(config: &RetentionConfig, sealed_seconds: Option<f64>) -> Option<String> {
    let Some(keep) = config.keep else {
        return Some("within retention (no --keep)".to_owned());
    };
    let age = sealed_seconds.unwrap_or(0.0);
    // Compared in seconds as floats: any `keep` works, however large, without an overflow.
    (age < keep.as_secs_f64()).then(|| {
        format!(
            "within retention (its last event committed before it was sealed {age:.0}s ago; keep {}s)",
            keep.as_secs()
        )
    })
}

async fn straddles(conn: &mut PgConnection, bound: &Bound) -> Result<bool> {
    let from = EventSequence::new(bound.from.unwrap_or(0));
    Ok(sql::straddles(conn, from, EventSequence::new(bound.to)).await?)
}

/// Range partitions wholly above the head (no event can be in them yet).
pub(super) fn partitions_ahead(bounds: &[Bound], head: u64) -> u64 {
    bounds
        .iter()
        .filter(|b| b.from.is_some_and(|from| from > head))
        .count() as u64
}

/// What an operator must hear about rows in the default partition, when it holds some.
pub(super) fn default_warning(default: DefaultRows) -> Option<String> {
    (default.rows > 0).then(|| {
        format!(
            "ordo.events_default holds {} events (sequences {} to {}): the partitions made ahead ran out. \
             Writes still succeed; run `ordo retention --apply` as a role that owns ordo.events to fold \
             them into a range partition",
            default.rows,
            default.low.unwrap_or(0),
            default.high.unwrap_or(0)
        )
    })
}

/// What an operator must hear about: rows in the default partition, or too few partitions
/// ahead of the head.
pub(super) fn warning(
    config: &RetentionConfig,
    ahead: u64,
    head: u64,
    covered_until: u64,
    default: DefaultRows,
) -> Option<String> {
    if let Some(warning) = default_warning(default) {
        return Some(warning);
    }
    (ahead < u64::from(config.warn_below)).then(|| {
        format!(
            "only {ahead} partition(s) remain ahead of the head (sequence {head}; partitions end before {covered_until}): \
             partition maintenance is not keeping up or may not create tables. Run `ordo retention --apply` as a \
             role that owns ordo.events; past the last partition, events land in ordo.events_default"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_parse_with_and_without_a_lower_end() {
        let first = parse_bound("events_p0".into(), "FOR VALUES FROM (MINVALUE) TO ('101')");
        assert!(matches!(
            first,
            Some(Bound {
                from: None,
                to: 101,
                ..
            })
        ));
        let next = parse_bound("events_101".into(), "FOR VALUES FROM ('101') TO ('201')");
        assert!(matches!(
            next,
            Some(Bound {
                from: Some(101),
                to: 201,
                ..
            })
        ));
        assert!(parse_bound("events_default".into(), "DEFAULT").is_none());
    }

    #[test]
    fn an_enormous_keep_is_within_retention_not_an_overflow() {
        let config = RetentionConfig::new().keep(std::time::Duration::MAX);
        assert!(within_retention(&config, Some(1e12)).is_some());
        let config = RetentionConfig::new().keep(std::time::Duration::from_secs(10));
        assert!(within_retention(&config, Some(11.0)).is_none());
        assert!(
            within_retention(&config, None).is_some(),
            "unsealed counts as sealed now"
        );
    }
}
