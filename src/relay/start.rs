//! Starting a relay: its configuration checked, its row in `ordo.subscriptions`, its runner
//! under the outbox's care (stopped, and its lease released, on shutdown).

use std::sync::Arc;

use std::any::Any;

use serde::de::DeserializeOwned;

use super::chain::Link;
use super::config::RelayConfig;
use super::flight::Carrier;
use super::runner::{KeyFn, Keyer, LanesNow, RelayRunner};
use super::{Message, RawPayload, Sink};
use crate::consumer::source::Item;
use crate::consumer::{Keys, Kind, LaneSet, Registration, Runners, Shared, SubscriptionHandle};
use crate::envelope::Envelope;
use crate::error::Result;
use crate::insert_lane::LaneShared;

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
    P: DeserializeOwned + Send + Sync + 'static,
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
    let router = sinks.first().and_then(Sink::router);
    // The row, the lease and the shutdown are the consumer core's, as a subscription's.
    let registration = Registration {
        name: config.name.clone(),
        ordering: config.ordering,
        start: config.start,
        lease: config.lease,
        kind: Kind::Relay,
    };
    let current = Arc::clone(&shared.lanes);
    let lanes_now: LanesNow = Arc::new(move || {
        let lanes = current.get();
        LaneSet {
            lane: stored_text_lane(&lanes.lane),
            commit: lanes.commit,
            stop: lanes.stop,
        }
    });
    let lanes = lanes_now();
    let keys = keyer(keys);
    crate::consumer::start(shared, runners, &registration, move |core| {
        crate::consumer::run(RelayRunner {
            core,
            lanes_now,
            lane: lanes.lane,
            commit: lanes.commit,
            lanes_stop: lanes.stop,
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
            router,
        })
    })
    .await
}

/// The lane read as stored text: the outbox's own when its payload type is [`RawPayload`]
/// already (`ordo relay run`'s), otherwise a [table view](LaneShared::table_view) of it.
fn stored_text_lane<P>(lane: &Arc<LaneShared<P>>) -> Arc<LaneShared<RawPayload>>
where
    P: Send + Sync + 'static,
{
    let any: Arc<dyn Any + Send + Sync> = Arc::clone(lane) as Arc<dyn Any + Send + Sync>;
    any.downcast::<LaneShared<RawPayload>>()
        .unwrap_or_else(|_| Arc::new(LaneShared::table_view(lane)))
}

/// The user's key function, run on each event's payload decoded from its stored text as `P`.
fn keyer<P>(keys: KeyFn<P>) -> Keyer
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    Arc::new(move |stored: &Envelope<RawPayload>| {
        let payload = serde_json::from_str::<P>(stored.payload.get()).map_err(|error| {
            format!(
                "the payload does not decode as {}: {error}",
                std::any::type_name::<P>()
            )
        })?;
        let event = Envelope {
            id: stored.id,
            sequence: stored.sequence,
            commit_xid: stored.commit_xid,
            payload,
            headers: stored.headers.clone(),
            recorded_at: stored.recorded_at,
            event_type: stored.event_type.clone(),
        };
        Ok(keys(&event))
    })
}

/// The message for `item`: its payload's stored text, unchanged, its first key as the
/// message's key, its origin as `config` states it, its place in its route's chain.
pub(crate) fn message_of(
    item: &Item<RawPayload>,
    keys: &Keys,
    config: &RelayConfig,
    history: Option<crate::position::ServerHistory>,
    link: Option<&Link>,
) -> std::result::Result<Message, String> {
    let event: &Arc<Envelope<RawPayload>> = match &item.event {
        Ok(event) => event,
        Err(row) => {
            return Err(format!(
                "the payload of ordo.events sequence {} is not JSON text: {}",
                item.sequence, row.error
            ));
        }
    };
    let mut message = message_of_event(event, item.position.get(), keys, config, history)?;
    if let Some(link) = link {
        message.route = link.route.as_deref().map(str::to_owned);
        message.previous = Some(link.previous);
    }
    Ok(message)
}

/// The message for `event` at `position`, without its chain (see [`message_of`]), routed by
/// the relay's templates; or why its templates cannot route it (its permanent failure). The
/// payload is not copied unless it is expanded: the message's bytes are the stored text the
/// event holds.
pub(crate) fn message_of_event(
    event: &Arc<Envelope<RawPayload>>,
    position: u64,
    keys: &Keys,
    config: &RelayConfig,
    history: Option<crate::position::ServerHistory>,
) -> std::result::Result<Message, String> {
    // Built whole, not from `Message::new`, whose fresh id and clock reading would be
    // replaced at once (a relay builds one message per event).
    let mut message = Message {
        id: event.id,
        sequence: event.sequence,
        position,
        lane: config.ordering,
        history,
        source: config.source.clone(),
        route: None,
        previous: None,
        event_type: event.event_type.clone(),
        key: keys.iter().next().map(str::to_owned),
        payload: bytes::Bytes::from_owner(StoredText(Arc::clone(event))),
        headers: event.headers.clone(),
        recorded_at: event.recorded_at,
        destination: None,
        header_fields: Vec::new(),
    };
    config.routing.apply(&mut message)?;
    Ok(message)
}

/// An event's stored payload text as the bytes of its message, shared with the event.
struct StoredText(Arc<Envelope<RawPayload>>);

impl AsRef<[u8]> for StoredText {
    fn as_ref(&self) -> &[u8] {
        self.0.payload.get().as_bytes()
    }
}
