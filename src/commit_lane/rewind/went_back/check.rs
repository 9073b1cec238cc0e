//! The checks of the positions a head that went back left in doubt: against the database
//! ([`WentBack::check`]) and against what the fold appends again
//! ([`WentBack::check_reappended`]).

use sqlx::PgPool;

use super::{Unchecked, WentBack};
use crate::commit_lane::LogEntry;
use crate::commit_lane::sql::{GONE_BACK, SERVER_HISTORY};
use crate::error::Result;
use crate::position::CommitSequence;

impl WentBack {
    /// Positions a reader here returned whose events the cache no longer held when the log
    /// went back below them: the server's history decides. On the history this process knew,
    /// the log went back because a crash lost the last (asynchronous) appends, and the fold
    /// appends the same events again (a transaction's events are durable before the append
    /// that logs them). On a newer one (a promoted standby), events may be gone, and which
    /// ones this process returned cannot be told: reported as a rewind.
    async fn check_unchecked(&self, pool: &PgPool) -> Result<()> {
        let Some(unchecked) = self.unchecked.lock().ok().and_then(|u| *u) else {
            return Ok(());
        };
        // NULL on a standby (no history of its own to tell): checked again at the next read.
        let Some(now) = sqlx::query_scalar::<_, Option<i32>>(SERVER_HISTORY)
            .fetch_one(pool)
            .await?
        else {
            return Ok(());
        };
        if let Ok(mut u) = self.unchecked.lock() {
            *u = None;
        }
        let Unchecked {
            from,
            through,
            count,
            timeline,
        } = unchecked;
        let now = u64::try_from(now).unwrap_or(0);
        if now > timeline {
            self.report_from(unchecked.rewind(now), unchecked.from);
        } else {
            tracing::warn!(
                from,
                through,
                count,
                timeline = now,
                "the commit log went back on the same server history (a crash that lost the last \
                 appends): they are appended again from the same events; {count} of the positions \
                 this process returned are no longer in its log cache to compare"
            );
        }
        Ok(())
    }

    /// Checks the positions this process saw above a head the log went back to against the
    /// database: one appended again to its event is settled; one appended to another event, or
    /// whose event is gone from the database, was given twice, and the rewind is reported. One
    /// not appended again whose event is still stored waits for the fold (after a crash, the
    /// fold appends it again to the same position; [`check_reappended`](Self::check_reappended)
    /// and the next check see it).
    pub(crate) async fn check(&self, pool: &PgPool) -> Result<()> {
        self.check_unchecked(pool).await?;
        if self.reported() {
            return Ok(());
        }
        let (positions, seen): (Vec<i64>, Vec<i64>) = match self.gone.lock() {
            Ok(gone) => gone.iter().map(|(&p, &s)| (to_i64(p), to_i64(s))).unzip(),
            Err(_) => return Ok(()),
        };
        let (Some(&first), Some(&last)) = (positions.first(), positions.last()) else {
            return Ok(());
        };
        let rows: Vec<(i64, Option<i64>, bool, Option<i64>)> = sqlx::query_as(GONE_BACK)
            .bind(&positions)
            .bind(&seen)
            .bind(CommitSequence::new(u64::try_from(first - 1).unwrap_or(0)))
            .bind(CommitSequence::new(u64::try_from(last).unwrap_or(0)))
            .fetch_all(pool)
            .await?;
        for ((position, now, stored, lowest), seen) in rows.into_iter().zip(seen) {
            match now {
                Some(now) if now == seen => self.settle(position),
                // Retention trimmed it, event and entry: the bottom of the log, which no
                // crash or failover takes back (they lose its top).
                None if lowest.is_some_and(|lowest| position < lowest) => self.settle(position),
                Some(now) => {
                    self.report_from(
                        format!(
                            "the commit log went back and position {position} was appended again \
                         to the event of sequence {now}, where this process had seen sequence \
                         {seen}"
                        ),
                        u64::try_from(position).unwrap_or(0),
                    );
                    return Ok(());
                }
                None if !stored => {
                    self.report_from(
                        format!(
                            "the commit log went back below position {position}, and the event of \
                         sequence {seen} this process saw there is gone from the database"
                        ),
                        u64::try_from(position).unwrap_or(0),
                    );
                    return Ok(());
                }
                None => {}
            }
        }
        Ok(())
    }

    fn settle(&self, position: i64) {
        let Ok(mut gone) = self.gone.lock() else {
            return;
        };
        if gone.remove(&u64::try_from(position).unwrap_or(0)).is_some() && gone.is_empty() {
            tracing::info!(
                "the commit log is appended again with the events this process saw: no \
                 position was given to another event"
            );
        }
    }

    /// Compares entries about to be published with what this process saw at their positions
    /// before the log's head went back: a position that now holds another event was given
    /// twice (the database lost that event, or the transactions before it), and the rewind is
    /// reported.
    pub(crate) fn check_reappended(&self, entries: &[LogEntry]) {
        let Ok(mut gone) = self.gone.lock() else {
            return;
        };
        if gone.is_empty() {
            return;
        }
        for entry in entries {
            if let Some(seen) = gone.remove(&entry.commit_seq)
                && seen != entry.sequence
            {
                drop(gone);
                self.report_from(
                    format!(
                        "the commit log went back and position {} was appended again to the event \
                     of sequence {}, where this process had seen sequence {seen}",
                        entry.commit_seq, entry.sequence
                    ),
                    entry.commit_seq,
                );
                return;
            }
        }
        if gone.is_empty() {
            tracing::info!(
                "the commit log is appended again with the events this process saw: no \
                 position was given to another event"
            );
        }
    }
}

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
