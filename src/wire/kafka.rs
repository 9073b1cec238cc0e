//! Kafka record headers (case-sensitive names; every value UTF-8 text). The event id travels as
//! a header, since Kafka has no message id; the relay's ordering key is the record's key.

/// The event's id: a receiver's deduplication key.
pub(crate) const EVENT_ID: &str = "ordo-event-id";
/// The event's insert sequence.
pub(crate) const SEQUENCE: &str = "ordo-sequence";
/// The event's position in the relay's lane.
pub(crate) const POSITION: &str = "ordo-position";
/// The lane the position is in (`insert` or `commit`).
pub(crate) const LANE: &str = "ordo-lane";
/// On the commit lane, the server history the position belongs to (its id).
pub(crate) const HISTORY: &str = "ordo-history";
/// The first position of that history.
pub(crate) const HISTORY_START: &str = "ordo-history-start";
/// The route the relay sent it on (`relay::Message::route`: the topic).
pub(crate) const ROUTE: &str = "ordo-route";
/// The position the relay sent before it on its route (`relay::Message::previous`).
pub(crate) const PREVIOUS: &str = "ordo-previous";
/// The relay's source name (the inbox's watermark is per source).
pub(crate) const SOURCE: &str = "ordo-source";
/// The event's type, where it has one.
pub(crate) const EVENT_TYPE: &str = "ordo-event-type";
/// The event's own headers as a JSON object.
pub(crate) const HEADERS: &str = "ordo-headers";
/// The body's media type (the Kafka binding of CloudEvents names it so).
pub(crate) const CONTENT_TYPE: &str = "content-type";
/// CloudEvents attributes in binary mode (the Kafka binding: `ce_id`, `ce_type`, ...).
pub(crate) const CE_PREFIX: &str = "ce_";

/// Settings the Kafka sink and the inbox adapter set themselves, refused from a user's
/// `property`: the guarantees rest on them.
pub(crate) const OWNED_PROPERTIES: [&str; 14] = [
    "bootstrap.servers",
    "metadata.broker.list",
    "enable.idempotence",
    "acks",
    "request.required.acks",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "max.in.flight.requests.per.connection",
    "max.in.flight",
    "partitioner",
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.offset.reset",
];

/// The longest topic name Kafka takes.
pub(crate) const MAX_TOPIC: usize = 249;

/// Whether `topic` is a name Kafka takes: 1 to 249 of `a-z A-Z 0-9 . _ -`, not `.` or `..`;
/// else why not (the name escaped and cut, as it may come from an event).
pub(crate) fn check_topic(topic: &str) -> Result<(), String> {
    let valid = !topic.is_empty()
        && topic.len() <= MAX_TOPIC
        && topic != "."
        && topic != ".."
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if valid {
        return Ok(());
    }
    if topic.is_empty() {
        return Err("no topic: set the sink's `topic`, or a destination template".to_owned());
    }
    let shown: String = topic
        .chars()
        .take(120)
        .flat_map(char::escape_debug)
        .collect();
    Err(format!(
        "\"{shown}\"{} is not a Kafka topic name: 1 to {MAX_TOPIC} of a-z, A-Z, 0-9, `.`, `_`, `-`",
        if topic.chars().count() > 120 {
            format!("... ({} bytes)", topic.len())
        } else {
            String::new()
        }
    ))
}
