//! The sink's probe ([`Sink::probe`](crate::relay::Sink::probe)) and whether a topic exists:
//! both ask the cluster for metadata, on a blocking thread (librdkafka's metadata call blocks),
//! within the delivery timeout.

use std::time::Duration;

use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::Producer as _;

use super::{KafkaSink, SendError};

impl KafkaSink {
    /// The metadata of the last topic sent to (of every topic before the first send): answered
    /// within the delivery timeout, the cluster serves this producer. Asked through the
    /// batch's producer: one whose brokers stopped answering is the sink's fault, never its
    /// messages'.
    pub(super) async fn health(&mut self) -> Result<(), SendError> {
        let bound = self.delivery_timeout;
        let topic = self.last_topic.clone();
        let producer = self.producer()?.clone();
        let asked = tokio::task::spawn_blocking(move || {
            producer
                .client()
                .fetch_metadata(topic.as_deref(), bound)
                .map(drop)
        })
        .await;
        match asked {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(SendError::transient(format!(
                "the Kafka cluster did not answer for its metadata within the delivery timeout ({bound:?}): {error}"
            ))),
            Err(panic) => Err(SendError::transient(format!(
                "asking the Kafka cluster for its metadata failed: {panic}"
            ))),
        }
    }

    /// Whether `topic` exists, by the cluster's metadata: `None` when the cluster did not
    /// answer within half the delivery timeout (the probe judges that).
    pub(super) async fn topic_exists(&mut self, topic: &str) -> Option<bool> {
        let bound = (self.delivery_timeout / 2).max(Duration::from_millis(100));
        let producer = self.producer().ok()?.clone();
        let name = topic.to_owned();
        let answer = tokio::task::spawn_blocking(move || {
            let metadata = producer.client().fetch_metadata(Some(&name), bound).ok()?;
            let found = metadata.topics().iter().find(|t| t.name() == name)?;
            let missing = matches!(
                found.error().map(RDKafkaErrorCode::from),
                Some(RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic)
            );
            Some(!missing && !found.partitions().is_empty())
        })
        .await
        .ok()
        .flatten();
        if answer == Some(true) {
            self.known_topics.insert(topic.to_owned());
        }
        answer
    }
}
