//! Operations, one module per behaviour: `status` and its warnings, an operator's morning in a
//! shared database, no JIT on the hot paths' plans, least privilege (every forgery tried as
//! every role `ordo grant` makes), ordo behind a real PgBouncer, and the README's
//! `[dependencies]` snippet.
//!
//! The roles' own test binary (`tests/roles.rs`) installs a process-wide log subscriber.

#[path = "../common/mod.rs"]
mod common;

mod front_door;
mod least_privilege;
mod operations;
mod operator_morning;
mod plans;
mod pooler;
mod role_forgeries;
mod status_warnings;
