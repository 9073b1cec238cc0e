//! The write side and the insert-ordered lane, one module per behaviour: a connection lost
//! around `COMMIT` and very large transactions; every committed event once and in order; the
//! abandonment proof for rolled-back sequences; positions as `bigint`; event types; and latest
//! values (their streams, their LISTEN connection, their privileges).

#[path = "../common/mod.rs"]
mod common;

mod event_types;
mod faults;
mod hole_proof;
mod insert_lane;
mod latest;
mod latest_listen;
mod latest_roles;
mod positions;
