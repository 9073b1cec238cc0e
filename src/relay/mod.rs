//! Relays: events leave PostgreSQL for the systems users scale out on.
//!
//! A relay is a durable consumer that hands each event to a [`Sink`] (a broker, an HTTP
//! endpoint) **at least once**, with the event id as the message id so that the receiver
//! deduplicates. This module holds the sink side: the [`Sink`] contract, the [`Message`] a sink
//! receives, the [`SendError`] it answers with, and the built-in sinks, each behind a cargo
//! feature:
//!
//! | sink | feature | delivered when |
//! | --- | --- | --- |
//! | [`nats::NatsSink`] | `nats` | the JetStream stream acknowledged it (a duplicate ack counts) |
//! | [`rabbitmq::RabbitSink`] | `rabbitmq` | the broker confirmed it (publisher confirms) |
//! | [`http::WebhookSink`] | `http` | the endpoint answered 2xx |
//! | [`kafka::KafkaSink`] | `kafka` | every in-sync replica has the record (idempotent producer, `acks=all`) |
//!
//! A relay routes without code by [`Template`]s ([`RelayConfig::destination`],
//! [`RelayConfig::header`]) and frames its messages in ordo's own envelope or CloudEvents
//! ([`Format`]).
//!
//! `docs/relays.md` is the guide: the contract, each sink's settings, the webhook signature
//! scheme and how a receiver checks it.
//!
//! # Failure model, from the sink's side
//!
//! No sink runs inside a database transaction. A sink reports each message's outcome into
//! the batch's [`Outcomes`] as it learns it; the relay puts one deadline over a batch's send
//! and, when it expires, drops the `send` future but **keeps every outcome reported**: only
//! the messages without one are released, the sink is [`reset`](Sink::reset) (a new
//! connection), and a message released so again and again goes out in smaller and smaller
//! batches until, alone, it counts an attempt. A per-message [`SendError`] counts an attempt;
//! a [`SendError::Permanent`] one parks the event at once, and so does a panic of user code
//! run for one message (a subject, a route, a key); a [`SendError::Unavailable`] one (the
//! message's destination is down: a webhook URL, a subject without a stream) counts none. An
//! `Err` from `send` is the sink's as a whole: no attempt is counted. Blame never depends on
//! other traffic: a message that fails while nothing else is in flight counts its attempts
//! like any other; where a batch delivered nothing and its failures could be the sink's (they
//! timed out), the relay asks [`Sink::probe`], and a sink that does not answer is down.
//! `docs/relays.md` states the rules and the bound on sends.
//!
//! # Bytes, not types
//!
//! A relay sends each event's payload text exactly as `ordo.events` stores it, whatever the
//! outbox's payload type is ([`RawPayload`]); the type is decoded only for the key function,
//! and an event of a type the relay does not send ([`RelayConfig::event_types`]) is passed
//! over before anything reads it.

pub(crate) mod attempts;
mod batch;
pub(crate) mod chain;
mod config;
mod flight;
mod format;
pub(crate) mod histories;
pub(crate) mod marks;
mod message;
mod outage;
mod outcomes;
pub(crate) mod reused_ids;
mod routing;
mod runner;
mod send_error;
mod sink;
mod sink_down;
pub(crate) mod start;
mod timers;
mod turn;

#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;
#[cfg(feature = "rabbitmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "rabbitmq")))]
pub mod rabbitmq;

pub use attempts::{RelayAttempt, RelayEvent, RelayEventAttempts, RelayEventState};
pub use config::{DEFAULT_WINDOW_BYTES, OnParked, RelayConfig};
pub use format::Format;
pub use message::{Message, RawPayload, UNTYPED};
pub use outage::RELAY_SINK_DOWN;
pub use outcomes::Outcomes;
pub use routing::{MAX_HEADER_VALUE, PayloadForm, Template, TemplateError};
pub use send_error::SendError;
#[cfg(any(
    feature = "http",
    feature = "kafka",
    feature = "nats",
    feature = "rabbitmq"
))]
pub(crate) use sink::fitted_timeout;
pub use sink::{Router, Sink, SinkTiming};
pub(crate) use start::message_of;

/// Runs user code given for one message (`what`: "subject", "route", "key"): its panic is that
/// message's permanent failure, never the batch's (sending the same bytes through the same
/// function panics again).
pub(crate) fn guarded<T>(what: &str, user_code: impl FnOnce() -> T) -> Result<T, SendError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(user_code)).map_err(|panic| {
        SendError::permanent(format!(
            "the {what} function panicked on this event: {}",
            crate::task::panic_message(&*panic)
        ))
    })
}

/// Text an event's writer chose (a key, a subject, a header value), shown in an error: escaped
/// (`{:?}`, so a line break or a control character cannot forge a log line or drive a
/// terminal) and cut to its first 120 characters, with its length when cut, so a 10 kB value
/// does not fill `last_error` and every log line that repeats it.
pub(crate) fn quoted(text: &str) -> String {
    const SHOWN: usize = 120;
    match text.char_indices().nth(SHOWN) {
        None => format!("{text:?}"),
        Some((cut, _)) => format!("{:?}... ({} bytes)", &text[..cut], text.len()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn event_text_in_errors_is_escaped_and_cut() {
        use super::quoted;
        assert_eq!(quoted("a\nb"), "\"a\\nb\"");
        let long = "k".repeat(10_000);
        let shown = quoted(&long);
        assert!(shown.len() < 200, "{shown}");
        assert!(shown.ends_with("... (10000 bytes)"), "{shown}");
        assert_eq!(
            quoted(&"é".repeat(200))
                .chars()
                .filter(|c| *c == 'é')
                .count(),
            120
        );
    }
}
