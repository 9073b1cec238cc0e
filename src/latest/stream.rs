//! The public latest-value stream: the current value of each selected type, then each newer
//! one.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use serde::de::DeserializeOwned;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, watch};

use super::{HubShared, Latest, LatestRow, sql};
use crate::error::{Error, Result};
use crate::insert_lane::Rewind;
use crate::listener::jittered;
use crate::task::StopSignal;

const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The stream returned by [`Outbox::latest`](crate::Outbox::latest): the newest values of the
/// selected event types.
///
/// # What it yields
///
/// First the current value of each selected type that has one (in no particular order
/// between types), then each newer value as it commits. Per type, versions only grow: a
/// stream never yields a version at or below one it has yielded. **Intermediate versions may
/// be skipped**: these are latest values, not a history. A stream that was busy, lagged, or
/// lost its connection while a type moved from version 3 to 7 yields 7 only. After the
/// publishes stop, every stream's last value of a type is the value in `ordo.latest_values`.
///
/// # Errors a stream yields
///
/// - [`Error::UndecodableLatest`]: a value does not decode as `T`; it names the type and the
///   version, is logged at WARN, and the stream **goes on** (the next version of that type is
///   yielded if it decodes).
/// - [`Error::Database`] with a permanent cause (the `ordo` schema not migrated, permission
///   denied, the pool closed): yielded once, then the stream ends.
/// - [`Error::ServerRewound`]: the database went back in time under the outbox (a failover
///   that lost transactions): a lost value's version may be given again to another value,
///   which this stream would skip as already seen. Yielded once, then the stream ends; open a
///   new one ([`OutboxConfig::on_rewind`](crate::OutboxConfig::on_rewind)).
///
/// Transient failures (a lost connection, a restarting server, a pool timeout) are not
/// yielded: the stream reads its types again after a capped, jittered backoff (50 ms doubling
/// to 5 s). If the shared LISTEN connection is lost, it reconnects and every stream reads its
/// types again, so a lost notification delays a value, never loses it.
///
/// The stream ends (`None`) when the outbox shuts down.
pub type LatestStream<T> = BoxStream<'static, Result<Latest<T>>>;

/// What woke a stream up.
enum Wake {
    Row(Arc<LatestRow>),
    Reread,
    Stop,
}

/// How a read of the selected types ended.
enum Read {
    Rows(Vec<LatestRow>),
    /// Failed transiently; the backoff was waited out: read again.
    Retry,
    /// Failed for good: yield it and end.
    Failed(Error),
    Stop,
}

/// A stream's state between items.
struct Follower {
    hub: Arc<HubShared>,
    types: Vec<String>,
    rows: broadcast::Receiver<Arc<LatestRow>>,
    epoch: watch::Receiver<u64>,
    stop: StopSignal,
    /// Reported when the outbox's lanes stop because the database went back in time: the
    /// stream ends with the error (a lost upsert's version may be given again to another
    /// value, which a stream that went on would skip as already seen).
    rewind: Arc<Rewind>,
    backoff: Duration,
    /// The highest version yielded per selected type (0: none yet).
    seen: HashMap<String, u64>,
}

/// The stream of `types` over `hub`'s rows; ends on `stop`, with the error of `rewind` if that
/// is why the outbox stopped it.
pub(crate) fn stream<T>(
    hub: Arc<HubShared>,
    types: Vec<String>,
    stop: StopSignal,
    rewind: Arc<Rewind>,
) -> LatestStream<T>
where
    T: DeserializeOwned + Send + Sync + 'static,
{
    let mut follower = Follower {
        // Subscribed before the first read: a row broadcast after it is not missed.
        rows: hub.rows.subscribe(),
        epoch: hub.epoch.subscribe(),
        seen: types.iter().map(|t| (t.clone(), 0)).collect(),
        hub,
        types,
        stop,
        rewind,
        backoff: FIRST_BACKOFF,
    };
    Box::pin(async_stream::stream! {
        let mut reread = true;
        loop {
            if reread {
                match follower.read().await {
                    Read::Rows(current) => {
                        reread = false;
                        for row in current {
                            if let Some(item) = accept(&mut follower.seen, &row) {
                                yield item;
                            }
                        }
                    }
                    Read::Retry => continue,
                    Read::Failed(error) => {
                        yield Err(error);
                        break;
                    }
                    Read::Stop => {
                        if let Some(error) = follower.rewind.error() {
                            yield Err(error);
                        }
                        break;
                    }
                }
            }
            match follower.wake().await {
                Wake::Stop => {
                    if let Some(error) = follower.rewind.error() {
                        yield Err(error);
                    }
                    break;
                }
                Wake::Reread => reread = true,
                Wake::Row(row) => {
                    if let Some(item) = accept(&mut follower.seen, &row) {
                        yield item;
                    }
                }
            }
        }
    })
}

impl Follower {
    /// Reads the selected types from the table, once the LISTEN is up (or a commit between
    /// the read and the LISTEN would be lost); waits out the backoff after a transient failure.
    async fn read(&mut self) -> Read {
        let up = tokio::select! {
            biased;
            _ = self.stop.stopped() => false,
            up = self.epoch.wait_for(|epoch| *epoch >= 1) => up.is_ok(),
        };
        if !up {
            return Read::Stop;
        }
        let error = match sql::read(&self.hub.pool, &self.types).await {
            Ok(rows) => {
                self.backoff = FIRST_BACKOFF;
                return Read::Rows(rows);
            }
            Err(error) => Error::from(error),
        };
        if !error.is_transient() {
            tracing::error!(%error, "latest-value stream stopped on an error it cannot retry");
            return Read::Failed(error);
        }
        let wait = jittered(self.backoff);
        tracing::warn!(%error, ?wait, "reading latest values failed transiently; retrying");
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        tokio::select! {
            biased;
            _ = self.stop.stopped() => Read::Stop,
            _ = tokio::time::sleep(wait) => Read::Retry,
        }
    }

    /// Waits for a row, a request to read again, or the stop.
    async fn wake(&mut self) -> Wake {
        tokio::select! {
            biased;
            _ = self.stop.stopped() => Wake::Stop,
            changed = self.epoch.changed() => match changed {
                Ok(()) => Wake::Reread,
                Err(_) => Wake::Stop,
            },
            row = self.rows.recv() => match row {
                Ok(row) => Wake::Row(row),
                // Rows were dropped for this stream: the table has the newest.
                Err(RecvError::Lagged(_)) => Wake::Reread,
                Err(RecvError::Closed) => Wake::Stop,
            },
        }
    }
}

/// The item for `row` if its type is selected and its version newer than any yielded; records
/// the version either way (an undecodable value is reported once, not at every re-read).
fn accept<T: DeserializeOwned>(
    seen: &mut HashMap<String, u64>,
    row: &LatestRow,
) -> Option<Result<Latest<T>>> {
    let highest = seen.get_mut(&row.event_type)?;
    if row.version <= *highest {
        return None;
    }
    *highest = row.version;
    Some(decode(row))
}

/// `row` decoded as `T`; an error names the type and the version, and is logged.
pub(crate) fn decode<T: DeserializeOwned>(row: &LatestRow) -> Result<Latest<T>> {
    match serde_json::from_str::<T>(&row.payload) {
        Ok(payload) => Ok(Latest {
            event_type: row.event_type.clone(),
            version: row.version,
            payload: Arc::new(payload),
            headers: row.headers.clone(),
            updated_at: row.updated_at,
        }),
        Err(source) => {
            tracing::warn!(
                event_type = row.event_type,
                version = row.version,
                error = %source,
                "a latest value does not decode as the stream's type"
            );
            Err(Error::UndecodableLatest {
                event_type: row.event_type.clone(),
                version: row.version,
                source: Arc::new(source),
            })
        }
    }
}
