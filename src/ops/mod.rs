//! Operations: see and steer a running outbox.

pub mod metrics;
pub(crate) mod render;
mod sql;
pub(crate) mod status;
pub mod trace;
