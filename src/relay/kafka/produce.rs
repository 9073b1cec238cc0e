//! Producing a batch: every record enqueued at once (librdkafka pipelines them), each delivery
//! report reported as it comes, and how a failed delivery is classified.

use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureRecord, Producer as _};

use super::records::{check_topic, headers};
use super::{KafkaSink, Message, Outcomes, SendError};

/// How long a message of a topic the cluster does not have waits before it is tried again
/// (about: jittered by ±50%), or the relay's outage backoff when that is longer.
pub(super) const NO_TOPIC_PAUSE: Duration = Duration::from_secs(1);

impl KafkaSink {
    /// Produces `batch`: each record enqueued without waiting, each delivery reported as its
    /// report arrives; the failures, classified, at the end (a timeout on a topic not known
    /// to exist is first checked against the cluster's metadata).
    pub(super) async fn produce_all(
        &mut self,
        batch: &[Message],
        outcomes: &mut Outcomes,
    ) -> Result<(), SendError> {
        let topic_of = std::sync::Arc::clone(&self.topic);
        let framing = self.framing.clone();
        let producer = self.producer()?.clone();
        let mut failures: Vec<(usize, Option<String>, SendError)> = Vec::new();
        let mut pending = FuturesUnordered::new();
        for (index, message) in batch.iter().enumerate() {
            let topic = match crate::relay::guarded("topic", || topic_of(message))
                .and_then(|topic| check_topic(&topic).map(|()| topic))
            {
                Ok(topic) => topic,
                Err(refused) => {
                    failures.push((index, None, refused));
                    continue;
                }
            };
            let body = match framing.body(message) {
                Ok(body) => body,
                Err(refused) => {
                    failures.push((index, None, refused));
                    continue;
                }
            };
            let mut record = FutureRecord::to(&topic)
                .payload(&body[..])
                .headers(headers(message, &framing))
                .timestamp(message.recorded_at.timestamp_millis());
            if let Some(key) = &message.key {
                record = record.key(key.as_bytes());
            }
            match producer.send_result(record) {
                Ok(delivery) => pending.push(async move { (index, topic, delivery.await) }),
                Err((error, _)) => failures.push((index, Some(topic), classify(&error))),
            }
        }
        while let Some((index, topic, report)) = pending.next().await {
            match report {
                Ok(Ok(_)) => {
                    outcomes.delivered(index);
                    if !self.known_topics.contains(&topic) {
                        self.known_topics.insert(topic.clone());
                    }
                }
                Ok(Err((error, _))) => failures.push((index, Some(topic), classify(&error))),
                Err(_) => failures.push((
                    index,
                    Some(topic),
                    SendError::transient("the producer was closed before the delivery report"),
                )),
            }
        }
        if let Some(last) = batch
            .last()
            .and_then(|message| crate::relay::guarded("topic", || topic_of(message)).ok())
        {
            self.last_topic = Some(last);
        }
        if let Some((code, reason)) = producer.client().fatal_error() {
            return Err(SendError::transient(format!(
                "the Kafka producer failed fatally ({code:?}: {}); it is rebuilt",
                crate::telemetry::printable(&reason)
            )));
        }
        self.report_failures(failures, outcomes).await;
        Ok(())
    }

    /// Reports each failure to `outcomes`, a timeout on a topic never delivered to turned into
    /// the topic's outage when the topic turns out not to exist.
    async fn report_failures(
        &mut self,
        failures: Vec<(usize, Option<String>, SendError)>,
        outcomes: &mut Outcomes,
    ) {
        // A timeout on a topic never delivered to may be a topic that does not exist: the
        // topic's outage, not the message's attempt. Asked once per topic.
        let mut checked: std::collections::HashMap<String, Option<bool>> = Default::default();
        for (index, topic, error) in failures {
            let error = match topic {
                Some(topic) if may_be_missing(&error) && !self.known_topics.contains(&topic) => {
                    let exists = match checked.get(&topic) {
                        Some(exists) => *exists,
                        None => {
                            let exists = self.topic_exists(&topic).await;
                            checked.insert(topic.clone(), exists);
                            exists
                        }
                    };
                    match exists {
                        Some(false) => unavailable(format!(
                            "the topic {} does not exist ({})",
                            crate::relay::quoted(&topic),
                            error.message()
                        )),
                        _ => error,
                    }
                }
                _ => error,
            };
            outcomes.failed(index, error);
        }
    }
}

/// Whether a failure may mean that the record's topic does not exist.
fn may_be_missing(error: &SendError) -> bool {
    matches!(error, SendError::Transient { .. })
}

/// Whose fault a failed produce is (see the module docs' table).
pub(super) fn classify(error: &KafkaError) -> SendError {
    use RDKafkaErrorCode as Code;
    let code = match error {
        KafkaError::MessageProduction(code) => *code,
        other => return SendError::transient(format!("producing: {other}")),
    };
    let said = format!("{error}");
    match code {
        Code::MessageSizeTooLarge
        | Code::InvalidMessageSize
        | Code::InvalidMessage
        | Code::InvalidRecord
        | Code::MessageBatchTooLarge
        | Code::InvalidTopic => SendError::permanent(said),
        Code::UnknownTopicOrPartition | Code::UnknownTopic | Code::UnknownPartition => {
            unavailable(format!("the topic does not exist: {said}"))
        }
        Code::NotEnoughReplicas
        | Code::NotEnoughReplicasAfterAppend
        | Code::TopicAuthorizationFailed
        | Code::ClusterAuthorizationFailed => {
            unavailable(format!("the topic takes nothing now: {said}"))
        }
        _ => SendError::transient(said),
    }
}

/// The topic's outage: retried after about [`NO_TOPIC_PAUSE`].
pub(super) fn unavailable(message: String) -> SendError {
    SendError::Unavailable {
        message,
        retry_after: NO_TOPIC_PAUSE.mul_f64(0.5 + fastrand::f64()),
    }
}
