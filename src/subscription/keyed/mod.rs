//! Keyed subscriptions: order per key, concurrency across keys, no head-of-line blocking.
//!
//! The schedule, its progress and its timers are the consumer core's (`consumer/lanes.rs`,
//! `schedule.rs`, `progress.rs`), shared with relays; this is the executor on it:
//!
//! - `runner.rs`: the keyed runner, driving handler tasks (`task.rs`) from the schedule;
//!   `timers.rs`: its periodic work (watermark, retries, status); `dead_letters.rs`:
//!   operators' retries of its dead letters, made by a task of their own.

mod dead_letters;
pub(crate) mod runner;
mod task;
mod timers;
