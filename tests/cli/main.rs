//! The `ordo` command-line tool run as real processes, one module per behaviour: migrate, tail
//! and fold (one killed with SIGKILL); one grammar across every command; what it writes to a
//! terminal and a pipe; what it says when it cannot do its job; and settings refused at their
//! bounds (through the binary and the library's constructors).
//!
//! Each part's own commands are tested with that part (`tests/relay/cli.rs`,
//! `tests/inbox/cli.rs`, `tests/subscriptions/keyed_cli.rs`, ...).

#[path = "../common/mod.rs"]
mod common;

mod diagnostics;
mod grammar;
mod processes;
mod settings_bounds;
mod terminal;
