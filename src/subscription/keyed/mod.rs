//! Keyed subscriptions: order per key, concurrency across keys, no head-of-line blocking.
//!
//! - `keys.rs`: [`Keys`], what a subscriber orders an event by.
//! - `lanes.rs`: the schedule (which buffered events may run), with no I/O.
//! - `runner.rs`: the keyed runner, driving handler tasks (`task.rs`) from the schedule;
//!   `timers.rs`: its periodic work (watermark, retries, status).
//! - `progress.rs`: the stored low watermark and the completions above it.
//! - `admin.rs`: stalled keys, listed and retried by operators.

pub(crate) mod admin;
pub(crate) mod keys;
pub(crate) mod lanes;
pub(crate) mod progress;
pub(crate) mod runner;
mod task;
mod timers;

pub use admin::{list_stalled_keys, retry_stalled_keys};
pub use keys::{Keys, SERIAL_KEY};
