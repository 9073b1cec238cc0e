//! The consumer inbox: messages received from outside (a broker, an HTTP endpoint, another
//! ordo's relay) handled with exactly-once effect.
//!
//! A transport (a broker adapter, an endpoint) hands each message it receives to
//! [`Inbox::receive`] with a handler, and acknowledges the message to its sender only when the
//! [`Receipt`] is [`settled`](Receipt::settled). The handler runs in a transaction that also
//! records the message as handled, so its database effects happen once however many times the
//! message is delivered.
//!
//! ## Guarantees
//!
//! - **Deduplicated:** within one consumer, a message id whose handler transaction committed
//!   is answered [`Receipt::Duplicate`] without running the handler, for as long as its row is
//!   kept ([`InboxConfig::retention`], default 7 days, counted from completion). In
//!   [`InboxMode::Watermark`], a position at or below the source's mark, for ever.
//! - **Never twice at once:** a message (row mode) or a source (watermark mode) being handled
//!   by another receiver, in this process or another, is answered [`Receipt::Busy`] at once,
//!   without waiting.
//! - **Failures:** a handler error or panic rolls its transaction back; the attempt, error and
//!   payload are recorded outside it. After [`InboxConfig::max_attempts`] the message is
//!   `failed` (dead-lettered in `ordo.inbox`, kept for ever) and is not run again until
//!   [`replay`]ed.
//! - **Crash between the inbox commit and the transport's acknowledgement:** the transport
//!   redelivers; the inbox answers `Duplicate` and the transport acknowledges then. A crash
//!   inside the handler leaves the row `processing`; the next delivery counts that attempt as
//!   failed and runs the message again.
//!
//! ## States (row mode, `ordo.inbox.status`)
//!
//! ```text
//!            claim                 handler commits
//! (none) ──────────▶ processing ─────────────────▶ completed ──(retention)──▶ purged
//!                     │  ▲    │
//!      handler fails, │  │    │ handler fails at the maximum
//!      attempts < max ▼  │    ▼
//!                   pending   failed ──(replay)──▶ pending
//!                    (next delivery or run_pending claims it again)
//! ```
//!
//! ## Broker adapters
//!
//! [`NatsInbox`] (feature `nats`) consumes a JetStream durable consumer and [`RabbitInbox`]
//! (feature `rabbitmq`) a queue, each into an inbox, acknowledging the broker only after the
//! inbox has settled the message:
//!
//! | the inbox answered | the adapter |
//! | --- | --- |
//! | `Handled`, `Duplicate`, `Failed` (the inbox holds the outcome) | acknowledges |
//! | `Busy` (another receiver has it) | has it redelivered after [`Redelivery::busy`] |
//! | `Gap` (watermark mode: an earlier position is missing) | has it redelivered after [`Redelivery::gap`] |
//! | `Retry` (the handler failed, attempts remain) | has it redelivered after the backoff for that attempt |
//! | a database error (nothing settled) | has it redelivered after [`Redelivery::busy`] |
//! | a message the inbox cannot store (no id, a body that is not UTF-8 text, bad ordo headers) | rejects it for good: NATS `TERM`; RabbitMQ dead-letters it to `{queue}.dlq` |
//!
//! Messages relayed by another ordo ([`Outbox::relay`](crate::Outbox::relay) with the
//! matching sink) carry their id, headers and, with
//! [`RelayConfig::source`](crate::relay::RelayConfig::source) on the commit lane, the source
//! and dense position that [`InboxMode::Watermark`] needs. For watermark mode the relay must
//! send in commit order: give every event the same key (`|_| Keys::one("all")`); with per-key
//! order, messages of different keys overtake each other and wait out `Gap` redeliveries.

#[cfg(any(feature = "kafka", feature = "nats", feature = "rabbitmq"))]
mod adapter;
mod admin;
mod config;
mod handler;
#[cfg(feature = "kafka")]
pub mod kafka;
mod message;
mod owner;
mod purge;
mod rows;
mod sql;
pub(crate) mod status;
mod transport;
mod watermark;

#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;
#[cfg(feature = "rabbitmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "rabbitmq")))]
pub mod rabbitmq;

use std::sync::Arc;
use std::time::Duration;

use sqlx::{PgPool, Row};
use tokio::sync::OnceCell;

pub use admin::{
    FailedMessage, Watermark, WatermarkGap, WatermarkRewind, list_failed, list_watermarks, replay,
    replay_all, set_route_watermark, set_watermark,
};
pub use config::{InboxConfig, InboxMode, MAX_RETENTION};
pub use handler::InboxHandler;
pub use message::{InboxMessage, Receipt};
pub use owner::adopt_consumer;
pub use purge::InboxPurger;
pub(crate) use sql::HOT_PATH;
pub use status::{FailedCount, GAP_SHOWN_AFTER, InboxStatus, MarkStatus, MarkWait};
pub use transport::{MAX_REDELIVERY_DELAY, Redelivery};

#[cfg(feature = "kafka")]
pub use kafka::{KafkaInbox, KafkaInboxBuilder};
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub use nats::{NatsInbox, NatsInboxBuilder};
#[cfg(feature = "rabbitmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "rabbitmq")))]
pub use rabbitmq::{DEAD_LETTER_EXCHANGE, RabbitInbox, RabbitInboxBuilder};

use crate::envelope::Headers;
use crate::error::{Error, Result};
use crate::pooler::{self, Sessions, Statements};
use crate::telemetry::metrics::INBOX_RECEIPTS;

/// One inbox consumer: receives messages for one name in `ordo.inbox` (see the
/// [module docs](self)). Cheap to clone; any number of receivers (tasks, processes) may share
/// a consumer name.
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool, handler: impl ordo::inbox::InboxHandler) -> ordo::Result<()> {
/// use ordo::inbox::{Inbox, InboxConfig, InboxMessage};
///
/// let inbox = Inbox::new(pool, InboxConfig::new("billing").max_attempts(3))?;
/// let message = InboxMessage::new("0190c3a4-7d1e-7c42-9f7a-2b1c1e0d5a11", r#"{"order_id":7}"#);
/// let receipt = inbox.receive(&message, &handler).await?;
/// if receipt.settled() {
///     // acknowledge the message to the broker
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Inbox {
    pool: PgPool,
    config: Arc<InboxConfig>,
    /// How the pool takes statements: named, or unnamed through a transaction-mode pooler.
    /// Found out at the first receive (shared by the clones).
    statements: Arc<OnceCell<Statements>>,
}

impl Inbox {
    /// An inbox consumer on `pool` (a database migrated with [`migrate`](crate::migrate)).
    ///
    /// `pool` may go through a transaction-mode pooler (PgBouncer's `pool_mode = transaction`)
    /// in [`InboxMode::Watermark`]: the first receive finds out (as
    /// [`admin::keeps_sessions`](crate::admin::keeps_sessions) does) and the inbox then sends its
    /// statements unnamed. Your handler's statements must be unnamed there too
    /// (`sqlx::query(..).persistent(false)`). [`InboxMode::RowPerMessage`] holds a session
    /// advisory lock per message and refuses such a pool with [`Error::TransactionPooler`].
    /// The probe holds one pooled connection and opens one more for a few round trips, once
    /// per `Inbox`: create it once and clone it, rather than one per message.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the setting at fault.
    pub fn new(pool: PgPool, config: InboxConfig) -> Result<Self> {
        config.validate()?;
        crate::metrics::describe();
        Ok(Self {
            pool,
            config: Arc::new(config),
            statements: Arc::new(OnceCell::new()),
        })
    }

    /// How this inbox sends its statements, found out once: unnamed when the pool goes through
    /// a transaction-mode pooler. `row_locks` says whether the caller takes a session advisory
    /// lock per message (row mode, [`run_pending`](Self::run_pending)), which such a pooler
    /// cannot keep: then it refuses. Once too, the consumer's name is claimed for the
    /// connected role (`owner.rs`), or refused when it belongs to another.
    pub(crate) async fn statements(&self, row_locks: bool) -> Result<Statements> {
        let statements = *self
            .statements
            .get_or_try_init(|| async {
                let statements = match pooler::probe(&self.pool).await? {
                    Sessions::Kept => Statements::Named,
                    Sessions::PerTransaction => Statements::Unnamed,
                };
                owner::claim(&self.pool, statements, &self.config.consumer).await?;
                Ok::<_, Error>(statements)
            })
            .await?;
        if statements == Statements::Unnamed && row_locks {
            return Err(Error::TransactionPooler {
                part: "an Inbox in InboxMode::RowPerMessage (or Inbox::run_pending)",
                fix: "it holds a session advisory lock per message: give it a pool on the server \
                      itself or a session-mode pooler, or use InboxMode::Watermark, which runs \
                      through a transaction-mode pooler",
            });
        }
        Ok(statements)
    }

    /// Whether this inbox's mode takes a session advisory lock per message.
    pub(crate) fn locks_rows(&self) -> bool {
        self.config.mode == InboxMode::RowPerMessage
    }

    /// The configuration.
    pub fn config(&self) -> &InboxConfig {
        &self.config
    }

    /// Receives one message: handles it with `handler` unless it was handled already, is
    /// being handled elsewhere, has failed for good, or (watermark mode) arrives out of order.
    /// The [`Receipt`] says which, and whether the transport may acknowledge it.
    ///
    /// # Errors
    /// [`Error::InvalidInboxMessage`] for a message that
    /// cannot be stored (retrying it fails the same way); [`Error::Database`]
    /// when the inbox's own statements fail: nothing was settled, so do not acknowledge;
    /// [`Error::TransactionPooler`] in row mode through a
    /// transaction-mode pooler (see [`new`](Self::new)).
    ///
    /// # Cancel safety
    /// Dropping the future rolls the handler's transaction back. A claim already committed
    /// stays `processing` and is counted as a failed attempt by the next delivery.
    pub async fn receive<H: InboxHandler>(
        &self,
        message: &InboxMessage,
        handler: &H,
    ) -> Result<Receipt> {
        message.check(&self.config.consumer)?;
        let statements = self.statements(self.locks_rows()).await?;
        let receipt = match self.config.mode {
            InboxMode::RowPerMessage => {
                rows::receive(&self.pool, &self.config, message, handler).await?
            }
            InboxMode::Watermark => {
                watermark::receive(&self.pool, statements, &self.config, message, handler).await?
            }
        };
        self.count(&receipt);
        Ok(receipt)
    }

    /// The error for a transport message that cannot become an [`InboxMessage`].
    #[cfg(any(feature = "kafka", feature = "nats", feature = "rabbitmq"))]
    pub(crate) fn refused(&self, id: Option<&str>, reason: String) -> crate::Error {
        crate::Error::InvalidInboxMessage {
            consumer: self.config.consumer.clone(),
            id: id
                .unwrap_or_default()
                .chars()
                .take(config::MAX_NAME)
                .collect(),
            reason,
        }
    }

    /// One more `ordo_inbox_receipts_total{receipt="rejected"}`: a message an adapter rejected
    /// for good because the inbox cannot store it.
    #[cfg(any(feature = "kafka", feature = "nats", feature = "rabbitmq"))]
    pub(crate) fn count_rejected(&self) {
        let consumer = self.config.consumer.clone();
        metrics::counter!(INBOX_RECEIPTS, "consumer" => consumer, "receipt" => "rejected")
            .increment(1);
    }

    /// One more `ordo_inbox_receipts_total`.
    fn count(&self, receipt: &Receipt) {
        let consumer = self.config.consumer.clone();
        metrics::counter!(INBOX_RECEIPTS, "consumer" => consumer, "receipt" => receipt.as_str())
            .increment(1);
    }

    /// Runs up to `limit` of this consumer's `pending` messages that have a stored payload
    /// (replayed ones, and ones whose last attempt failed), oldest first, through the
    /// row-per-message path: each runs once, whatever the mode, and a redelivery of it is a
    /// duplicate afterwards. Returns each message's id and receipt. Call it at start-up and
    /// every so often to run what operators replayed.
    ///
    /// # Errors
    /// [`Error::Database`] if the rows cannot be read or a receipt not
    /// recorded (the messages before it were handled);
    /// [`Error::TransactionPooler`] through a transaction-mode
    /// pooler, where the row path's advisory locks cannot be held.
    pub async fn run_pending<H: InboxHandler>(
        &self,
        handler: &H,
        limit: usize,
    ) -> Result<Vec<(String, Receipt)>> {
        self.statements(true).await?;
        let rows = sqlx::query(sql::PENDING)
            .bind(&self.config.consumer)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await?;
        let mut receipts = Vec::with_capacity(rows.len());
        for row in rows {
            let headers: Option<sqlx::types::Json<Headers>> = row.try_get("headers")?;
            let mut message = InboxMessage::new(
                row.try_get::<String, _>("message_id")?,
                row.try_get::<Option<String>, _>("payload")?
                    .unwrap_or_default(),
            )
            .with_headers(headers.map(|json| json.0).unwrap_or_default());
            message.source = row.try_get("source")?;
            message.position = row
                .try_get::<Option<i64>, _>("position")?
                .and_then(|p| u64::try_from(p).ok());
            let receipt = rows::receive(&self.pool, &self.config, &message, handler).await?;
            self.count(&receipt);
            receipts.push((message.id, receipt));
        }
        Ok(receipts)
    }

    /// Deletes this consumer's completed rows older than [`InboxConfig::retention`]; returns
    /// how many. Failed, pending and processing rows are never deleted, nor watermarks.
    ///
    /// # Errors
    /// [`Error::Database`] if a delete fails (the batches before it
    /// stay deleted).
    pub async fn purge(&self) -> Result<u64> {
        purge::purge(&self.pool, &self.config.consumer, self.config.retention).await
    }

    /// Starts a background task that runs [`purge`](Self::purge) now and then every `every`,
    /// until the returned handle is shut down or dropped. Needs a tokio runtime.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a zero `every`, which would
    /// send deletes to the database in a busy loop.
    pub fn spawn_purge(&self, every: Duration) -> Result<InboxPurger> {
        if every.is_zero() {
            return crate::Error::invalid_config(
                "Inbox::spawn_purge",
                "the interval must be more than zero: zero purges in a busy loop",
            );
        }
        Ok(InboxPurger::spawn(
            self.pool.clone(),
            self.config.consumer.clone(),
            self.config.retention,
            every,
        ))
    }
}
