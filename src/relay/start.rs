//! Starting a relay: its configuration checked, its row in `ordo.subscriptions`, its runner
//! under the outbox's care (stopped, and its lease released, on shutdown).

use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::config::RelayConfig;
use super::flight::Carrier;
use super::runner::{KeyFn, RelayRunner};
use super::{Message, Sink};
use crate::envelope::Envelope;
use crate::error::Result;
use crate::subscription::keyed::Keys;
use crate::subscription::shutdown::Runners;
use crate::subscription::source::Item;
use crate::subscription::{JobConfig, Shared, SubscriptionHandle};

/// Spawns the relay of `config` delivering through `sinks` (one batch in flight per sink),
/// ordering by `keys`.
pub(crate) async fn spawn<P, K>(
    shared: Shared<P>,
    runners: &Runners,
    config: RelayConfig,
    mut sinks: Vec<K>,
    keys: KeyFn<P>,
) -> Result<SubscriptionHandle>
where
    P: Serialize + DeserializeOwned + Send + Sync + 'static,
    K: Sink,
{
    config.validate()?;
    if sinks.is_empty() {
        return crate::Error::invalid_config("sinks", "a relay needs at least one sink");
    }
    let timing = super::SinkTiming::of(&config);
    for sink in &mut sinks {
        sink.prepare(&timing).await?;
    }
    // The row, the lease and the shutdown are a subscription's.
    let job = JobConfig::new(config.name.clone())
        .ordering(config.ordering)
        .start(config.start)
        .lease(config.lease);
    let lane = Arc::clone(&shared.lane);
    let commit = Arc::clone(&shared.commit);
    crate::subscription::start(shared, runners, &job, "relay", move |run| {
        let runner = RelayRunner {
            pool: run.pool,
            lane,
            commit,
            config,
            idle: sinks
                .into_iter()
                .map(|sink| Carrier {
                    sink,
                    broken: false,
                })
                .collect(),
            flights: tokio::task::JoinSet::new(),
            writes: futures::stream::FuturesUnordered::new(),
            last_write: None,
            keys,
            owner: run.owner,
            tenure: super::tenure::Tenure::default(),
            stop: run.stop,
            status: run.status,
        };
        runner.run()
    })
    .await
}

/// The message for `item`: its payload as JSON text, its first key as the message's key, its
/// origin as `config` states it.
pub(crate) fn message_of<P: Serialize>(
    item: &Item<P>,
    keys: &Keys,
    config: &RelayConfig,
) -> std::result::Result<Message, String> {
    let event: &Arc<Envelope<P>> = match &item.event {
        Ok(event) => event,
        Err(row) => {
            return Err(format!(
                "the payload of ordo.events sequence {} does not decode: {}",
                item.sequence, row.error
            ));
        }
    };
    // A user's `Serialize` that panics is this event's failure, not the relay's.
    let encoded = super::guarded("payload encoder", || serde_json::to_vec(&event.payload))
        .map_err(|panic| panic.message().to_owned())?;
    let payload = encoded.map_err(|error| {
        format!(
            "the payload of ordo.events sequence {} does not encode: {error}",
            item.sequence
        )
    })?;
    // Built whole, not from `Message::new`, whose fresh id and clock reading would be
    // replaced at once (a relay builds one message per event).
    Ok(Message {
        id: event.id,
        sequence: event.sequence,
        position: item.position.get(),
        lane: config.ordering,
        source: config.source.clone(),
        event_type: event.event_type.clone(),
        key: keys.iter().next().map(str::to_owned),
        payload: payload.into(),
        headers: event.headers.clone(),
        recorded_at: event.recorded_at,
    })
}
