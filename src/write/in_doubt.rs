//! Commits whose answer was lost.
//!
//! When the connection drops while `COMMIT` is in flight, the client cannot tell whether the
//! server committed. The writing transaction's id is known (the insert returned it), and
//! PostgreSQL keeps every recent transaction's fate (`pg_xact_status`), so another connection
//! can ask. A transaction whose backend has not noticed the lost client yet is still
//! `in progress`; it ends as soon as the backend reads the closed socket, so the question is
//! asked again for a short while before the commit is reported in doubt.

use std::time::Duration;

use sqlx::PgPool;
use tokio::time::Instant;

use super::sql;
use crate::error::Result;

/// How long a failed commit keeps asking before it reports [`Error::CommitInDoubt`]. A backend
/// whose client vanished (FIN or RST) ends its transaction within milliseconds; one that is
/// still `in progress` after this is behind a network partition, and waiting longer inside
/// `commit()` would only hold the caller.
///
/// [`Error::CommitInDoubt`]: crate::Error::CommitInDoubt
const PATIENCE: Duration = Duration::from_secs(5);
const FIRST_POLL: Duration = Duration::from_millis(10);
const MAX_POLL: Duration = Duration::from_millis(250);

/// Whether a transaction committed, as the server answering holds it
/// ([`Outbox::commit_status`](crate::Outbox::commit_status)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CommitStatus {
    /// It committed: its events are stored and will be delivered. Do not publish them again.
    Committed,
    /// It rolled back, never reached `COMMIT`, or is not in this server's history (a failover
    /// to a standby that never received it): nothing it wrote is stored. Retrying is safe.
    Aborted,
    /// It is still running (a backend that has not yet noticed its client is gone, or a
    /// transaction held open). Ask again later; do not retry yet, or the events may be stored
    /// twice.
    InProgress,
    /// PostgreSQL no longer keeps this transaction's status (it is older than the commit-status
    /// horizon) and `ordo.events` holds none of its events; if retention may have dropped its
    /// events, look for your own domain rows.
    Unknown,
}

/// Whether transaction `xid`, which published the events `ids`, committed, as the server
/// answering holds it. The events are the proof: after a failover to a standby that never
/// received the transaction, its xid is unknown to the promoted server ("in the future"), and
/// later the promoted server gives the same xid to a transaction of its own, whose fate
/// `pg_xact_status` would then report. So the status is asked first (a commit after that
/// answer makes the rows visible to the second question), and a `committed` transaction that
/// stored none of `ids` is another transaction: this one is not in this server's history.
///
/// With no `ids` there is no proof: the server's word on `xid` alone.
///
/// Retention drops events, not transaction ids: asked after retention dropped a committed
/// transaction's events, this answers `Aborted`. Ask within the retention period.
pub(crate) async fn status(pool: &PgPool, xid: i64, ids: &[uuid::Uuid]) -> Result<CommitStatus> {
    let asked = match sql::commit_status(pool, xid).await {
        Ok(asked) => asked,
        Err(error) if is_future_xid(&error) && !ids.is_empty() => {
            tracing::warn!(
                xid,
                "the server has no record of this transaction id (a failover to a standby that \
                 never received it): the transaction is not in its history"
            );
            return Ok(CommitStatus::Aborted);
        }
        Err(error) => return Err(error.into()),
    };
    Ok(match asked.as_deref() {
        Some("in progress") => CommitStatus::InProgress,
        Some("aborted") => CommitStatus::Aborted,
        Some("committed") if ids.is_empty() => CommitStatus::Committed,
        _ if ids.is_empty() => CommitStatus::Unknown,
        answer => {
            if sql::stored_by(pool, xid, ids).await? {
                CommitStatus::Committed
            } else if answer == Some("committed") {
                tracing::warn!(
                    xid,
                    "this transaction id committed but stored none of the events it published: \
                     it is another transaction's (the id was given again after a failover)"
                );
                CommitStatus::Aborted
            } else {
                CommitStatus::Unknown
            }
        }
    })
}

/// `pg_xact_status` of an xid the server has not reached (SQLSTATE 22023).
fn is_future_xid(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => {
            db.code().as_deref() == Some("22023") && db.message().contains("in the future")
        }
        _ => false,
    }
}

/// Which of `ids` are stored as events.
pub(crate) async fn published(pool: &PgPool, ids: &[uuid::Uuid]) -> Result<Vec<uuid::Uuid>> {
    Ok(sql::published(pool, ids).await?)
}

/// After a `COMMIT` that failed without an answer from the server: whether transaction `xid`,
/// which published `ids`, committed ([`status`]), asked on another connection of `pool` for
/// at most [`PATIENCE`]. `InProgress` or `Unknown` means the outcome could not be learned in
/// time.
pub(crate) async fn resolve(pool: &PgPool, xid: i64, ids: &[uuid::Uuid]) -> CommitStatus {
    let deadline = Instant::now() + PATIENCE;
    let mut poll = FIRST_POLL;
    loop {
        let asked = tokio::time::timeout_at(deadline, status(pool, xid, ids)).await;
        match asked {
            Ok(Ok(status @ (CommitStatus::Committed | CommitStatus::Aborted))) => return status,
            // The status of a transaction this recent is never forgotten; be safe anyway.
            Ok(Ok(CommitStatus::Unknown)) => return CommitStatus::Unknown,
            Ok(Ok(CommitStatus::InProgress)) => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, xid, "asking whether an in-doubt commit took effect failed");
            }
            Err(_) => return CommitStatus::InProgress,
        }
        if Instant::now() + poll >= deadline {
            return CommitStatus::InProgress;
        }
        tokio::time::sleep(poll).await;
        poll = (poll * 2).min(MAX_POLL);
    }
}
