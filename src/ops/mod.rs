//! Operations: see and steer a running outbox.

pub(crate) mod render;
mod sql;
pub(crate) mod status;
