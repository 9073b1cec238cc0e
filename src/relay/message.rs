//! One event on its way out of PostgreSQL to a sink.

use bytes::Bytes;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::envelope::Headers;
use crate::position::{EventSequence, Ordering, ServerHistory};

/// One event on its way out: what a relay hands a [`Sink`](super::Sink).
///
/// The payload is the JSON text exactly as `ordo.events` stores it, never decoded: a relay
/// forwards events of every type, including rows written by plain SQL from another language.
/// `id` travels as the broker's message id (NATS `Nats-Msg-Id`, AMQP `message_id`, the
/// webhook's `Ordo-Event-Id` header), so the receiver can deduplicate a redelivery.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Message {
    /// The event's id (`ordo.events.id`): the message id at the receiver.
    pub id: Uuid,
    /// Its position in the insert-ordered lane.
    pub sequence: EventSequence,
    /// Its position on the relay's [`lane`](Self::lane): a commit sequence (dense: 1, 2, 3, …)
    /// or an insert-lane sequence (with gaps).
    pub position: u64,
    /// The lane the relay reads, which says what [`position`](Self::position) is.
    pub lane: Ordering,
    /// On the commit lane, the server history the position belongs to: the PostgreSQL
    /// timeline its entry was appended on and where that stretch began
    /// ([`ServerHistory`]). After a failover that lost transactions, positions they had are
    /// given to new events on the newer history, which a receiver tells apart by this
    /// (`Ordo-History`, `Ordo-History-Start`). `None` on the insert lane.
    pub history: Option<ServerHistory>,
    /// The sending database's name ([`RelayConfig::source`](super::RelayConfig::source)).
    pub source: Option<String>,
    /// The route the relay sends it on ([`Sink::router`](super::Sink::router), as it travels:
    /// printable ASCII of at most 200 bytes, else `~` and a hash); `None` for a relay with
    /// one route. Sent as `Ordo-Route`.
    pub route: Option<String>,
    /// The position of the message the relay sent before it on its route (`0`: none before
    /// it, or not known after an operator moved the relay back): a receiver of the route
    /// takes this message once it holds that one. Sent as `Ordo-Previous`; `None` from a
    /// message built by hand.
    pub previous: Option<u64>,
    /// Its type (`ordo.events.event_type`); `None` is untyped.
    pub event_type: Option<String>,
    /// The ordering key: events of one key are delivered in order. Sinks that partition (a
    /// Kafka partition, a per-key subject) may use it; the built-in sinks do not need it.
    pub key: Option<String>,
    /// The payload's JSON text, as stored.
    pub payload: Bytes,
    /// The header map stored with it.
    pub headers: Headers,
    /// When the writing transaction started (`now()` at insert time).
    pub recorded_at: DateTime<Utc>,
    /// Where the relay's [destination template](super::RelayConfig::destination) sends it: the
    /// NATS subject, the Kafka topic, the RabbitMQ routing key or the path after the webhook's
    /// URL, used by each built-in sink's default routing; `None` without a template.
    pub destination: Option<String>,
    /// The fields the relay's [header templates](super::RelayConfig::header) chose, as
    /// `(name, value)`: each built-in sink sends them as headers of the message.
    pub header_fields: Vec<(String, String)>,
}

impl Message {
    /// A message built by hand, for tests and examples: a fresh id, sequence and position 1
    /// on the commit lane, no source, untyped, no key, no headers, recorded now. Adjust with the `with_*` methods.
    ///
    /// ```
    /// let message = ordo::relay::Message::new(br#"{"order_id": 7}"#.as_slice())
    ///     .with_event_type(Some("OrderPlaced"))
    ///     .with_key(Some("customer-42"));
    /// assert_eq!(message.event_type.as_deref(), Some("OrderPlaced"));
    /// assert_eq!(&message.payload[..], br#"{"order_id": 7}"#);
    /// ```
    pub fn new(payload: impl Into<Bytes>) -> Self {
        Self {
            id: Uuid::now_v7(),
            sequence: EventSequence::new(1),
            position: 1,
            lane: Ordering::Commit,
            history: None,
            source: None,
            route: None,
            previous: None,
            event_type: None,
            key: None,
            payload: payload.into(),
            headers: Headers::new(),
            recorded_at: Utc::now(),
            destination: None,
            header_fields: Vec::new(),
        }
    }

    /// The same message sent to `destination` (see [`destination`](Self::destination)).
    pub fn with_destination(mut self, destination: Option<&str>) -> Self {
        self.destination = destination.map(str::to_owned);
        self
    }

    /// The same message from server history `history` (see [`history`](Self::history)).
    pub fn with_history(mut self, history: Option<ServerHistory>) -> Self {
        self.history = history;
        self
    }

    /// The same message on `route` (`None`: the relay's one route), after `previous` on it
    /// (see [`previous`](Self::previous)).
    pub fn with_chain(mut self, route: Option<&str>, previous: u64) -> Self {
        self.route = route.map(str::to_owned);
        self.previous = Some(previous);
        self
    }

    /// The same message with `id`.
    pub fn with_id(mut self, id: Uuid) -> Self {
        self.id = id;
        self
    }

    /// The same message at insert-lane `sequence`.
    pub fn with_sequence(mut self, sequence: EventSequence) -> Self {
        self.sequence = sequence;
        self
    }

    /// The same message at relay-lane `position`.
    pub fn with_position(mut self, position: u64) -> Self {
        self.position = position;
        self
    }

    /// The same message at `position` on `lane`, sent by `source` (a receiving inbox in
    /// watermark mode needs all three).
    pub fn with_origin(mut self, source: Option<&str>, lane: Ordering, position: u64) -> Self {
        self.source = source.map(str::to_owned);
        self.lane = lane;
        self.position = position;
        self
    }

    /// The same message of type `event_type` (`None`: untyped).
    pub fn with_event_type(mut self, event_type: Option<&str>) -> Self {
        self.event_type = event_type.map(str::to_owned);
        self
    }

    /// The same message with ordering key `key`.
    pub fn with_key(mut self, key: Option<&str>) -> Self {
        self.key = key.map(str::to_owned);
        self
    }

    /// The same message with `headers`.
    pub fn with_headers(mut self, headers: Headers) -> Self {
        self.headers = headers;
        self
    }

    /// The same message recorded at `recorded_at`.
    pub fn with_recorded_at(mut self, recorded_at: DateTime<Utc>) -> Self {
        self.recorded_at = recorded_at;
        self
    }

    /// The event type, or `untyped` for an event without one: the word the built-in sinks put
    /// in a subject or routing key.
    pub fn type_or_untyped(&self) -> &str {
        self.event_type.as_deref().unwrap_or(UNTYPED)
    }

    /// The header map as JSON text, or `None` when it is empty: how the built-in sinks carry
    /// it (one `Ordo-Headers` header), so no header name has to pass a broker's rules.
    #[cfg(any(feature = "kafka", feature = "nats", feature = "rabbitmq"))]
    pub(crate) fn headers_json(&self) -> Option<String> {
        if self.headers.is_empty() {
            return None;
        }
        serde_json::to_string(&self.headers).ok()
    }

    /// The W3C `traceparent` header, when the publisher stored one (see
    /// [`TRACEPARENT`](crate::TRACEPARENT)): the built-in sinks forward it under its own name
    /// so a receiver's tracing joins the publisher's trace.
    #[cfg(any(
        feature = "http",
        feature = "kafka",
        feature = "nats",
        feature = "rabbitmq"
    ))]
    pub(crate) fn traceparent(&self) -> Option<&str> {
        self.headers
            .get(crate::telemetry::trace::TRACEPARENT)
            .and_then(serde_json::Value::as_str)
    }
}

/// A payload as stored: its JSON text, unchanged (`ordo.events.payload::text`). A relay
/// forwards this whatever the outbox's payload type is; an `Outbox<RawPayload>` reads every
/// event so (the `ordo relay run` command's).
///
/// ```
/// let payload: ordo::relay::RawPayload =
///     serde_json::from_str(r#"{"total": 1.10, "note": "kept as written"}"#).unwrap();
/// assert_eq!(payload.get(), r#"{"total": 1.10, "note": "kept as written"}"#);
/// ```
pub type RawPayload = Box<serde_json::value::RawValue>;

/// What the built-in sinks call an event without a type in subjects and routing keys.
pub const UNTYPED: &str = "untyped";
