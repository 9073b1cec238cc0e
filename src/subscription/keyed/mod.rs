//! Keyed subscriptions: order per key, concurrency across keys, no head-of-line blocking.
//!
//! The schedule, its progress, its backlogs, its timers and the loop that drives them are the
//! consumer core's (`consumer/driver.rs`, `lanes.rs`, `schedule.rs`, `backlog.rs`,
//! `progress.rs`), shared with relays; this is the executor on it:
//!
//! - `turn.rs`: the driver's hooks; `runner.rs`: the keyed runner, starting handler tasks
//!   (`task.rs`) from the schedule;
//!   `timers.rs`: its periodic work (watermark, retries, status); `dead_letters.rs`:
//!   operators' retries of its dead letters, made by a task of their own.

mod dead_letters;
pub(crate) mod runner;
mod task;
mod timers;
mod turn;
