//! Which server history each commit position belongs to, for the `Ordo-History` a relay sends
//! beside a commit-lane position (`ordo.commit_histories`, migrations
//! `20261208000100_commit_histories.sql` and `20261210000100_histories_and_chains.sql`).
//!
//! The table gains a row at the first append after a promotion, in the transaction of that
//! append's chunk, and when an outbox that detected a rewind begins a history (before its new
//! lanes append, and before its relays claim again), so the rows read in one snapshot with the
//! log head cover every position up to that head. A relay reloads the table when it is about to send a position
//! above what its last load covered (under load, about once per append it relays); each
//! claim starts with nothing loaded.

use sqlx::PgPool;

use crate::position::ServerHistory;
use crate::telemetry::HotStatement;

/// Every history the log was appended on, `(history, from_commit_seq)`, with the log head
/// they cover (one snapshot).
pub(crate) const HISTORIES: &str = "SELECT h.history, h.from_commit_seq, \
     (SELECT last_commit_seq FROM ordo.sequencer_state WHERE singleton LIMIT 1) AS head \
     FROM ordo.commit_histories AS h";

#[derive(Debug, Default)]
pub(crate) struct Histories {
    rows: Vec<(i64, i64)>,
    /// The highest position known to be covered by `rows`.
    covered: u64,
}

impl Histories {
    /// Makes sure positions up to `position` (already read from the log) are covered.
    pub(crate) async fn cover(&mut self, pool: &PgPool, position: u64) -> Result<(), sqlx::Error> {
        if position <= self.covered {
            return Ok(());
        }
        let rows: Vec<(i64, i64, i64)> = sqlx::query_as(HISTORIES).fetch_all(pool).await?;
        let head = rows
            .first()
            .map_or(0, |row| u64::try_from(row.2).unwrap_or(0));
        self.rows = rows
            .into_iter()
            .map(|(history, from, _)| (history, from))
            .collect();
        // What was read before this snapshot is covered even if the head reads lower (a log
        // that a crash cut short, being folded again).
        self.covered = position.max(head);
        Ok(())
    }

    /// The history of `position`: the newest one that began at or below it. `None` before
    /// the table has a row for it (a log of an older schema), or for a position not covered.
    pub(crate) fn of(&self, position: u64) -> Option<ServerHistory> {
        if position > self.covered {
            return None;
        }
        let (id, from) = self
            .rows
            .iter()
            .filter(|(_, from)| u64::try_from(*from).is_ok_and(|from| from <= position))
            .max_by_key(|(history, _)| *history)?;
        Some(ServerHistory {
            id: u64::try_from(*id).ok()?,
            first_position: u64::try_from(*from).ok()?,
        })
    }
}

/// This file's statements on ordo's hot paths, with sample arguments, for `ops::plans`
/// (`tests/ops/plans.rs` fails if PostgreSQL would JIT-compile any).
pub(crate) const HOT_PATH: &[HotStatement] = &[HotStatement {
    name: "relay: server histories",
    sql: HISTORIES,
    types: "",
    args: "",
    session: &[],
}];

#[cfg(test)]
mod tests {
    use super::{Histories, ServerHistory};

    #[test]
    fn a_position_belongs_to_the_newest_history_that_began_at_or_below_it() {
        let histories = Histories {
            rows: vec![(1, 1), (3, 41), (2, 90)],
            covered: 200,
        };
        let on = |id, first_position| Some(ServerHistory { id, first_position });
        assert_eq!(histories.of(1), on(1, 1));
        assert_eq!(histories.of(40), on(1, 1));
        assert_eq!(histories.of(41), on(3, 41));
        assert_eq!(histories.of(95), on(3, 41));
        assert_eq!(histories.of(201), None);
        assert_eq!(Histories::default().of(1), None);
    }
}
