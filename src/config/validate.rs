//! [`OutboxConfig`]'s settings checked before an outbox starts: each refusal names its
//! setting and why.

use std::time::Duration;

use super::{
    MAX_GAP_FILL_TIMEOUT, MAX_MAINTENANCE_INTERVAL, MAX_NOTIFY_DEBOUNCE, MAX_RESYNC_INTERVAL,
    OutboxConfig,
};
use crate::error::{Error, Result};

impl OutboxConfig {
    /// Refuses a setting out of its range, or two that contradict each other.
    pub(crate) fn validate(&self) -> Result<()> {
        let invalid = Error::invalid_config;
        self.retention.validate()?;
        if !self.partition_maintenance && self.retention.keep.is_some() {
            return invalid(
                "partition_maintenance/retention",
                "retention.keep drops partitions, which needs partition_maintenance on; \
                 drop with `ordo retention --keep` from an operator role instead",
            );
        }
        if self.cache_capacity < 16 {
            return invalid("cache_capacity", "must hold at least 16 events");
        }
        if self.cache_bytes < 1_024 {
            return invalid("cache_bytes", "must be at least 1 KiB (1,024 bytes)");
        }
        if self.page_size == 0 || self.page_size > 100_000 {
            return invalid("page_size", "must be between 1 and 100,000 rows");
        }
        if self.fold_batch == 0 || self.fold_batch > 1_000_000 {
            return invalid("fold_batch", "must be between 1 and 1,000,000 transactions");
        }
        if self.fold_interval > Duration::from_secs(1) {
            return invalid(
                "fold_interval",
                "must be at most 1 s (it delays the commit lane)",
            );
        }
        if self.unwatched_append_spacing > Duration::from_secs(60) {
            return invalid(
                "unwatched_append_spacing",
                "must be at most 60 s (the log a new reader finds is that far behind)",
            );
        }
        self.validate_intervals()
    }

    /// The intervals: none zero where zero would poll in a busy loop, none so long that what
    /// waits on it waits too long, each pair in the order the other needs.
    fn validate_intervals(&self) -> Result<()> {
        let invalid = Error::invalid_config;
        if self.maintenance_interval < Duration::from_millis(100)
            || self.maintenance_interval > MAX_MAINTENANCE_INTERVAL
        {
            return invalid(
                "maintenance_interval",
                "must be 100 ms to 24 hours: the partitions made ahead run out if it runs less often",
            );
        }
        if self.gap_poll.is_zero() || self.resync_interval.is_zero() {
            return invalid(
                "gap_poll/resync_interval",
                "must be greater than zero: zero polls the database in a busy loop",
            );
        }
        if self.resync_interval > MAX_RESYNC_INTERVAL {
            return invalid(
                "resync_interval",
                "must be at most 60 s: events from plain-SQL writers and behind a lost wake-up wait for it",
            );
        }
        if self.notify_debounce > MAX_NOTIFY_DEBOUNCE {
            return invalid(
                "notify_debounce",
                "must be at most 1 s: a later wake-up comes after the listeners' idle resync",
            );
        }
        if self.gap_poll > self.resync_interval {
            return invalid(
                "gap_poll/resync_interval",
                "gap_poll must not exceed resync_interval (the poll backs off up to it)",
            );
        }
        if self.gap_fill_timeout <= self.gap_grace {
            return invalid(
                "gap_fill_timeout/gap_grace",
                "gap_fill_timeout must exceed gap_grace: the proof starts after the grace",
            );
        }
        if self.gap_fill_timeout > MAX_GAP_FILL_TIMEOUT {
            return invalid(
                "gap_fill_timeout",
                "must be at most 24 hours: a hole held longer is an incident to end by hand (`ordo status` names its transaction)",
            );
        }
        self.validate_channel()
    }

    /// The wake-up channel: a name PostgreSQL takes, not the latest values' own.
    fn validate_channel(&self) -> Result<()> {
        let invalid = Error::invalid_config;
        let channel_ok = !self.notify_channel.is_empty()
            && self.notify_channel.len() < 64
            && self
                .notify_channel
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !channel_ok {
            return invalid(
                "notify_channel",
                "must be 1 to 63 ASCII letters, digits or underscores",
            );
        }
        if self.notify_channel == crate::schema::LATEST_CHANNEL {
            return invalid(
                "notify_channel",
                "ordo_latest is the latest values' channel; wake-ups need one of their own",
            );
        }
        Ok(())
    }
}
