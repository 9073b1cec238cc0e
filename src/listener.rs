//! The shape every lane's public stream shares: batches from a reader, mapped to items.
//!
//! Failures fall in three kinds, and only two of them ever reach the user:
//! - **transient** (the connection or the server went away, the pool had no free connection
//!   in time, a serialization failure or deadlock, a commit log still being folded again after
//!   a server crash): the stream retries the same position after
//!   a capped, jittered backoff, counts the retry in `ordo_stream_retries_total`, logs it at
//!   WARN with the position, and never yields it. A listener over a restarting server simply
//!   waits.
//! - **per item** (a payload that does not decode): yielded, naming the sequence; the stream
//!   goes on with the next event.
//! - **permanent** (the history is gone: below the retention floor or a missing row; the
//!   schema is not there; permission denied; the pool was closed): yielded once, then the
//!   stream ends, because reading on could only skip, repeat, or fail the same way for ever.

use std::future::Future;
use std::time::Duration;

use futures::stream::BoxStream;

use crate::error::{Error, Result};
use crate::task::StopSignal;
use crate::telemetry::metrics as m;

const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A lane reader: the next run of positions, waiting when caught up; `None` once the outbox
/// stops. A failed batch must leave the reader where it was, so that the retry reads the same
/// position again.
pub(crate) trait BatchSource: Send + 'static {
    type Item: Send + 'static;

    /// `insert` or `commit`: the lane, for logs and the retry metric.
    const LANE: &'static str;

    fn next_batch(&mut self) -> impl Future<Output = Option<Result<Vec<Self::Item>>>> + Send;

    /// The last position handed out (the next read starts right after it).
    fn position(&self) -> u64;

    /// The outbox's stop signal, so that a backoff ends early on shutdown.
    fn stop_signal(&self) -> StopSignal;
}

/// SQLSTATEs after which the same statement, tried again, may well succeed.
const TRANSIENT_SQLSTATES: &[&str] = &[
    "40001", // serialization_failure
    "40P01", // deadlock_detected
    "53300", // too_many_connections
    "57014", // query_canceled (statement_timeout, or an operator's pg_cancel_backend)
    "57P01", // admin_shutdown (a fast or immediate shutdown, pg_terminate_backend)
    "57P02", // crash_shutdown (another backend crashed; the server is restarting)
    "57P03", // cannot_connect_now (the server is starting up)
];

impl Error {
    /// Whether retrying the same read later may succeed: the connection, the pool or the
    /// server failed, not the request.
    pub(crate) fn is_transient(&self) -> bool {
        let error = match self {
            Error::Database(error) => error,
            // The sequencer is folding again what a crash lost.
            Error::CommitLogBehind { .. } => return true,
            _ => return false,
        };
        match error {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => true,
            // A connection cut mid-message surfaces as a protocol error (an unexpected end of
            // the stream), not as I/O.
            sqlx::Error::Protocol(_) => true,
            sqlx::Error::Database(error) => error.code().is_some_and(|code| {
                // Class 08: connection exception (reset, refused, failure).
                code.starts_with("08") || TRANSIENT_SQLSTATES.contains(&code.as_ref())
            }),
            _ => false,
        }
    }

    /// Errors about one item: the stream yields them and goes on.
    fn is_per_item(&self) -> bool {
        matches!(self, Error::UndecodablePayload { .. })
    }
}

/// The public stream over `source`; `map` turns a position into an item, or `None` to pass
/// over it (placeholders). Transient failures are retried here and never yielded; see the
/// module docs for what is.
pub(crate) fn retrying_stream<S, T, F>(mut source: S, mut map: F) -> BoxStream<'static, Result<T>>
where
    S: BatchSource,
    T: Send + 'static,
    F: FnMut(S::Item) -> Option<Result<T>> + Send + 'static,
{
    // One handle per stream, not a registry lookup per retry.
    let retries = metrics::counter!(m::STREAM_RETRIES, "lane" => S::LANE);
    let mut stop = source.stop_signal();
    Box::pin(async_stream::stream! {
        let mut backoff = FIRST_BACKOFF;
        while let Some(batch) = source.next_batch().await {
            match batch {
                Ok(items) => {
                    backoff = FIRST_BACKOFF;
                    for item in items {
                        if let Some(item) = map(item) {
                            yield item;
                        }
                    }
                }
                Err(error) if error.is_transient() => {
                    retries.increment(1);
                    let wait = jittered(backoff);
                    tracing::warn!(
                        lane = S::LANE,
                        after = source.position(),
                        %error,
                        ?wait,
                        "listener read failed transiently; retrying at the same position"
                    );
                    // Stopped meanwhile: the source says how it ended (the rewind that stopped
                    // the outbox, once), rather than the stream ending without a word.
                    tokio::select! {
                        biased;
                        _ = stop.stopped() => continue,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Err(error) if error.is_per_item() => yield Err(error),
                Err(error) => {
                    tracing::error!(
                        lane = S::LANE,
                        after = source.position(),
                        %error,
                        "listener stopped on an error it cannot retry"
                    );
                    yield Err(error);
                    break;
                }
            }
        }
    })
}

/// Between half of `backoff` and all of it, so that many listeners failing together (a server
/// restart, a drained pool) do not come back in step.
pub(crate) fn jittered(backoff: Duration) -> Duration {
    let half = backoff / 2;
    half + half.mul_f64(fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_and_pool_failures_are_transient_and_history_failures_are_not() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(Error::Database(sqlx::Error::Io(io)).is_transient());
        assert!(Error::Database(sqlx::Error::PoolTimedOut).is_transient());
        assert!(!Error::Database(sqlx::Error::PoolClosed).is_transient());
        assert!(!Error::Database(sqlx::Error::RowNotFound).is_transient());
        let missing = Error::MissingHistory {
            missing: crate::EventSequence::new(3),
        };
        assert!(!missing.is_transient());
        assert!(!missing.is_per_item());
    }

    #[test]
    fn jitter_stays_within_half_and_all_of_the_backoff() {
        for _ in 0..100 {
            let wait = jittered(Duration::from_millis(100));
            assert!(wait >= Duration::from_millis(50) && wait <= Duration::from_millis(100));
        }
    }
}
