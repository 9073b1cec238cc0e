//! [`KafkaInbox`]: consume Kafka topics, as a member of a consumer group, into an [`Inbox`].
//!
//! Each record goes through [`Inbox::receive`]; its offset is committed to the group only after
//! the inbox has settled it (the inbox transaction committed, or the inbox already held its
//! outcome). A process that dies between the inbox's commit and the offset's commit has the
//! record delivered again to whichever member takes its partition; the inbox answers
//! `Duplicate` and the offset moves on then. What the adapter does for each answer is in the
//! [inbox module docs](super#broker-adapters).
//!
//! # The record
//!
//! | Kafka | [`InboxMessage`](super::InboxMessage) |
//! | --- | --- |
//! | header `ordo-event-id` | `id` (required: a record without it is skipped, its offset committed) |
//! | the value (UTF-8 text) | `payload` |
//! | header `ordo-headers` (a JSON object) | `headers` |
//! | headers `ordo-source`, `ordo-position` (and `ordo-lane` `commit`, or none), `ordo-history`, `ordo-history-start`, `ordo-route`, `ordo-previous` | for [`InboxMode::Watermark`](super::InboxMode::Watermark) |
//!
//! An ordo relay with a [`KafkaSink`](crate::relay::kafka::KafkaSink) sets all of them.
//!
//! # Offsets, order and redelivery
//!
//! A partition is consumed in order, one record at a time. Kafka has no per-message
//! acknowledgement: a partition's committed offset says that every record before it is done.
//! So the adapter stores a record's offset once the inbox settled it, and commits the stored
//! offsets every [`commit_interval`](KafkaInboxBuilder::commit_interval) (and at a clean
//! stop): a crash redelivers at most what was settled since the last commit, which the inbox
//! absorbs. A record the inbox did not settle (busy elsewhere, a gap in watermark mode, a
//! handler failure with attempts left) holds its partition: the adapter pauses the partition
//! and seeks back to the record, and fetches it again after the [`Redelivery`] delay, while
//! the group's other partitions go on. A record the inbox can never store (no
//! `ordo-event-id`, a value that is not UTF-8 text, malformed ordo headers) is skipped with a
//! WARN and counted (`ordo_inbox_receipts_total{receipt="rejected"}`): Kafka has no
//! dead-letter queue of its own, and the record stays in its topic for the broker's tools. A
//! handler that fails for good is not skipped silently: the inbox keeps it as `failed`.
//!
//! # The group
//!
//! The adapter joins the consumer group [`KafkaInbox::builder`] names and subscribes to its
//! topics; any number of adapters (tasks, processes) share the group, Kafka spreading the
//! partitions among them. A member that dies keeps its partitions until its
//! [`session_timeout`](KafkaInboxBuilder::session_timeout) expires. A group new to its
//! topics starts at their beginning (`auto.offset.reset=earliest`): nothing the relay sent
//! before the adapter first ran is missed.
//!
//! # The topics
//!
//! The adapter creates nothing. Its topics must exist when [`KafkaInbox::run`] starts, or it
//! returns [`Error::Broker`] naming the missing one.

use std::future::Future;
use std::time::Duration;

use super::Inbox;
use super::adapter;
use super::handler::InboxHandler;
use super::transport::Redelivery;
use crate::error::{Error, Result};

mod builder;
mod transport;

pub use builder::KafkaInboxBuilder;

/// Consumes Kafka topics into an [`Inbox`] (see the [module docs](self)).
///
/// ```no_run
/// # async fn run(inbox: ordo::inbox::Inbox, handler: impl ordo::inbox::InboxHandler) -> ordo::Result<()> {
/// use ordo::inbox::KafkaInbox;
///
/// let adapter = KafkaInbox::builder("127.0.0.1:9092", "billing", ["orders"]).build()?;
/// // Runs until ctrl-c; each offset committed once the inbox has settled its record.
/// adapter
///     .run(&inbox, &handler, async {
///         let _ = tokio::signal::ctrl_c().await;
///     })
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct KafkaInbox {
    settings: KafkaInboxBuilder,
}

impl KafkaInbox {
    /// An adapter in consumer group `group`, reading `topics`, on the cluster at `bootstrap`
    /// (`host:9092`, or several `host1:9092,host2:9092`).
    pub fn builder<I, T>(
        bootstrap: impl Into<String>,
        group: impl Into<String>,
        topics: I,
    ) -> KafkaInboxBuilder
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        KafkaInboxBuilder {
            bootstrap: bootstrap.into(),
            group: group.into(),
            topics: topics.into_iter().map(Into::into).collect(),
            properties: Vec::new(),
            commit_interval: Duration::from_secs(1),
            session_timeout: Duration::from_secs(45),
            connect_timeout: Duration::from_secs(5),
            redelivery: Redelivery::default(),
        }
    }

    /// Receives records into `inbox`, handled by `handler`, one at a time, until `shutdown`
    /// completes; then commits the offsets of what the inbox settled and leaves the group.
    /// Lost connections are logged and retried (librdkafka reconnects by itself); they do not
    /// end the run.
    ///
    /// # Errors
    /// [`Error::Broker`] when the start fails: the cluster cannot be reached within the
    /// connect timeout, or a topic does not exist.
    ///
    /// # Cancel safety
    /// Dropping the future is a crash: no offset is committed past the last commit, and the
    /// records settled since are delivered again and answered `Duplicate`.
    pub async fn run<H: InboxHandler>(
        &self,
        inbox: &Inbox,
        handler: &H,
        shutdown: impl Future<Output = ()>,
    ) -> Result<()> {
        adapter::run(self, inbox, handler, shutdown).await
    }

    fn broker(&self, reason: String) -> Error {
        Error::Broker {
            broker: "kafka",
            at: crate::telemetry::printable(&self.settings.bootstrap).into_owned(),
            reason,
        }
    }
}
