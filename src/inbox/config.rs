//! [`InboxConfig`]: how an inbox consumer deduplicates, retries and forgets.

use std::time::Duration;

use crate::error::{Error, Result};

/// How an inbox remembers what it handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum InboxMode {
    /// One row per message in `ordo.inbox`, keyed by the message id. Works for any source;
    /// messages may arrive in any order. Completed rows are kept for
    /// [`InboxConfig::retention`], which is how long a redelivery is recognised.
    #[default]
    RowPerMessage,
    /// One row per source in `ordo.inbox_watermarks`: every message carries its `source` and a
    /// dense `position` (1, 2, 3, … as another ordo's commit lane numbers them) and must arrive
    /// in order. Position mark + 1 is handled, anything at or below the mark is a duplicate
    /// (for ever: nothing is purged), anything above mark + 1 is refused as
    /// [`Receipt::Gap`](crate::inbox::Receipt::Gap).
    Watermark,
}

/// The configuration of an inbox consumer, built with setters that state their defaults.
///
/// ```
/// use std::time::Duration;
/// use ordo::inbox::{InboxConfig, InboxMode};
///
/// let config = InboxConfig::new("billing")
///     .mode(InboxMode::RowPerMessage)
///     .max_attempts(3)
///     .retention(Duration::from_secs(3 * 24 * 3600));
/// ```
#[derive(Debug, Clone)]
pub struct InboxConfig {
    pub(crate) consumer: String,
    pub(crate) mode: InboxMode,
    pub(crate) max_attempts: u32,
    pub(crate) retention: Duration,
}

/// The longest [`InboxConfig::retention`]: 100 years (of 365 days). The purge deletes rows that
/// completed before `now() - retention`, computed by PostgreSQL, whose timestamps end in
/// 4713 BC; a retention past a century means "never", which is not calling
/// [`Inbox::purge`](crate::Inbox::purge) at all.
pub const MAX_RETENTION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The longest consumer name, message id and source accepted (bytes).
pub(crate) const MAX_NAME: usize = 200;

/// The most bytes of a route (`InboxMessage::route`): it is part of a watermark's key.
pub(crate) const MAX_ROUTE: usize = 1000;

impl InboxConfig {
    /// A consumer named `consumer` (its key in `ordo.inbox`: two consumers with different
    /// names each handle every message once), with the defaults.
    pub fn new(consumer: impl Into<String>) -> Self {
        Self {
            consumer: consumer.into(),
            mode: InboxMode::RowPerMessage,
            max_attempts: 5,
            retention: Duration::from_secs(7 * 24 * 3600),
        }
    }

    /// How handled messages are remembered. Default [`InboxMode::RowPerMessage`].
    pub fn mode(mut self, mode: InboxMode) -> Self {
        self.mode = mode;
        self
    }

    /// Attempts per message, the first included, before it is `failed` (dead-lettered in the
    /// inbox). An attempt that ended without an outcome (the process died in the handler)
    /// counts as one. Default 5; 1 to 1,000.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// How long completed rows are kept (row-per-message mode): a message redelivered later
    /// than this after it completed runs again. Pick it longer than the longest redelivery
    /// the sender can make (a broker's message retention, a relay's replay window). Default
    /// 7 days; 1 second to [`MAX_RETENTION`] (100 years).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// The consumer's name.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let invalid = Error::invalid_config;
        if self.consumer.is_empty() || self.consumer.len() > MAX_NAME {
            return invalid(
                "InboxConfig::new",
                "the consumer name must be 1 to 200 bytes",
            );
        }
        if !(1..=1000).contains(&self.max_attempts) {
            return invalid("InboxConfig::max_attempts", "must be 1 to 1000");
        }
        if self.retention < Duration::from_secs(1) {
            return invalid(
                "InboxConfig::retention",
                "must be at least 1 second: a shorter one forgets a message before its redelivery",
            );
        }
        if self.retention > MAX_RETENTION {
            return invalid(
                "InboxConfig::retention",
                "must be at most 100 years: to keep completed rows for ever, never purge",
            );
        }
        Ok(())
    }
}
