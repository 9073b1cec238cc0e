//! The relay sinks against the real services: NATS JetStream, RabbitMQ, and an HTTP server
//! the test runs; broker faults through the TCP fault proxy (`common/tcp_fault.rs`).
//!
//! Deadlines here bound how long a test may wait for something that must happen; the only
//! "does not finish" check (a black-holed broker) uses a deadline far below any timeout of
//! the sink under test, so it cannot pass by luck.

#[path = "../common/mod.rs"]
mod common;
mod nats;
mod rabbitmq;
mod webhook;

use std::time::Duration;

use ordo::relay::http::WebhookSink;
use ordo::relay::nats::NatsSink;
use ordo::relay::rabbitmq::RabbitSink;
use ordo::relay::{Message, Outcomes, SendError, Sink};

/// What a sink's `send` came to: its error, or each message's outcome (`None`: not reported).
pub type BatchResult = Result<Vec<Result<(), SendError>>, SendError>;

/// How long a black-holed `send` is given to (wrongly) finish.
pub const STALL: Duration = Duration::from_secs(2);
/// Upper bound for anything that should happen at once; only a failure waits this long.
pub const LIMIT: Duration = Duration::from_secs(30);

pub fn batch(count: usize) -> Vec<Message> {
    (0..count)
        .map(|n| {
            let event_type = if n % 3 == 2 { None } else { Some("placed") };
            Message::new(format!(r#"{{"order_id":{n}}}"#).into_bytes())
                .with_event_type(event_type)
                .with_position(n as u64 + 1)
        })
        .collect()
}

pub fn delivered(result: &BatchResult, count: usize) -> bool {
    matches!(result, Ok(results) if results.len() == count && results.iter().all(Result::is_ok))
}

/// A failure the relay retries: a transient batch error, or every message transient.
pub fn all_transient(result: &BatchResult) -> bool {
    match result {
        Err(error) => !error.is_permanent(),
        Ok(results) => results
            .iter()
            .all(|result| matches!(result, Err(error) if !error.is_permanent())),
    }
}

/// `send` to its end; a message the sink reported nothing for reads as a transient failure
/// ("no outcome").
pub async fn send<S: Sink>(sink: &mut S, batch: &[Message]) -> BatchResult {
    let mut outcomes = Outcomes::new(batch.len());
    tokio::time::timeout(LIMIT, sink.send(batch, &mut outcomes))
        .await
        .expect("send finished within the test's limit")?;
    Ok(outcomes
        .into_vec()
        .into_iter()
        .map(|outcome| outcome.unwrap_or_else(|| Err(SendError::transient("no outcome"))))
        .collect())
}

#[test]
fn sink_builders_refuse_bad_settings_naming_them() {
    let setting = |result: ordo::Result<()>| match result {
        Err(ordo::Error::InvalidConfig { setting, .. }) => setting,
        other => panic!("expected InvalidConfig, got {other:?}"),
    };
    let nats = |builder: ordo::relay::nats::NatsSinkBuilder| setting(builder.build().map(drop));
    assert_eq!(nats(NatsSink::builder("")), "nats url");
    assert_eq!(
        nats(NatsSink::builder("nats://h").subject_prefix("")),
        "nats subject_prefix"
    );
    assert_eq!(
        nats(NatsSink::builder("nats://h").subject_prefix("a.>")),
        "nats subject_prefix"
    );
    assert_eq!(
        nats(NatsSink::builder("nats://h").ack_timeout(Duration::ZERO)),
        "nats ack_timeout"
    );
    assert_eq!(
        nats(NatsSink::builder("nats://h").max_in_flight(0)),
        "nats max_in_flight"
    );

    let rabbit =
        |builder: ordo::relay::rabbitmq::RabbitSinkBuilder| setting(builder.build().map(drop));
    assert_eq!(rabbit(RabbitSink::builder(" ")), "rabbitmq uri");
    assert_eq!(
        rabbit(RabbitSink::builder("amqp://h").pipeline_depth(0)),
        "rabbitmq pipeline_depth"
    );
    assert_eq!(
        rabbit(RabbitSink::builder("amqp://h").exchange("x".repeat(256))),
        "rabbitmq exchange"
    );
    let zero = RabbitSink::builder("amqp://h").connect_timeout(Duration::ZERO);
    assert_eq!(rabbit(zero), "rabbitmq connect_timeout");

    let webhook =
        |builder: ordo::relay::http::WebhookSinkBuilder| setting(builder.build().map(drop));
    assert_eq!(
        webhook(WebhookSink::builder("", b"k".to_vec())),
        "webhook url"
    );
    assert_eq!(
        webhook(WebhookSink::builder("ftp://h/x", b"k".to_vec())),
        "webhook url"
    );
    assert_eq!(
        webhook(WebhookSink::builder("http://h/x", Vec::new())),
        "webhook secret"
    );
    // A key under 128 bits is guessed from one signed request: 15 bytes are refused, 16 taken.
    let short = WebhookSink::builder("http://h/x", b"fifteen bytes!!".to_vec()).build();
    assert!(
        matches!(&short, Err(ordo::Error::InvalidConfig { setting: "webhook secret", reason })
            if reason.contains("is 15 bytes") && reason.contains("at least 16")),
        "{short:?}"
    );
    assert_eq!(ordo::relay::http::MIN_SECRET_BYTES, 16);
    assert!(
        WebhookSink::builder("http://h/x", b"sixteen bytes!!!".to_vec())
            .build()
            .is_ok()
    );
    let key = || b"a webhook secret".to_vec();
    let zero = WebhookSink::builder("http://h/x", key()).timeout(Duration::ZERO);
    assert_eq!(webhook(zero), "webhook timeout");
    let none = WebhookSink::builder("http://h/x", key()).concurrency(0);
    assert_eq!(webhook(none), "webhook concurrency");
}

/// `SendError` reads as the relay logs it.
#[test]
fn send_errors_say_their_kind() {
    let error = SendError::Transient {
        message: "the endpoint answered 429".to_owned(),
        retry_after: Some(Duration::from_secs(3)),
    };
    assert_eq!(
        error.to_string(),
        "transient: the endpoint answered 429 (retry after 3s)"
    );
    assert!(SendError::permanent("bad").is_permanent());
}
