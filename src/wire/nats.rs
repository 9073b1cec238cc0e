//! NATS JetStream message headers (case-sensitive names).

/// JetStream's deduplication id: the event's id.
pub(crate) const MSG_ID: &str = "Nats-Msg-Id";
/// The event's position in the relay's lane.
pub(crate) const POSITION: &str = "Ordo-Position";
/// The lane the position is in (`insert` or `commit`).
pub(crate) const LANE: &str = "Ordo-Lane";
/// On the commit lane, the server history the position belongs to (its id).
pub(crate) const HISTORY: &str = "Ordo-History";
/// The first position of that history.
pub(crate) const HISTORY_START: &str = "Ordo-History-Start";
/// The route the relay sent it on (`relay::Message::route`), where the sink has several.
pub(crate) const ROUTE: &str = "Ordo-Route";
/// The position the relay sent before it on its route (`relay::Message::previous`).
pub(crate) const PREVIOUS: &str = "Ordo-Previous";
/// The relay's source name (the inbox's watermark is per source).
pub(crate) const SOURCE: &str = "Ordo-Source";
/// The event's type, where it has one.
pub(crate) const EVENT_TYPE: &str = "Ordo-Event-Type";
/// The event's first key, where the relay has a key function.
pub(crate) const KEY: &str = "Ordo-Key";
/// The event's own headers as a JSON object.
pub(crate) const HEADERS: &str = "Ordo-Headers";
/// Detail: the event's insert sequence.
pub(crate) const SEQUENCE: &str = "Ordo-Sequence";
/// Detail: when the event was recorded (RFC 3339).
pub(crate) const RECORDED_AT: &str = "Ordo-Recorded-At";
/// Detail: the payload's media type.
pub(crate) const CONTENT_TYPE: &str = "Content-Type";
/// CloudEvents attributes in binary mode (the NATS binding's draft 1.0.3: `ce-id`, `ce-type`, ...).
pub(crate) const CE_PREFIX: &str = "ce-";
