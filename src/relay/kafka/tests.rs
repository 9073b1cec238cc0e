//! The unit tests of the Kafka sink: what Kafka cannot take is refused before it is sent.

use super::records::check_topic;
use super::{KafkaSink, produce::classify};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

#[test]
fn topic_names_kafka_cannot_take_are_refused_before_they_are_sent() {
    assert!(check_topic("orders.placed-v2_eu").is_ok());
    for bad in [
        "",
        ".",
        "..",
        "orders placed",
        "orders\nX",
        &"t".repeat(250),
        "ordres/x",
    ] {
        assert!(check_topic(bad).is_err_and(|e| e.is_permanent()), "{bad:?}");
    }
}

#[test]
fn failures_are_blamed_at_the_source() {
    let of = |code| classify(&KafkaError::MessageProduction(code));
    assert!(of(RDKafkaErrorCode::MessageSizeTooLarge).is_permanent());
    assert!(of(RDKafkaErrorCode::UnknownTopicOrPartition).is_unavailable());
    assert!(of(RDKafkaErrorCode::NotEnoughReplicas).is_unavailable());
    let timeout = of(RDKafkaErrorCode::MessageTimedOut);
    assert!(!timeout.is_permanent() && !timeout.is_unavailable());
}

#[test]
fn settings_the_guarantees_rest_on_are_refused() {
    for owned in [
        "enable.idempotence",
        "acks",
        "message.timeout.ms",
        "partitioner",
    ] {
        let built = KafkaSink::builder("127.0.0.1:9092")
            .topic("t")
            .property(owned, "x")
            .build();
        assert!(built.is_err(), "{owned}");
    }
    let unknown = KafkaSink::builder("127.0.0.1:9092")
        .property("no.such.setting", "1")
        .build();
    assert!(unknown.is_err_and(|e| e.to_string().contains("librdkafka refuses")));
    let fine = KafkaSink::builder("127.0.0.1:9092")
        .topic("t")
        .property("compression.type", "lz4")
        .build();
    assert!(fine.is_ok());
    assert!(
        KafkaSink::builder("127.0.0.1:9092")
            .topic("bad topic")
            .build()
            .is_err()
    );
}
