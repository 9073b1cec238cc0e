//! Subscriptions and relays: both start a runner on the consumer core (`consumer::start`), which
//! reads the lanes the outbox runs now, and again after a rewind.

use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Outbox;
use crate::consumer::{Shared, SubscriptionHandle};
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::subscription::{self, JobConfig, Subscriber};

impl<P> Outbox<P>
where
    P: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// Starts a durable subscription: `subscriber` handles every event of the configured lane,
    /// from the stored position (or the configured start for a new subscription), each in a
    /// transaction that also checkpoints the position. One process runs a given subscription at
    /// a time; others with the same name wait on standby and take over when its lease expires.
    ///
    /// When `P` is a tagged serde enum, the subscription takes only `P`'s own event types
    /// unless `config` chooses ([`JobConfig::event_types`], [`JobConfig::all_types`]): a row of
    /// another type (another service's, a plain-SQL insert) is skipped, never handed to the
    /// handler to fail on.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a contradictory `config`; [`Error::LaneMismatch`] when the
    /// stored subscription follows the other lane; [`Error::Database`] if its row cannot be
    /// read or created; [`Error::ServerRewound`] as [`begin`](Self::begin) returns it.
    pub async fn subscribe<S>(&self, config: JobConfig, subscriber: S) -> Result<SubscriptionHandle>
    where
        S: Subscriber<P>,
    {
        self.refuse_while_rewound()?;
        subscription::spawn(
            self.shared(),
            &self.inner.runners,
            config.resolve_types::<P>(),
            subscriber,
        )
        .await
    }

    /// Starts a relay: every event of the configured lane is delivered to `sink` at least once,
    /// with its id as the message id so that the receiver deduplicates, in order per key
    /// (`keys` gives an event's keys, as [`Subscriber::keys`] does for a keyed subscription;
    /// events with no key in common are sent in the same batches, in no particular order).
    /// No sink I/O happens inside a database transaction: a batch is sent under one deadline,
    /// then its results are stored, fenced by the relay's lease. See [`crate::relay`] and
    /// `docs/relays.md`.
    ///
    /// **The relay forwards bytes.** Each message carries the payload's stored JSON text
    /// unchanged (fields `P` does not know, `1.10` as written), whatever `P` is; `P` is only
    /// decoded to run `keys`. A payload that does not decode as `P` is still sent, ordered
    /// with every event (its keys cannot be known), and logged. When `P` is a tagged serde
    /// enum the relay sends only `P`'s own event types unless `config` chooses
    /// ([`RelayConfig::event_types`](crate::relay::RelayConfig::event_types),
    /// [`all_types`](crate::relay::RelayConfig::all_types)).
    ///
    /// The relay has a row in `ordo.subscriptions` (its watermark and lease) under its name:
    /// `ordo subscriptions` lists it, and a parked event's keys are its stalled keys
    /// ([`list_stalled_keys`](crate::admin::list_stalled_keys),
    /// [`retry_stalled_keys`](crate::admin::retry_stalled_keys) requeues them).
    ///
    /// ```no_run
    /// # #[cfg(feature = "nats")]
    /// # async fn example(outbox: ordo::Outbox<serde_json::Value>) -> ordo::Result<()> {
    /// use ordo::relay::{RelayConfig, nats::NatsSink};
    ///
    /// let sink = NatsSink::builder("nats://127.0.0.1:4222").subject_prefix("billing").build()?;
    /// let relay = outbox
    ///     .relay(RelayConfig::new("billing-to-nats"), sink, |event| {
    ///         // Per customer: one customer's events leave in order.
    ///         ordo::Keys::one(event.payload["customer"].to_string())
    ///     })
    ///     .await?;
    /// # relay.detach();
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for settings that cannot hold (naming them: `batch_size ×
    /// per_event_budget ≤ batch_deadline < lease`); [`Error::LaneMismatch`] when a row of the
    /// same name follows the other lane; [`Error::Database`] if its row cannot be read or
    /// created; [`Error::ServerRewound`] as [`begin`](Self::begin) returns it.
    pub async fn relay<K, F>(
        &self,
        config: crate::relay::RelayConfig,
        sink: K,
        keys: F,
    ) -> Result<SubscriptionHandle>
    where
        K: crate::relay::Sink,
        F: Fn(&crate::Envelope<P>) -> crate::Keys + Send + Sync + 'static,
    {
        self.relay_with_sinks(config, vec![sink], keys).await
    }

    /// [`relay`](Self::relay) with one batch in flight per sink: a slow receiver (one
    /// recipient's endpoint taking seconds) holds the batch it is in, while the other sinks
    /// carry the events of every key it does not hold. The sinks should deliver to the same
    /// place (e.g. `n` sinks built from one builder's settings); one key's events still leave
    /// one at a time, in order.
    ///
    /// # Errors
    /// As [`relay`](Self::relay); [`Error::InvalidConfig`] for an empty `sinks`.
    pub async fn relay_with_sinks<K, F>(
        &self,
        config: crate::relay::RelayConfig,
        sinks: Vec<K>,
        keys: F,
    ) -> Result<SubscriptionHandle>
    where
        K: crate::relay::Sink,
        F: Fn(&crate::Envelope<P>) -> crate::Keys + Send + Sync + 'static,
    {
        self.refuse_while_rewound()?;
        let config = config.resolve_types::<P>();
        crate::relay::start::spawn(
            self.shared(),
            &self.inner.runners,
            config,
            sinks,
            Arc::new(keys),
        )
        .await
    }

    /// [`Error::ServerRewound`] while the lanes are stopped on a rewind: a consumer started now
    /// would take its start (`StartFrom::Now`) from lanes the server went back under.
    fn refuse_while_rewound(&self) -> Result<()> {
        match self.inner.generations.running().lane.rewind.error() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// What a runner reads from.
    fn shared(&self) -> Shared<P> {
        Shared {
            pool: self.inner.direct.clone(),
            lanes: Arc::clone(&self.inner.current),
        }
    }
}
