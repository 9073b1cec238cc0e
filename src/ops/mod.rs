//! Operations: see and steer a running outbox.

pub(crate) mod grants;
pub mod metrics;
pub(crate) mod plans;
pub(crate) mod prometheus;
pub(crate) mod render;
pub(crate) mod retention;
pub(crate) mod sql;
pub(crate) mod status;
pub mod trace;
