//! The shape every lane's public stream shares: batches from a reader, mapped to items; a
//! failed read is yielded and retried at the same position after a capped backoff; an error
//! that no retry can mend ends the stream after it is yielded.

use std::future::Future;
use std::time::Duration;

use futures::stream::BoxStream;

use crate::error::{Error, Result};

const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A lane reader: the next run of positions, waiting when caught up; `None` once the outbox
/// stops.
pub(crate) trait BatchSource: Send + 'static {
    type Item: Send + 'static;

    fn next_batch(&mut self) -> impl Future<Output = Option<Result<Vec<Self::Item>>>> + Send;
}

impl Error {
    /// Errors after which reading on could only skip or repeat: the stream ends.
    fn ends_stream(&self) -> bool {
        matches!(
            self,
            Error::MissingHistory { .. }
                | Error::MissingCommitLog { .. }
                | Error::BelowRetentionFloor { .. }
        )
    }
}

/// The public stream over `source`; `map` turns a position into an item, or `None` to pass
/// over it (placeholders).
pub(crate) fn retrying_stream<S, T, F>(mut source: S, mut map: F) -> BoxStream<'static, Result<T>>
where
    S: BatchSource,
    T: Send + 'static,
    F: FnMut(S::Item) -> Option<Result<T>> + Send + 'static,
{
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
                Err(error) if error.ends_stream() => {
                    yield Err(error);
                    break;
                }
                Err(error) => {
                    yield Err(error);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    })
}
