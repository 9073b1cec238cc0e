//! The wire contract: the names a relay's sink writes beside an event's payload and the inbox's
//! broker adapter reads back, one module per broker, so that a name is written once for both
//! ends (`tests/inbox/relay_to_inbox.rs` runs each pair end to end). Also how a broker's URL is
//! shown. A leaf: it imports nothing of ordo's.
//!
//! NATS and HTTP headers are written as `Ordo-Position` (NATS header names are case-sensitive,
//! so the adapter reads exactly these); RabbitMQ's header table as `ordo-position`.

#[cfg(feature = "http")]
pub(crate) mod http;
#[cfg(feature = "kafka")]
pub(crate) mod kafka;
#[cfg(feature = "nats")]
pub(crate) mod nats;
#[cfg(feature = "rabbitmq")]
pub(crate) mod rabbitmq;

/// The W3C trace context, under the same name on every broker.
#[cfg(any(
    feature = "http",
    feature = "kafka",
    feature = "nats",
    feature = "rabbitmq"
))]
pub(crate) const TRACEPARENT: &str = crate::telemetry::trace::TRACEPARENT;

/// `url` with any password replaced by `***`, for a sink's or an adapter's description and logs. A URL that does
/// not parse is shown as its scheme and host part only, or `<unparsable URL>`.
#[cfg(any(
    feature = "http",
    feature = "kafka",
    feature = "nats",
    feature = "rabbitmq"
))]
pub(crate) fn redact_url(url: &str) -> String {
    // scheme://user:password@host/... → scheme://user:***@host/...
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<unparsable URL>".to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    // Query strings may carry tokens (`?access_token=`): never shown.
    let path = tail.split(['?', '#']).next().unwrap_or("");
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{user}:***@{host}")
        }
        None => authority.to_owned(),
    };
    format!("{scheme}://{authority}{path}")
}

#[cfg(all(
    test,
    any(
        feature = "http",
        feature = "kafka",
        feature = "nats",
        feature = "rabbitmq"
    )
))]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_and_queries_never_reach_a_description() {
        assert_eq!(
            redact_url("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(
            redact_url("https://hooks.example/in?token=abc"),
            "https://hooks.example/in"
        );
        assert_eq!(redact_url("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
        assert_eq!(redact_url("no scheme"), "<unparsable URL>");
    }
}
