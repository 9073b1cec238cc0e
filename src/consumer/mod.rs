//! The consumer core: what a subscription and a relay share, so that each is only an executor
//! on it (a handler in a transaction, a handler task per key, a batch in flight to a sink).
//!
//! - `start.rs`: the row in `ordo.subscriptions` created or checked, the status channel, the
//!   supervised runner; `shutdown.rs`: stopping it within its lease; `handle.rs`: the
//!   [`SubscriptionHandle`] a caller holds.
//! - `claim.rs`: the claim loop, the lease (claim, renewal rule, release) and a failed read's
//!   halt below the retention floor; `tenure.rs`: until when this owner certainly holds the
//!   lease.
//! - `source.rs`: reading the lane (either ordering) from a position, with read-ahead.
//! - `driver.rs`: the one loop of every keyed consumer, an executor's hooks at each step.
//! - `backlog.rs`: stuck keys, whose events leave the window for `ordo.key_backlogs` until a
//!   retry takes them back in order.
//! - `lanes.rs`: the keyed schedule (which buffered events may run), with no I/O; `keys.rs`:
//!   [`Keys`]; `schedule.rs`: one claim's keyed work (the schedule, the stored watermark, its
//!   timers, operators' retries); `progress.rs`: the stored low watermark and completions above
//!   it.
//! - `status.rs`: [`SubscriptionStatus`] and its parts; `stalled.rs`: stalled keys, listed and
//!   retried by operators; `sql.rs`: the row's statements.
//!
//! It imports neither `subscription/` nor `relay/`: both import it.

mod adopt;
pub(crate) mod backlog;
mod claim;
pub(crate) mod driver;
mod handle;
mod keys;
pub(crate) mod lanes;
pub(crate) mod progress;
pub(crate) mod reused_ids;
mod schedule;
mod shutdown;
pub(crate) mod source;
pub(crate) mod sql;
mod stalled;
mod start;
pub(crate) mod status;
pub(crate) mod tenure;

use std::time::Duration;

pub use adopt::adopt_subscription;
pub use backlog::{
    BacklogAction, KeyBacklog, backlog_actions, list_backlog, purge_backlog, skip_stalled_event,
};
pub(crate) use claim::{Consumer, ERROR_BACKOFF, Executor, Flow, ReadFailed, run};
pub use handle::SubscriptionHandle;
pub use keys::{Keys, SERIAL_KEY};
pub(crate) use schedule::Schedule;
pub(crate) use shutdown::Runners;
pub(crate) use stalled::attach_stalled;
pub use stalled::{list_stalled_keys, retry_stalled_keys};
pub(crate) use start::{CurrentLanes, LaneSet, Registration, Shared, start};
pub use status::{
    BacklogSize, DeadLetterCount, RunStatus, SinkDown, StalledKey, SubscriptionState,
    SubscriptionStatus,
};

/// What runs a row of `ordo.subscriptions` (its `kind` column, and the task's name in logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Subscription,
    Relay,
}

impl Kind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Subscription => "subscription",
            Kind::Relay => "relay",
        }
    }
}

/// Where a subscription (or relay) that does not exist yet starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StartFrom {
    /// From the first event of the lane.
    #[default]
    Beginning,
    /// After the lane's current head: only events that come later.
    Now,
}

/// The shortest lease [`JobConfig::lease`](crate::JobConfig::lease) takes: renewals every third of it must still fit
/// round trips to the database.
pub const MIN_LEASE: Duration = Duration::from_millis(100);

/// The longest lease [`JobConfig::lease`](crate::JobConfig::lease) takes: a runner that stopped keeps the subscription
/// from every other runner this long, and a lease is sent to the server in milliseconds
/// (`idle_in_transaction_session_timeout`, at most about 24.8 days).
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);

/// How many events past its low watermark a keyed subscription holds by default (see
/// [`JobConfig::keyed_window`](crate::JobConfig::keyed_window)).
pub const DEFAULT_KEYED_WINDOW: usize = 10_000;
