//! After a rewind: a new server history, so that positions given again are told apart.
//!
//! A rewind (the log went back and positions went, or will go, to other events: a failover, a
//! restore, a storage snapshot, commits lost with `synchronous_commit = off`) keeps the
//! PostgreSQL timeline in every case but a promotion. A receiver that deduplicates by position
//! (a watermark inbox) would drop the new events at those positions as duplicates of the lost
//! ones. So the outbox that detects it begins a history of its own (`ordo.begin_history`,
//! migration `20261210000100_histories_and_chains.sql`) before its new lanes append anything:
//! relays send the new history's id with every position from where it begins, and an inbox
//! that handled those positions before reports the rewind and takes the new events.
//!
//! Where it begins: the lowest position this process knows went to another event, or the
//! lowest position above a head it saw the log go back to, or else the log's head now plus
//! one. Several processes that detect the same rewind begin one history between them (the
//! function returns the one another began, when it covers the same positions).

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::commit_lane::CommitShared;
use crate::commit_lane::sql::BEGIN_HISTORY;
use crate::insert_lane::Rewind;
use crate::telemetry::metrics::SERVER_REWOUND_POSITIONS;

/// SQLSTATE `insufficient_privilege`.
const INSUFFICIENT_PRIVILEGE: &str = "42501";

/// The history in force after a rewind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Begun {
    pub(crate) history: u64,
    pub(crate) from: u64,
    /// Whether this call began it (another process, or a promotion, may have).
    pub(crate) began: bool,
}

/// Begins the new history after the rewind `rewind` reported under the lanes of `commit`,
/// and logs what the database no longer holds. A role that may not begin one (it does not
/// fold) leaves it to one that does: logged, and not an error. Any other failure is returned
/// (the caller retries before its new lanes start).
pub(crate) async fn begin_after_rewind(
    pool: &PgPool,
    commit: &CommitShared,
    rewind: &Rewind,
) -> Result<Option<Begun>, sqlx::Error> {
    let from = match (rewind.first_given_again(), commit.went_back.lowest_fall()) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    // The published head never moves back: the highest position this process saw.
    let seen = commit.head();
    let known = commit.went_back.known_history();
    type Row = (i64, i64, bool, Option<DateTime<Utc>>);
    let row: Result<Row, sqlx::Error> = sqlx::query_as(BEGIN_HISTORY)
        .bind(i64::try_from(known).unwrap_or(i64::MAX))
        .bind(from.and_then(|from| i64::try_from(from).ok()))
        .bind(i64::try_from(seen).unwrap_or(i64::MAX))
        .fetch_one(pool)
        .await;
    let (history, first, began, kept_until) = match row {
        Ok(row) => row,
        Err(error)
            if error
                .as_database_error()
                .and_then(|db| db.code())
                .is_some_and(|code| code == INSUFFICIENT_PRIVILEGE) =>
        {
            tracing::warn!(
                %error,
                "ordo outbox: this role may not begin a new server history after the rewind \
                 (EXECUTE on ordo.begin_history, granted by ordo.grant_sequencer); a process \
                 that folds will, when it detects the rewind"
            );
            return Ok(None);
        }
        Err(error) => return Err(error),
    };
    let begun = Begun {
        history: u64::try_from(history).unwrap_or(0),
        from: u64::try_from(first).unwrap_or(1),
        began,
    };
    log_begun(begun, seen, known, kept_until);
    Ok(Some(begun))
}

/// Logs the history `begun`, with `seen` the highest position this process saw, `known` the
/// history it knew before, and `kept_until` when the database last held what it lost. Where
/// this call began it over positions this process saw, those are lost: counted, and named in
/// an error.
fn log_begun(begun: Begun, seen: u64, known: u64, kept_until: Option<DateTime<Utc>>) {
    if begun.began && seen >= begun.from {
        let lost = seen - begun.from + 1;
        metrics::counter!(SERVER_REWOUND_POSITIONS).increment(lost);
        let since = kept_until.map_or_else(
            || "an unknown time".to_owned(),
            |at| at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        );
        tracing::error!(
            lost_from = begun.from,
            lost_through = seen,
            lost_since = %since,
            history = begun.history,
            previous_history = known,
            "ordo outbox: commit positions {} to {seen} held events the database no longer holds \
             (this process had seen them; the database went back in time, and keeps what was \
             written up to {since}). They go to new events in a new server history, {}, from \
             position {}: relays send it, and a watermark inbox that handled those positions \
             reports the rewind and takes the new events",
            begun.from,
            begun.history,
            begun.from
        );
    } else if begun.began {
        tracing::warn!(
            history = begun.history,
            from = begun.from,
            "ordo outbox: a new server history begins at position {} after the rewind",
            begun.from
        );
    } else {
        tracing::info!(
            history = begun.history,
            from = begun.from,
            "ordo outbox: another process began the server history {} from position {} for \
             this rewind",
            begun.history,
            begun.from
        );
    }
}
