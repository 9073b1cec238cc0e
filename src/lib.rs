//! placeholder docs
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod commit_lane;
mod config;
mod envelope;
mod error;
mod insert_lane;
mod migrate;
mod position;
mod task;
mod write;

pub use commit_lane::listener::CommitStream;
pub use config::OutboxConfig;
pub use envelope::{CommitOrderedEnvelope, Envelope, Headers};
pub use error::{Error, Result};
pub use insert_lane::listener::EventStream;
pub use migrate::{MIGRATIONS_TABLE, migrate, migrator};
pub use position::{CommitSequence, EventSequence, Start};
pub use write::outbox::Outbox;
pub use write::transaction::OutboxTransaction;
