//! Durable subscriptions, one module per behaviour: exactly-once effects across failures on
//! both lanes; keyed subscriptions, their recovery, and stuck keys' backlogs (also from the
//! command line); what a handler learns from its delivery; shutdown; and the operator's side
//! (takeovers, resets, dead letters).
//!
//! Listener streams across a restarting server read a process-wide metrics recorder and are a
//! test binary of their own: `tests/streams.rs`.

#[path = "../common/mod.rs"]
mod common;

mod durable;
mod handler_context;
mod key_backlog_kills;
mod key_backlogs;
mod key_backlogs_cli;
mod keyed;
mod keyed_cli;
mod keyed_recovery;
mod operator;
mod shutdown;
