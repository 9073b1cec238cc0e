//! The commit-ordered lane, one module per behaviour: the sequencer's fold under concurrent
//! sequencers, kills and restarts; promised positions handed to listeners before the append;
//! peers announcing appends; gathering appends while nobody watches; waits for a writer's own
//! positions; and a server that restarts or fails over to its standby mid-stream.
//!
//! The fold tests that read a process-wide metrics recorder are test binaries of their own
//! (`tests/fold_peers.rs`, `tests/fold_turns.rs`, `tests/wakeups.rs`), and so is
//! `tests/rewinds.rs` (a database that goes back in time; a global recorder and subscriber).

#[path = "../common/mod.rs"]
mod common;

mod announce;
mod early_commit;
mod failover;
mod fold;
mod server_restart;
mod unwatched;
mod waits;
