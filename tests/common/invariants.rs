//! The commit log's invariants (`docs/design.md`, "Invariants", 2 to 6), checked by SQL and a walk of the
//! log. Table names are parameters so a deliberately wrong appender can be checked the same way.

use std::collections::{HashMap, HashSet};

use sqlx::{PgPool, Row};

/// Where a log lives.
pub struct LogTables {
    pub log: &'static str,
    pub state: &'static str,
}

pub const ORDO: LogTables = LogTables {
    log: "ordo.commit_log",
    state: "ordo.sequencer_state",
};

/// Checks invariants 2 to 6 after quiescence; `Err` names the first one broken.
pub async fn check_log(pool: &PgPool, tables: &LogTables) -> Result<(), String> {
    let sql = format!(
        "SELECT l.commit_seq, l.sequence, l.group_last, e.commit_xid \
         FROM {} AS l LEFT JOIN ordo.events AS e ON e.sequence = l.sequence ORDER BY l.commit_seq",
        tables.log
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_all(pool)
        .await
        .map_err(|e| e.to_string())?;
    let log: Vec<(i64, i64, bool, Option<i64>)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();

    // 2. Dense: commit_seq is exactly 1..=N.
    for (i, (commit_seq, ..)) in log.iter().enumerate() {
        if *commit_seq != i as i64 + 1 {
            return Err(format!(
                "log not dense: position {} holds commit_seq {commit_seq}",
                i + 1
            ));
        }
    }
    // 3. Complete: every real event exactly once, no placeholder.
    let real: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT sequence, commit_xid FROM ordo.events WHERE payload IS NOT NULL ORDER BY sequence",
    )
    .fetch_all(pool)
    .await
    .map_err(|e| e.to_string())?;
    let mut seen = HashSet::new();
    for (commit_seq, sequence, _, xid) in &log {
        if xid.is_none() {
            return Err(format!(
                "commit_seq {commit_seq} logs sequence {sequence}, which is not a real event"
            ));
        }
        if !seen.insert(*sequence) {
            return Err(format!(
                "sequence {sequence} is logged twice (again at commit_seq {commit_seq})"
            ));
        }
    }
    if seen.len() != real.len() {
        return Err(format!(
            "{} real events but {} logged",
            real.len(),
            seen.len()
        ));
    }
    // 4. Groups contiguous, in order inside, boundary only at each end; minimums increase.
    let group_sizes: HashMap<i64, usize> =
        real.iter().fold(HashMap::new(), |mut sizes, (_, xid)| {
            *sizes.entry(*xid).or_default() += 1;
            sizes
        });
    let mut finished: HashSet<i64> = HashSet::new();
    let mut current: Option<(i64, i64, usize)> = None; // (xid, last sequence, members so far)
    let mut last_min = i64::MIN;
    for (commit_seq, sequence, group_last, xid) in &log {
        let xid = xid.unwrap_or_default();
        match current {
            Some((open, last, count)) if open == xid => {
                if *sequence <= last {
                    return Err(format!(
                        "group {xid} not in sequence order at commit_seq {commit_seq}"
                    ));
                }
                current = Some((xid, *sequence, count + 1));
            }
            Some((open, ..)) => {
                return Err(format!(
                    "group {open} interrupted by group {xid} at commit_seq {commit_seq}"
                ));
            }
            None => {
                if finished.contains(&xid) {
                    return Err(format!(
                        "group {xid} appears twice (again at commit_seq {commit_seq})"
                    ));
                }
                if *sequence <= last_min {
                    return Err(format!(
                        "group minimums do not increase at commit_seq {commit_seq}"
                    ));
                }
                last_min = *sequence;
                current = Some((xid, *sequence, 1));
            }
        }
        let (_, _, count) = current.unwrap_or_default();
        let complete = group_sizes.get(&xid).copied() == Some(count);
        if *group_last != complete {
            return Err(format!(
                "group_last is {group_last} at commit_seq {commit_seq}, but the group is {}complete there",
                if complete { "" } else { "not " }
            ));
        }
        if complete {
            finished.insert(xid);
            current = None;
        }
    }
    if let Some((xid, ..)) = current {
        return Err(format!("group {xid} is cut off at the end of the log"));
    }
    check_state(pool, tables, log.len()).await
}

/// 6. The state row consistent with a log of `logged` rows.
async fn check_state(pool: &PgPool, tables: &LogTables, logged: usize) -> Result<(), String> {
    let sql = format!(
        "SELECT s.last_commit_seq, s.logged_through_sequence, \
           (SELECT count(*) FROM ordo.events e WHERE e.payload IS NOT NULL \
              AND e.sequence <= s.logged_through_sequence \
              AND NOT EXISTS (SELECT 1 FROM {} l WHERE l.sequence = e.sequence)) \
         FROM {} s",
        tables.log, tables.state
    );
    let (head, _through, unlogged): (i64, i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .fetch_one(pool)
        .await
        .map_err(|e| e.to_string())?;
    if head != logged as i64 {
        return Err(format!(
            "last_commit_seq is {head} but the log has {logged} rows"
        ));
    }
    if unlogged != 0 {
        return Err(format!(
            "{unlogged} real events at or below logged_through_sequence are not logged"
        ));
    }
    Ok(())
}

/// Commit sequences of `a`'s and `b`'s first events, to check causal order.
pub async fn commit_position_of_xid(pool: &PgPool, xid: i64) -> i64 {
    sqlx::query_scalar(
        "SELECT min(l.commit_seq) FROM ordo.commit_log l JOIN ordo.events e USING (sequence) WHERE e.commit_xid = $1",
    )
    .bind(xid)
    .fetch_one(pool)
    .await
    .expect("commit position of a transaction")
}

/// Counts of real events and of log rows.
pub async fn counts(pool: &PgPool) -> (i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM ordo.events WHERE payload IS NOT NULL), (SELECT count(*) FROM ordo.commit_log)",
    )
    .fetch_one(pool)
    .await
    .expect("counts")
}

/// The commit log's head as stored (`last_commit_seq`).
pub async fn stored_head(pool: &PgPool) -> u64 {
    let head: i64 = sqlx::query_scalar("SELECT last_commit_seq FROM ordo.sequencer_state")
        .fetch_one(pool)
        .await
        .expect("the head");
    u64::try_from(head).expect("positive")
}

/// Waits up to 30 s for the stored log head to reach `head`. A commit-lane listener in the
/// process that committed may have positions before their append lands
/// (`OutboxConfig::early_commit_listeners`): a test that heard them waits for this before it
/// reads the log. Returns whether it did.
pub async fn log_reaches(pool: &PgPool, head: u64) -> bool {
    let head = i64::try_from(head).unwrap_or(i64::MAX);
    super::eventually(std::time::Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, i64>("SELECT last_commit_seq FROM ordo.sequencer_state")
            .fetch_one(pool)
            .await
            .is_ok_and(|stored| stored >= head)
    })
    .await
}
