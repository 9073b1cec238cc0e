//! [`KafkaSink`]: produce to Kafka with an idempotent producer, delivered when every in-sync
//! replica has the record (`acks=all`).
//!
//! # The client
//!
//! librdkafka, through the `rdkafka` crate, is the one Kafka client for Rust with an
//! idempotent producer (the broker drops a producer's retried batch it already wrote, and keeps
//! each partition in the order produced under retries and reconnects), consumer groups, TLS
//! and SASL, maintained alongside the Java client's features. Pure-Rust clients
//! (`rskafka`, `kafka`) have no idempotent producer or no consumer groups. Its cost is a C
//! build of librdkafka (about a minute and a half on two cores, once). The feature `kafka` builds it
//! without TLS; `kafka-tls` adds TLS and SASL (PLAIN, SCRAM, OAUTHBEARER) through the system's
//! OpenSSL (`libssl-dev`), configured with [`property`](KafkaSinkBuilder::property).
//!
//! # The record
//!
//! | Kafka | value |
//! | --- | --- |
//! | topic | the [destination template](crate::relay::RelayConfig::destination)'s, else the sink's [`topic`](KafkaSinkBuilder::topic), or any mapping with [`topic_fn`](KafkaSinkBuilder::topic_fn) |
//! | key | the relay's ordering key (none without one): one key's events are in one partition, in order |
//! | partition | librdkafka's `murmur2_random` partitioner, the Java client's: a key lands in the partition a Java producer would choose; a record without a key in a random one |
//! | value | the payload's JSON text as stored (a structured CloudEvent in [`Format::CloudEventsStructured`](crate::relay::Format)) |
//! | timestamp | when the event was recorded |
//! | headers | `ordo-event-id` (deduplicate on it), `ordo-sequence`, `ordo-position`, `ordo-lane`, on the commit lane `ordo-history` and `ordo-history-start`, `ordo-route` (the topic) and `ordo-previous`, and when present `ordo-source`, `ordo-event-type`, `traceparent`, `ordo-headers` (the stored header map as JSON), the relay's [header templates](crate::relay::RelayConfig::header), and in a CloudEvents format `content-type` and (binary mode) `ce_id`, `ce_source`, `ce_type`, ... |
//!
//! An [`ordo::inbox::KafkaInbox`](crate::inbox::KafkaInbox) reads them back.
//!
//! # Delivery and order
//!
//! The producer is idempotent (`enable.idempotence=true`, so `acks=all` and at most five
//! requests in flight per connection): a record the broker wrote is never written twice by
//! the producer's own retries, and a partition keeps the order records were produced in,
//! across retries and reconnects. A relay sends one event of a key at a time, so a key's
//! events reach their partition in order. Delivered means the broker's acknowledgement
//! (the delivery report). A record is retried inside librdkafka until its
//! [`delivery_timeout`](KafkaSinkBuilder::delivery_timeout) (`message.timeout.ms`), half
//! the relay's batch deadline by default.
//!
//! **Duplicates** are still possible, as with every sink: a relay killed after the broker
//! wrote a batch and before it stored the marks, a batch deadline that cut a send whose
//! records landed, a producer rebuilt after a failure (a new producer id is a new idempotence
//! session). Receivers deduplicate by `ordo-event-id` (an ordo inbox does).
//!
//! # Errors: whose fault
//!
//! | what happened | [`SendError`] |
//! | --- | --- |
//! | no delivery report within the delivery timeout (`_MSG_TIMED_OUT`) | `Transient`, once the cluster answers the sink's probe (its metadata); an outage when it does not |
//! | the topic does not exist (the broker's `UNKNOWN_TOPIC_OR_PART`, or a timeout for a topic the cluster's metadata does not list) | `Unavailable`: the topic's outage, no attempt, nothing parked |
//! | not enough in-sync replicas, refused by the topic's or the cluster's ACLs | `Unavailable` |
//! | a record too large for the broker or the producer, an invalid record | `Permanent` |
//! | a topic name Kafka cannot take (empty, over 249 characters, a character outside `a-z A-Z 0-9 . _ -`) | `Permanent`, before it is sent |
//! | a header template's value, the [`topic_fn`](KafkaSinkBuilder::topic_fn) panicking | `Permanent` |
//! | the producer failed fatally (a fenced producer id, an unsupported broker) | the batch's error: the producer is rebuilt |
//!
//! **The probe** ([`Sink::probe`]) asks the cluster for the metadata of the last topic sent to,
//! within the delivery timeout: a broker that stopped answering or whose connections are cut
//! does not answer, and the batch is an outage (nothing counted, nothing parked); the relay
//! rebuilds the producer and sends again after a capped backoff.
//!
//! # Route
//!
//! A message's route ([`Sink::router`]) is its topic: a watermark inbox keeps one mark per
//! topic. For watermark mode the relay sends every event of a route in order, so give every
//! event one key (one partition), as for every sink.

mod builder;
mod health;
mod produce;
mod records;

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::producer::FutureProducer;

pub use builder::KafkaSinkBuilder;

/// The Kafka client this module is built on (`rdkafka`, librdkafka's Rust binding),
/// re-exported so that code naming its types (creating topics with its admin client, reading
/// them back in a test) uses exactly the version ordo was built with. Present with the `kafka`
/// feature.
pub use rdkafka;

use super::format::Framing;
use super::{Message, Outcomes, SendError, Sink, SinkTiming};
use crate::error::Result;

/// Maps a message to its topic.
pub type TopicFn = Arc<dyn Fn(&Message) -> String + Send + Sync>;

/// A record's delivery timeout when none is set and no relay derived one.
const DEFAULT_DELIVERY_TIMEOUT: Duration = Duration::from_secs(5);

/// The producer, with its log through `tracing`.
type Producer = FutureProducer<crate::telemetry::Logs>;

/// Delivers to Kafka. See the [module docs](self) for the record and the errors.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use ordo::relay::{Message, Outcomes, Sink, kafka::KafkaSink};
///
/// let mut sink = KafkaSink::builder("127.0.0.1:9092").topic("orders").build()?;
/// let batch = [Message::new(br#"{"order_id": 7}"#.as_slice()).with_key(Some("customer-42"))];
/// let mut outcomes = Outcomes::new(batch.len());
/// sink.send(&batch, &mut outcomes).await?;
/// assert!(outcomes.all_delivered());
/// # Ok(()) }
/// ```
pub struct KafkaSink {
    bootstrap: String,
    topic: TopicFn,
    properties: Vec<(String, String)>,
    /// The delivery timeout its user set, if any; otherwise `delivery_timeout` is derived.
    configured_timeout: Option<Duration>,
    delivery_timeout: Duration,
    connect_timeout: Duration,
    producer: Option<Producer>,
    framing: Framing,
    /// Topics seen to exist (a delivery, or the cluster's metadata), so that a timeout there
    /// is not taken for a missing topic.
    known_topics: HashSet<String>,
    /// The topic of the last send, asked about by the probe.
    last_topic: Option<String>,
    /// A `send` began and did not finish: the producer's state is unknown.
    dirty: bool,
}

impl fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSink")
            .field("target", &self.describe())
            .field("connected", &self.producer.is_some())
            .finish_non_exhaustive()
    }
}

impl KafkaSink {
    /// Settings for a sink producing to the cluster at `bootstrap` (`host:9092`, or several
    /// `host1:9092,host2:9092`), with the defaults above.
    pub fn builder(bootstrap: impl Into<String>) -> KafkaSinkBuilder {
        KafkaSinkBuilder {
            bootstrap: bootstrap.into(),
            topic: None,
            topic_fn: None,
            properties: Vec::new(),
            delivery_timeout: None,
            connect_timeout: Duration::from_secs(5),
        }
    }

    /// Drops the producer without waiting on it: librdkafka purges and flushes for up to half
    /// a second on drop, and a broker that stopped answering holds its threads, so it is
    /// dropped on a blocking thread.
    fn drop_producer(&mut self) {
        if let Some(producer) = self.producer.take() {
            tokio::task::spawn_blocking(move || drop(producer));
        }
    }
}

impl Drop for KafkaSink {
    fn drop(&mut self) {
        // Outside a runtime (a test's sink dropped at the end) the producer drops here.
        if tokio::runtime::Handle::try_current().is_ok() {
            self.drop_producer();
        }
    }
}

impl Sink for KafkaSink {
    /// The topic.
    fn router(&self) -> Option<crate::relay::Router> {
        Some(Arc::clone(&self.topic))
    }

    async fn send(&mut self, batch: &[Message], outcomes: &mut Outcomes) -> Result<(), SendError> {
        if std::mem::replace(&mut self.dirty, true) {
            self.drop_producer();
        }
        let sent = self.produce_all(batch, outcomes).await;
        if sent.is_err() {
            self.drop_producer();
        }
        self.dirty = false;
        sent
    }

    async fn reset(&mut self) -> Result<(), SendError> {
        self.drop_producer();
        self.dirty = false;
        self.producer().map(drop)
    }

    /// The metadata of the last topic sent to, within the delivery timeout (see
    /// [Errors](self#errors-whose-fault)).
    async fn probe(&mut self) -> Result<(), SendError> {
        self.health().await
    }

    fn describe(&self) -> String {
        format!("kafka {}", crate::telemetry::printable(&self.bootstrap))
    }

    async fn prepare(&mut self, timing: &SinkTiming) -> Result<()> {
        self.framing = Framing::of(timing);
        self.fit_to_deadline(timing.batch_deadline)
    }

    fn fit_to_deadline(&mut self, batch_deadline: Duration) -> Result<()> {
        let timeout = super::fitted_timeout(
            self.configured_timeout,
            DEFAULT_DELIVERY_TIMEOUT,
            batch_deadline,
            "kafka delivery_timeout/batch_deadline",
        )?;
        if timeout != self.delivery_timeout {
            // The producer carries the timeout (`message.timeout.ms`): built anew.
            self.delivery_timeout = timeout;
            self.drop_producer();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
