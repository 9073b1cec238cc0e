//! RabbitMQ header-table entries (the message id and content type are AMQP properties).

/// The event's insert sequence (a long long integer).
pub(crate) const SEQUENCE: &str = "ordo-sequence";
/// The event's position in the relay's lane (a long long integer).
pub(crate) const POSITION: &str = "ordo-position";
/// The lane the position is in (`insert` or `commit`).
pub(crate) const LANE: &str = "ordo-lane";
/// On the commit lane, the server history the position belongs to (its id, a long long integer).
pub(crate) const HISTORY: &str = "ordo-history";
/// The first position of that history.
pub(crate) const HISTORY_START: &str = "ordo-history-start";
/// The route the relay sent it on (`relay::Message::route`), where the sink has several.
pub(crate) const ROUTE: &str = "ordo-route";
/// The position the relay sent before it on its route (a long long integer).
pub(crate) const PREVIOUS: &str = "ordo-previous";
/// The relay's source name (the inbox's watermark is per source).
pub(crate) const SOURCE: &str = "ordo-source";
/// The event's first key, where the relay has a key function.
pub(crate) const KEY: &str = "ordo-key";
/// The event's own headers as a JSON object.
pub(crate) const HEADERS: &str = "ordo-headers";
/// CloudEvents attributes in binary mode (the AMQP binding's application properties: `cloudEvents_id`, ...).
pub(crate) const CE_PREFIX: &str = "cloudEvents_";
