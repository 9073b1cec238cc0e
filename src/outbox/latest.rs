//! Latest values on the outbox: publishing and following them (the work is in `latest/`).

use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{Postgres, Transaction};

use super::Outbox;
use crate::envelope::Headers;
use crate::error::{Error, Result};
use crate::latest::{self, Latest, LatestStream};
use crate::pooler::Statements;

impl<P> Outbox<P>
where
    P: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// Publishes `value` as the newest value of `event_type` (an exchange rate, the feature
    /// flags), in a transaction of its own. Returns its version: how many publishes of that
    /// type have committed, this one included.
    ///
    /// Only the newest value of a type is kept (`ordo.latest_values`, one row per type);
    /// nothing enters `ordo.events` or the commit log. Every [`latest`](Self::latest) stream
    /// of every process that selects the type gets it. `value` need not be of the outbox's
    /// event type `P`. See `docs/latest-values.md`.
    ///
    /// ```no_run
    /// # async fn run(outbox: ordo::Outbox<serde_json::Value>) -> ordo::Result<()> {
    /// #[derive(serde::Serialize)]
    /// struct Rate { pair: &'static str, micros: i64 }
    ///
    /// let version = outbox.publish_latest("fx.rate", &Rate { pair: "EURUSD", micros: 1_083_400 }).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an empty event type or one over 200 bytes;
    /// [`Error::Encode`] if `value` does not serialise; [`Error::Shutdown`] after
    /// [`shutdown`](Self::shutdown); [`Error::Database`] if the upsert fails.
    pub async fn publish_latest<V>(&self, event_type: &str, value: &V) -> Result<u64>
    where
        V: Serialize + ?Sized,
    {
        self.publish_latest_with_headers(event_type, value, &Headers::new())
            .await
    }

    /// [`publish_latest`](Self::publish_latest) with a header map, handed to listeners in
    /// [`Latest::headers`].
    ///
    /// # Errors
    /// As [`publish_latest`](Self::publish_latest); [`Error::Encode`] also for `headers`.
    pub async fn publish_latest_with_headers<V>(
        &self,
        event_type: &str,
        value: &V,
        headers: &Headers,
    ) -> Result<u64>
    where
        V: Serialize + ?Sized,
    {
        if self.inner.generations.is_closed() {
            return Err(Error::Shutdown);
        }
        let mut conn = self.inner.direct.acquire().await?;
        latest::publish(&mut conn, event_type, value, headers, Statements::Named).await
    }

    /// Publishes `value` as the newest value of `event_type` inside a transaction the caller
    /// owns: it takes effect, and listeners hear of it, only if that transaction commits. See
    /// [`OutboxTransaction::publish_latest`](crate::OutboxTransaction::publish_latest) for
    /// the locking this implies.
    ///
    /// # Errors
    /// As [`publish_latest`](Self::publish_latest); a failed upsert aborts the caller's
    /// transaction, as any failed statement does.
    pub async fn publish_latest_in<V>(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        event_type: &str,
        value: &V,
    ) -> Result<u64>
    where
        V: Serialize + ?Sized,
    {
        latest::publish(
            tx,
            event_type,
            value,
            &Headers::new(),
            self.inner.statements,
        )
        .await
    }

    /// Follows the latest values of `types`: first the current value of each type that has
    /// one, then every newer value as it commits, from any process. See [`LatestStream`] for
    /// what it may skip (intermediate versions) and what it never does (go back a version).
    ///
    /// Every latest stream of this outbox shares one `LISTEN` connection (not from the pool),
    /// opened by the first stream and closed by [`shutdown`](Self::shutdown).
    ///
    /// ```no_run
    /// # async fn run(outbox: ordo::Outbox<serde_json::Value>) -> ordo::Result<()> {
    /// use futures::StreamExt;
    ///
    /// #[derive(serde::Deserialize)]
    /// struct Rate { pair: String, micros: i64 }
    ///
    /// let mut rates = outbox.latest::<Rate>(["fx.rate"])?;
    /// while let Some(rate) = rates.next().await {
    ///     let rate = rate?;
    ///     println!("{} = {} (version {})", rate.payload.pair, rate.payload.micros, rate.version);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if `types` is empty or holds an empty type or one over 200
    /// bytes; [`Error::Shutdown`] after [`shutdown`](Self::shutdown).
    pub fn latest<T>(
        &self,
        types: impl IntoIterator<Item = impl Into<String>>,
    ) -> Result<LatestStream<T>>
    where
        T: DeserializeOwned + Send + Sync + 'static,
    {
        let types = latest::selection(types)?;
        let generation = self.inner.generations.running();
        let stop = generation.tasks.signal();
        if stop.is_stopped() {
            return Err(Error::Shutdown);
        }
        let hub = generation
            .latest
            .start(&generation.tasks, &generation.listen);
        Ok(latest::stream(
            hub,
            types,
            stop,
            Arc::clone(&generation.lane.rewind),
        ))
    }

    /// The current value of `event_type`, read from `ordo.latest_values` now; `None` if it
    /// was never published.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an invalid type; [`Error::UndecodableLatest`] if the value
    /// does not decode as `T`; [`Error::Database`] if the read fails.
    pub async fn latest_value<T>(&self, event_type: &str) -> Result<Option<Latest<T>>>
    where
        T: DeserializeOwned,
    {
        latest::check_type(event_type)?;
        let types = [event_type.to_owned()];
        let rows = latest::sql::read(&self.inner.direct, &types).await?;
        rows.first().map(latest::decode).transpose()
    }
}
