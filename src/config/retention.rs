//! Retention settings: which partitions an outbox's maintenance (or `ordo retention`) creates
//! ahead and drops behind. What a run does with them is `ops::retention`'s.

use std::time::Duration;

use crate::error::{Error, Result};

/// The most partitions [`RetentionConfig::ahead`] accepts. Each creation is a short step of its
/// own, but every partition also costs every statement on `ordo.events` some planning time, and
/// a few partitions of a sensible size cover hours of writes.
pub const MAX_AHEAD: u32 = 100;

/// The longest [`RetentionConfig::retry_for`]: 1 hour. A step that could not have its locks in
/// an hour waits on a transaction an operator must end (`ordo status` names long ones); a run
/// that kept trying longer would only hide it.
pub const MAX_RETRY_FOR: Duration = Duration::from_secs(3600);

/// Retention settings, with documented defaults.
#[derive(Debug, Clone)]
pub struct RetentionConfig {
    pub(crate) keep: Option<Duration>,
    pub(crate) ahead: u32,
    pub(crate) force: bool,
    pub(crate) retry_for: Duration,
    pub(crate) warn_below: u32,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            keep: None,
            ahead: 2,
            force: false,
            retry_for: Duration::from_secs(30),
            warn_below: 1,
        }
    }
}

impl RetentionConfig {
    /// Only create partitions ahead; drop nothing. The default.
    pub fn new() -> Self {
        Self::default()
    }

    /// Drop partitions sealed longer than `keep` ago (every event in them committed at least
    /// `keep` ago). Default: never drop.
    pub fn keep(mut self, keep: Duration) -> Self {
        self.keep = Some(keep);
        self
    }

    /// How many empty partitions to keep ready above the head: 1 to [`MAX_AHEAD`] (0 counts as
    /// 1; more is refused by [`run_retention`](crate::admin::run_retention) and [`Outbox::new`](crate::Outbox::new)).
    /// Default 2.
    pub fn ahead(mut self, partitions: u32) -> Self {
        self.ahead = partitions.max(1);
        self
    }

    /// Drop even what subscriptions still need (they then halt with
    /// [`Error::BelowRetentionFloor`](crate::Error::BelowRetentionFloor)). Never splits a group, never drops what the lanes and
    /// the sequencer need. Default off.
    pub fn force(mut self, force: bool) -> Self {
        self.force = force;
        self
    }

    /// How long a run keeps trying a step (one partition pair created, folded or dropped) whose
    /// locks it could not have within the step's 100 ms lock timeout (a busy table, a long
    /// transaction), pausing between tries. Past it, the run ends with the lock error; what was
    /// done stays done. Default 30 s; at most [`MAX_RETRY_FOR`] (1 hour; zero tries each step
    /// once).
    pub fn retry_for(mut self, deadline: Duration) -> Self {
        self.retry_for = deadline;
        self
    }

    /// Warn (a `WARN` log from the maintainer, [`RetentionReport::warning`](crate::RetentionReport::warning)) when fewer than
    /// this many range partitions remain wholly above the head. Default 1: the head has
    /// entered the last partition, a whole partition before events would land in the default
    /// partition.
    pub fn warn_below(mut self, partitions: u32) -> Self {
        self.warn_below = partitions;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.ahead > MAX_AHEAD {
            return Err(Error::InvalidConfig {
                setting: "retention ahead",
                reason: format!(
                    "{} partitions ahead is more than the {MAX_AHEAD} allowed: every partition costs \
                     planning time on ordo.events; use larger partitions (ordo.partitioning.partition_size) instead",
                    self.ahead
                ),
            });
        }
        if self.retry_for > MAX_RETRY_FOR {
            return Err(Error::InvalidConfig {
                setting: "retention retry_for",
                reason: format!(
                    "{:?} is longer than the {MAX_RETRY_FOR:?} allowed: a step whose locks stay \
                     busy that long waits on a transaction to end by hand",
                    self.retry_for
                ),
            });
        }
        Ok(())
    }
}
