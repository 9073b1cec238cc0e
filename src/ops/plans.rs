//! The statements ordo runs on its hot paths, with sample arguments, for `tests/ops/plans.rs`.
//!
//! A stock PostgreSQL JIT-compiles any plan whose cost estimate crosses `jit_above_cost`
//! (100,000 by default), and compiling takes hundreds of milliseconds: measured 316 ms to
//! 1 s for the sequencer's old restart statement, which executes in well under one. Estimates
//! are at their worst on a fresh database (tables with no statistics, partitions the planner
//! cannot prune from a generic plan), so the test plans every statement gathered here there,
//! both as a custom and as a generic plan, and fails if any would be compiled. Each part
//! declares its hot statements beside their SQL, in the `HOT_PATH` of the file that holds them;
//! a statement added to a hot path belongs in that list, and a new file's list in
//! [`PARTS`].

use crate::telemetry::HotStatement;

/// Every file's hot-path statements, along the path of an event: writes, both lanes,
/// subscriptions and relays, status, latest values, the inbox.
const PARTS: &[&[HotStatement]] = &[
    crate::write::sql::HOT_PATH,
    crate::insert_lane::rows::HOT_PATH,
    crate::insert_lane::heads::HOT_PATH,
    crate::insert_lane::resolve::HOT_PATH,
    crate::commit_lane::sql::HOT_PATH,
    crate::consumer::sql::HOT_PATH,
    crate::consumer::progress::HOT_PATH,
    crate::consumer::reused_ids::HOT_PATH,
    crate::subscription::sql::HOT_PATH,
    crate::relay::marks::HOT_PATH,
    crate::relay::histories::HOT_PATH,
    crate::relay::chain::HOT_PATH,
    crate::relay::attempts::HOT_PATH,
    crate::ops::sql::HOT_PATH,
    crate::ops::secrets::HOT_PATH,
    crate::latest::sql::HOT_PATH,
    crate::inbox::HOT_PATH,
];

/// Every statement on ordo's hot paths (writes, both lanes, subscriptions, status).
#[doc(hidden)]
pub fn hot_path_statements() -> Vec<HotStatement> {
    PARTS.iter().flat_map(|part| part.iter().copied()).collect()
}
