//! Latest values: ephemeral, latest-value events. One row per event type in
//! `ordo.latest_values`, overwritten by each publish; nothing of it enters `ordo.events` or
//! the commit log.
//!
//! The path of a value:
//!
//! ```text
//!  publish ──ordo.publish_latest()──▶ ordo.latest_values (upsert, version + 1)
//!                                       │ NOTIFY ordo_latest '<version> <type>' at COMMIT
//!                                       ▼
//!  [listen] one LISTEN connection per Outbox ──▶ pending (the types notified)
//!                                       │
//!  [fetch]  one read of the pending types ──▶ broadcast of rows
//!                                       │
//!  [stream] every LatestStream: keeps the types it selected, newer versions only
//! ```
//!
//! The notification is a hint, never the data: a stream reads the table for its types when it
//! starts (after the LISTEN is up, so no commit falls between the two), after every reconnect
//! of the LISTEN connection, when it lagged the broadcast, after a failed fetch, and every
//! [`RESYNC_EVERY`] in case a connection died silently.
//!
//! The `listen` and `fetch` tasks start with the first stream of an outbox and stop with it.

mod fetch;
mod listen;
pub(crate) mod sql;
mod stream;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use tokio::sync::{Notify, broadcast, watch};

use crate::envelope::Headers;
use crate::error::{Error, Result};
use crate::listen::Listen;
use crate::pooler::Statements;
use crate::task::Tasks;

pub use stream::LatestStream;
pub(crate) use stream::{decode, stream};

/// The channel `ordo.publish_latest` notifies (fixed in the migration).
pub(crate) use crate::schema::LATEST_CHANNEL as CHANNEL;

/// The longest event type `ordo.latest_values` accepts, in bytes (its CHECK).
pub(crate) const MAX_TYPE_BYTES: usize = 200;

/// How often every stream reads its types again even without a notification: the bound on
/// staleness if the LISTEN connection died without the client noticing.
pub(crate) const RESYNC_EVERY: Duration = Duration::from_secs(30);

/// Rows a stream may fall behind the broadcast before it reads its types from the table again.
const BROADCAST_CAPACITY: usize = 1024;

/// One value of a latest-value event type, as a [`LatestStream`] yields it.
///
/// The payload is an [`Arc`]: clone the item freely.
#[derive(Debug)]
#[non_exhaustive]
pub struct Latest<T> {
    /// The event type (`ordo.latest_values.event_type`).
    pub event_type: String,
    /// How many publishes of this type had committed with this one (1 for the first). Grows
    /// by one per publish; a stream may skip versions, never go back.
    pub version: u64,
    /// The decoded value.
    pub payload: Arc<T>,
    /// The header map published with it.
    pub headers: Headers,
    /// When it was published (the clock time of the publishing statement).
    pub updated_at: DateTime<Utc>,
}

impl<T> Latest<T> {
    /// A value built by hand, for unit tests of code that consumes a [`LatestStream`] (no
    /// database needed): no headers, published now.
    ///
    /// ```
    /// let flags = ordo::Latest::new("flags", 3, vec!["dark_mode"]);
    /// assert_eq!((flags.event_type.as_str(), flags.version), ("flags", 3));
    /// assert_eq!(flags.payload[0], "dark_mode");
    /// ```
    pub fn new(event_type: impl Into<String>, version: u64, payload: T) -> Self {
        Self {
            event_type: event_type.into(),
            version,
            payload: Arc::new(payload),
            headers: Headers::new(),
            updated_at: Utc::now(),
        }
    }
}

impl<T> Clone for Latest<T> {
    fn clone(&self) -> Self {
        Self {
            event_type: self.event_type.clone(),
            version: self.version,
            payload: Arc::clone(&self.payload),
            headers: self.headers.clone(),
            updated_at: self.updated_at,
        }
    }
}

/// A row of `ordo.latest_values`, payload not yet decoded: shared by every stream of the
/// process, each decoding it as its own type.
#[derive(Debug)]
pub(crate) struct LatestRow {
    pub(crate) event_type: String,
    pub(crate) version: u64,
    pub(crate) payload: String,
    pub(crate) headers: Headers,
    pub(crate) updated_at: DateTime<Utc>,
}

/// What the tasks and the streams of one outbox share.
pub(crate) struct HubShared {
    pub(crate) pool: PgPool,
    /// Rows fetched after notifications.
    pub(crate) rows: broadcast::Sender<Arc<LatestRow>>,
    /// Raised (by one) each time streams must read their types again: a new LISTEN
    /// connection, a failed fetch, a periodic resync. Zero until the first LISTEN is up,
    /// which a stream waits for before its first read.
    pub(crate) epoch: watch::Sender<u64>,
    /// Types notified and not fetched yet: a burst of notifications costs one read.
    pending: Mutex<HashSet<String>>,
    /// Wakes the fetch task.
    poke: Notify,
}

impl HubShared {
    /// Streams read their types again.
    pub(crate) fn resync(&self) {
        self.epoch.send_modify(|epoch| *epoch += 1);
    }

    fn notified(&self, event_type: String) {
        if let Ok(mut pending) = self.pending.lock() {
            pending.insert(event_type);
        }
        self.poke.notify_one();
    }

    fn take_pending(&self) -> Vec<String> {
        match self.pending.lock() {
            Ok(mut pending) => pending.drain().collect(),
            Err(_) => Vec::new(),
        }
    }
}

/// An outbox's latest-value machinery, started by its first stream.
pub(crate) struct LatestHub {
    pool: PgPool,
    started: OnceLock<Arc<HubShared>>,
}

impl LatestHub {
    pub(crate) fn new(pool: PgPool) -> Self {
        Self {
            pool,
            started: OnceLock::new(),
        }
    }

    /// The shared state, the first time adding [`CHANNEL`] to the outbox's LISTEN connection
    /// and starting the `latest.fetch` task under `tasks`.
    pub(crate) fn start(&self, tasks: &Tasks, listen: &Listen) -> Arc<HubShared> {
        let shared = self.started.get_or_init(|| {
            let shared = Arc::new(HubShared {
                pool: self.pool.clone(),
                rows: broadcast::Sender::new(BROADCAST_CAPACITY),
                epoch: watch::Sender::new(0),
                pending: Mutex::new(HashSet::new()),
                poke: Notify::new(),
            });
            listen::listen(listen, tasks, Arc::clone(&shared));
            tasks.spawn(
                "latest.fetch",
                fetch::run(Arc::clone(&shared), tasks.signal()),
            );
            shared
        });
        Arc::clone(shared)
    }
}

/// Refuses an event type `ordo.latest_values` would refuse, with a message that says why.
pub(crate) fn check_type(event_type: &str) -> Result<()> {
    if event_type.is_empty() || event_type.len() > MAX_TYPE_BYTES {
        return Err(Error::InvalidConfig {
            setting: "latest-value event type",
            reason: format!(
                "{event_type:?} is {} bytes long; a latest-value type is 1 to {MAX_TYPE_BYTES} bytes",
                event_type.len()
            ),
        });
    }
    Ok(())
}

/// The selected types of a new stream, checked and without repeats.
pub(crate) fn selection<I, S>(types: I) -> Result<Vec<String>>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut selected: Vec<String> = Vec::new();
    for event_type in types {
        let event_type = event_type.into();
        check_type(&event_type)?;
        if !selected.contains(&event_type) {
            selected.push(event_type);
        }
    }
    if selected.is_empty() {
        return Error::invalid_config(
            "latest-value event types",
            "a latest-value stream needs at least one event type to follow",
        );
    }
    Ok(selected)
}

/// Publishes `value` as the newest value of `event_type` on `conn`, in whatever transaction
/// it is in, with `statements` as the connection's pool takes them. Returns the version.
pub(crate) async fn publish<V>(
    conn: &mut PgConnection,
    event_type: &str,
    value: &V,
    headers: &Headers,
    statements: Statements,
) -> Result<u64>
where
    V: Serialize + ?Sized,
{
    check_type(event_type)?;
    let payload = serde_json::to_string(value).map_err(Error::Encode)?;
    let headers = serde_json::to_string(headers).map_err(Error::Encode)?;
    Ok(sql::publish(conn, event_type, &payload, &headers, statements).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_selection_needs_types_of_a_storable_length_and_drops_repeats() {
        assert!(selection(Vec::<String>::new()).is_err());
        assert!(selection([""]).is_err());
        assert!(selection(["x".repeat(MAX_TYPE_BYTES + 1)]).is_err());
        let selected = selection(["fx.rate", "flags", "fx.rate"]).expect("valid types");
        assert_eq!(selected, ["fx.rate", "flags"]);
    }

    #[test]
    fn a_latest_item_clones_share_the_payload() {
        let item = Latest::new("flags", 1, vec![1, 2, 3]);
        let copy = item.clone();
        assert!(Arc::ptr_eq(&item.payload, &copy.payload));
    }
}
