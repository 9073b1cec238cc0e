//! The Kafka adapter's [`Transport`]: a group member's records, their offsets stored once the
//! inbox settled them and committed every `commit_interval`, and a record to be delivered
//! again held by pausing its partition and seeking back to it.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message as _, OwnedMessage};
use rdkafka::{Offset, TopicPartitionList};
use tokio::time::Instant;

use super::KafkaInbox;
use crate::error::Result;
use crate::inbox::adapter::Transport;
use crate::inbox::transport::{Parts, Redelivery, Settle};
use crate::wire::kafka as wire;

type Client = StreamConsumer<crate::telemetry::Logs>;

/// A topic and partition.
type Partition = (String, i32);

/// The consumer, and what the adapter keeps of its partitions.
pub(crate) struct Session {
    consumer: Client,
    /// Per partition, the next offset to commit: after the last record the inbox settled.
    settled: HashMap<Partition, i64>,
    /// Whether `settled` holds offsets not committed yet.
    uncommitted: bool,
    last_commit: Instant,
    /// Partitions paused until a record of theirs is due again.
    held: HashMap<Partition, Instant>,
}

impl Transport for KafkaInbox {
    const BROKER: &'static str = "Kafka";
    const ID_HEADER: &'static str = wire::EVENT_ID;
    type Session = Session;
    type Message = OwnedMessage;

    fn consumer(&self) -> &str {
        &self.settings.group
    }

    fn redelivery(&self) -> &Redelivery {
        &self.settings.redelivery
    }

    fn rejected(&self) -> String {
        "skipped (its offset committed; the record stays in its topic)".to_owned()
    }

    async fn start(&self) -> Result<Session> {
        let consumer: Client = self
            .config()
            .create_with_context(crate::telemetry::Logs)
            .map_err(|error| self.broker(format!("cannot create the consumer: {error}")))?;
        self.check_topics().await?;
        let topics: Vec<&str> = self.settings.topics.iter().map(String::as_str).collect();
        consumer
            .subscribe(&topics)
            .map_err(|error| self.broker(format!("cannot subscribe to {topics:?}: {error}")))?;
        Ok(Session {
            consumer,
            settled: HashMap::new(),
            uncommitted: false,
            last_commit: Instant::now(),
            held: HashMap::new(),
        })
    }

    /// librdkafka reconnects and rejoins by itself: nothing to set up again.
    async fn resume(&self, _: &mut Session) -> Result<()> {
        Ok(())
    }

    async fn next(
        &self,
        session: &mut Session,
    ) -> Option<std::result::Result<OwnedMessage, String>> {
        loop {
            self.commit_if_due(session, CommitMode::Async);
            resume_due(session);
            let wake = session
                .held
                .values()
                .min()
                .copied()
                .unwrap_or_else(|| Instant::now() + self.settings.commit_interval)
                .min(session.last_commit + self.settings.commit_interval);
            let received = tokio::select! {
                received = session.consumer.recv() => received,
                () = tokio::time::sleep_until(wake) => continue,
            };
            match received {
                Ok(message) => {
                    let partition = (message.topic().to_owned(), message.partition());
                    // Fetched before its partition was paused: it comes again after the record
                    // the partition waits for.
                    if session.held.contains_key(&partition) {
                        continue;
                    }
                    return Some(Ok(message.detach()));
                }
                Err(error) => return Some(Err(format!("receiving failed: {error}"))),
            }
        }
    }

    fn parts<R>(message: &OwnedMessage, read: impl FnOnce(Parts<'_>) -> R) -> R {
        let header = |name: &str| {
            message.headers().and_then(|headers| {
                headers
                    .iter()
                    .find(|header| header.key == name)
                    .and_then(|header| header.value)
                    .and_then(|value| std::str::from_utf8(value).ok())
            })
        };
        read(Parts {
            id: header(wire::EVENT_ID),
            payload: message.payload().unwrap_or_default(),
            headers: header(wire::HEADERS),
            source: header(wire::SOURCE),
            position: header(wire::POSITION),
            lane: header(wire::LANE),
            history: header(wire::HISTORY),
            history_start: header(wire::HISTORY_START),
            route: header(wire::ROUTE),
            previous: header(wire::PREVIOUS),
        })
    }

    async fn settle(
        &self,
        session: &mut Session,
        message: OwnedMessage,
        settle: Settle,
    ) -> std::result::Result<(), String> {
        let partition = (message.topic().to_owned(), message.partition());
        match settle {
            Settle::Ack | Settle::Reject(_) => {
                session.settled.insert(partition, message.offset() + 1);
                session.uncommitted = true;
                Ok(())
            }
            Settle::Redeliver(delay) => {
                // Fetched again from this record once the delay is over; the partition's later
                // records wait behind it, as its offset does.
                let mut paused = TopicPartitionList::new();
                paused.add_partition(&partition.0, partition.1);
                session
                    .consumer
                    .pause(&paused)
                    .map_err(|error| format!("pausing the partition: {error}"))?;
                session
                    .consumer
                    .seek(
                        &partition.0,
                        partition.1,
                        Offset::Offset(message.offset()),
                        Duration::from_secs(5),
                    )
                    .map_err(|error| format!("seeking back to the record: {error}"))?;
                session.held.insert(partition, Instant::now() + delay);
                Ok(())
            }
        }
    }

    /// Nothing to drain: a record fetched and not handled comes again from the last commit.
    async fn cancel(&self, _: &mut Session) -> bool {
        false
    }

    /// The offsets the inbox settled are committed, then the group is left (librdkafka's close,
    /// which blocks, on a blocking thread).
    async fn close(&self, mut session: Session) {
        session.uncommitted |= !session.settled.is_empty();
        self.commit_if_due(&mut session, CommitMode::Sync);
        let group = self.settings.group.clone();
        let closed = tokio::task::spawn_blocking(move || drop(session.consumer)).await;
        if closed.is_err() {
            tracing::warn!(group, "Kafka inbox adapter: leaving the group failed");
        }
    }
}

impl KafkaInbox {
    /// Commits the settled offsets when there are new ones and the interval is over (or, in
    /// `Sync` mode at a stop, now).
    fn commit_if_due(&self, session: &mut Session, mode: CommitMode) {
        let due = matches!(mode, CommitMode::Sync)
            || session.last_commit.elapsed() >= self.settings.commit_interval;
        if !session.uncommitted || !due {
            return;
        }
        let mut offsets = TopicPartitionList::new();
        for ((topic, partition), offset) in &session.settled {
            if offsets
                .add_partition_offset(topic, *partition, Offset::Offset(*offset))
                .is_err()
            {
                return;
            }
        }
        session.last_commit = Instant::now();
        match session.consumer.commit(&offsets, mode) {
            Ok(()) => {
                session.uncommitted = false;
                session.settled.clear();
            }
            // Not committed: those records come again after a crash, and the inbox answers
            // `Duplicate`. Tried again at the next interval.
            Err(error) => {
                tracing::warn!(group = self.settings.group, %error, "Kafka inbox adapter: committing offsets failed")
            }
        }
    }

    /// Fails the start when the cluster does not answer or a topic does not exist (asked by a
    /// client of its own on a blocking thread: librdkafka's metadata call blocks).
    async fn check_topics(&self) -> Result<()> {
        let wait = self.settings.connect_timeout;
        let (config, topics) = (self.config(), self.settings.topics.clone());
        let checked = tokio::task::spawn_blocking(move || {
            let client: rdkafka::consumer::BaseConsumer<crate::telemetry::Logs> = config
                .create_with_context(crate::telemetry::Logs)
                .map_err(|error| format!("cannot create the consumer: {error}"))?;
            for topic in &topics {
                let metadata = client.fetch_metadata(Some(topic), wait).map_err(|error| {
                    format!(
                        "the cluster did not answer for topic {topic:?} within {wait:?}: {error}"
                    )
                })?;
                let missing = metadata
                    .topics()
                    .iter()
                    .find(|found| found.name() == topic)
                    .is_none_or(|found| found.error().is_some() || found.partitions().is_empty());
                if missing {
                    return Err(format!(
                        "topic {topic:?} does not exist: create it before the adapter starts"
                    ));
                }
            }
            Ok(())
        })
        .await
        .map_err(|error| format!("checking the topics failed: {error}"))
        .and_then(|checked| checked);
        checked.map_err(|reason| self.broker(reason))
    }
}

/// Resumes the partitions whose held record is due.
fn resume_due(session: &mut Session) {
    let now = Instant::now();
    let due: Vec<Partition> = session
        .held
        .iter()
        .filter(|(_, until)| **until <= now)
        .map(|(partition, _)| partition.clone())
        .collect();
    for partition in due {
        session.held.remove(&partition);
        let mut resumed = TopicPartitionList::new();
        resumed.add_partition(&partition.0, partition.1);
        // A partition no longer assigned to this member fails to resume: its new owner reads it.
        let _ = session.consumer.resume(&resumed);
    }
}
