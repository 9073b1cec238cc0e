//! Webhook request headers (HTTP header names are case-insensitive; written as shown).

/// The event's id: a receiver's deduplication key.
pub(crate) const EVENT_ID: &str = "Ordo-Event-Id";
/// The event's insert sequence.
pub(crate) const SEQUENCE: &str = "Ordo-Sequence";
/// The event's position in the relay's lane.
pub(crate) const POSITION: &str = "Ordo-Position";
/// The lane the position is in (`insert` or `commit`).
pub(crate) const LANE: &str = "Ordo-Lane";
/// On the commit lane, the server history the position belongs to (its id).
pub(crate) const HISTORY: &str = "Ordo-History";
/// The first position of that history.
pub(crate) const HISTORY_START: &str = "Ordo-History-Start";
/// The Unix time the request was signed at.
pub(crate) const TIMESTAMP: &str = "Ordo-Timestamp";
/// The HMAC-SHA256 signature of the timestamp and body.
pub(crate) const SIGNATURE: &str = "Ordo-Signature";
/// The event's type, where it has one.
pub(crate) const EVENT_TYPE: &str = "Ordo-Event-Type";
/// The event's first key, where the relay has a key function.
pub(crate) const KEY: &str = "Ordo-Key";
/// The route the relay sent it on (`relay::Message::route`), where the sink has several.
pub(crate) const ROUTE: &str = "Ordo-Route";
/// The position the relay sent before it on its route (`relay::Message::previous`).
pub(crate) const PREVIOUS: &str = "Ordo-Previous";
/// The relay's source name.
pub(crate) const SOURCE: &str = "Ordo-Source";
/// CloudEvents attributes in binary mode (the HTTP binding: `ce-id`, `ce-type`, ...).
pub(crate) const CE_PREFIX: &str = "ce-";
/// Standard Webhooks: the message id (the event id).
pub(crate) const WEBHOOK_ID: &str = "webhook-id";
/// Standard Webhooks: when the request was signed, Unix seconds.
pub(crate) const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
/// Standard Webhooks: `v1,<base64 signature>`, one per secret, separated by spaces.
pub(crate) const WEBHOOK_SIGNATURE: &str = "webhook-signature";
