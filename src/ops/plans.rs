//! The statements ordo runs on its hot paths, with sample arguments, for `tests/plans.rs`.
//!
//! A stock PostgreSQL JIT-compiles any plan whose cost estimate crosses `jit_above_cost`
//! (100,000 by default), and compiling takes hundreds of milliseconds: measured 316 ms to
//! 1 s for the sequencer's old restart statement, which executes in well under one. Estimates
//! are at their worst on a fresh database (tables with no statistics, partitions the planner
//! cannot prune from a generic plan), so the test plans every statement listed here there,
//! both as a custom and as a generic plan, and fails if any would be compiled. A statement
//! added to a hot path belongs in this list.

use crate::commit_lane::sql as commit;
use crate::consumer::progress as keyed;
use crate::consumer::reused_ids;
use crate::consumer::sql as sub;
use crate::insert_lane::{heads, resolve, rows};
use crate::latest::sql as latest;
use crate::ops::secrets;
use crate::ops::sql as ops;
use crate::relay::{attempts, chain, histories, marks};
use crate::subscription::sql as serial;
use crate::telemetry::HotStatement;
use crate::write::sql as write;

/// Every statement on ordo's hot paths (writes, both lanes, subscriptions, status).
#[doc(hidden)]
pub fn hot_path_statements() -> Vec<HotStatement> {
    HOT_PATH
        .iter()
        .chain(crate::inbox::HOT_PATH)
        .copied()
        .collect()
}

const fn s(
    name: &'static str,
    sql: &'static str,
    types: &'static str,
    args: &'static str,
) -> HotStatement {
    HotStatement {
        name,
        sql,
        types,
        args,
        session: &[],
    }
}

/// A statement the sequencer runs, on its own connections.
const fn on_sequencer(statement: HotStatement) -> HotStatement {
    HotStatement {
        session: crate::commit_lane::sequencer::SESSION,
        ..statement
    }
}

const HOT_PATH: &[HotStatement] = &[
    s(
        "write: insert events",
        write::INSERT_EVENTS,
        "uuid[], text[], text[], text[]",
        "ARRAY['0190c9d2-0000-7000-8000-000000000001']::uuid[], ARRAY['{}']::text[], ARRAY['{}']::text[], ARRAY['Placed']::text[]",
    ),
    s(
        "write: insert one event",
        write::INSERT_EVENT,
        "uuid, text, text, text",
        "'0190c9d2-0000-7000-8000-000000000001', '{}', '{}', 'Placed'",
    ),
    s(
        "insert lane: page",
        rows::PAGE_FULL,
        "bigint, bigint, bigint",
        "0, 512, 512",
    ),
    s(
        "insert lane: page without payloads",
        rows::PAGE_META,
        "bigint, bigint, bigint",
        "0, 512, 512",
    ),
    s(
        "insert lane: fetch",
        rows::FETCH,
        "bigint[], bigint, bigint",
        "ARRAY[5]::bigint[], 10, 512",
    ),
    s("insert lane: sequence head", heads::HEAD, "", ""),
    s(
        "insert lane: contiguous end",
        heads::CONTIGUOUS_END,
        "bigint",
        "0",
    ),
    s("insert lane: resolved floor", heads::RESOLVED_FLOOR, "", ""),
    s("insert lane: retention floors", rows::FLOORS, "", ""),
    s("insert lane: sequence drawers", resolve::DRAWERS, "", ""),
    s(
        "insert lane: abandonment proof",
        resolve::DRAWERS_ENDED,
        "text[], text[], bool",
        "ARRAY['3/7']::text[], ARRAY['1234']::text[], false",
    ),
    s(
        "insert lane: placeholders",
        resolve::FILL,
        "bigint, bigint",
        "5, 9",
    ),
    on_sequencer(s("commit lane: restart", commit::RESTART, "", "")),
    on_sequencer(s(
        "commit lane: catch up",
        commit::CATCH_UP,
        "bigint, bigint",
        "0, 8192",
    )),
    on_sequencer(s(
        "commit lane: append",
        commit::APPEND,
        "bigint, bigint",
        "0, 0",
    )),
    s("commit lane: head", commit::HEAD, "", ""),
    s(
        "commit lane: head, cursor and history",
        commit::HEAD_AND_CURSOR,
        "",
        "",
    ),
    s(
        "commit lane: positions gone back",
        commit::GONE_BACK,
        "bigint[], bigint[], bigint, bigint",
        "ARRAY[9, 10]::bigint[], ARRAY[40, 41]::bigint[], 8, 10",
    ),
    s(
        "commit lane: page",
        commit::PAGE,
        "bigint, bigint, bigint",
        "0, 512, 512",
    ),
    s(
        "commit lane: retention trim",
        commit::TRIM,
        "bigint",
        "1000001",
    ),
    s(
        "subscription: create",
        sub::CREATE,
        "text, text, bigint, text",
        "'s', 'commit', 0, 'subscription'",
    ),
    s(
        "subscription: adopt",
        sub::ADOPT,
        "text, text",
        "'s', 'subscription'",
    ),
    s("subscription: identity", sub::IDENTITY, "text", "'s'"),
    s(
        "subscription: claim",
        sub::CLAIM,
        "text, uuid, bigint",
        LEASE_ARGS,
    ),
    s(
        "subscription: renew",
        sub::RENEW,
        "text, uuid, bigint",
        LEASE_ARGS,
    ),
    s(
        "subscription: checkpoint",
        serial::CHECKPOINT,
        "text, uuid, bigint, bigint, bigint",
        "'s', '0190c9d2-0000-7000-8000-000000000001'::uuid, 10, 9, 30000",
    ),
    s(
        "keyed subscription: load progress",
        keyed::LOAD,
        "text, bigint",
        "'s', 0",
    ),
    s(
        "keyed subscription: completion",
        keyed::COMPLETE,
        "text, uuid, bigint",
        "'s', '0190c9d2-0000-7000-8000-000000000001'::uuid, 10",
    ),
    s(
        "keyed subscription: failed attempt",
        keyed::FAILED,
        "text, uuid, bigint, text, integer, text[], text",
        "'s', '0190c9d2-0000-7000-8000-000000000001'::uuid, 10, 'failing', 1, ARRAY['k'], 'boom'",
    ),
    s(
        "keyed subscription: watermark",
        keyed::FLUSH,
        "text, uuid, bigint, bigint, float8",
        "'s', '0190c9d2-0000-7000-8000-000000000001'::uuid, 10, 9, 30000",
    ),
    s(
        "relay: delivered marks",
        marks::DELIVERED,
        "text, uuid, bigint[]",
        "'s', '0190c9d2-0000-7000-8000-000000000001'::uuid, ARRAY[10, 11, 12]::bigint[]",
    ),
    s("relay: server histories", histories::HISTORIES, "", ""),
    s(
        "relay: watermark and route chains",
        chain::FLUSH_ROUTES,
        "text, uuid, bigint, bigint, float8, text[], bigint[]",
        "'s', '0190c9d2-0000-7000-8000-000000000001'::uuid, 10, 9, 30000, ARRAY['a'], ARRAY[10]::bigint[]",
    ),
    s(
        "relay: ids reused by a read",
        reused_ids::REUSED,
        "uuid[], bigint[]",
        "ARRAY['0190c9d2-0000-7000-8000-000000000001']::uuid[], ARRAY[10]::bigint[]",
    ),
    // On the failure path only, but once per failed attempt of a relay that may fail often.
    s(
        "relay: failed attempt's history",
        attempts::RECORD,
        "text, bigint, bigint, integer, text, boolean, text, integer, uuid, integer",
        "'s', 10, 10, 1, 'boom', false, 'host', 1, '0190c9d2-0000-7000-8000-000000000001'::uuid, 20",
    ),
    // Its inner statements run with `jit = off` (a setting of the function, checked by
    // tests/relay_secrets.rs): EXPLAIN does not see inside a function.
    s(
        "maintenance: scrub secrets",
        secrets::SCRUB,
        "bigint, boolean",
        "1000, false",
    ),
    s(
        "keyed subscription: take retries",
        keyed::TAKE_RETRIES,
        "text, uuid",
        "'s', '0190c9d2-0000-7000-8000-000000000001'::uuid",
    ),
    s(
        "subscription: failed attempt",
        serial::FAILED,
        "text, uuid, integer, text, bigint",
        "'s', '0190c9d2-0000-7000-8000-000000000001'::uuid, 1, 'boom', 30000",
    ),
    s(
        "subscription: dead letter",
        serial::DEAD_LETTER,
        "text, text, bigint, bigint, text, integer",
        "'s', 'commit', 9, 9, 'boom', 3",
    ),
    s(
        "subscription: release",
        sub::RELEASE,
        "text, uuid",
        "'s', '0190c9d2-0000-7000-8000-000000000001'::uuid",
    ),
    s("status: positions", ops::POSITIONS, "", ""),
    s(
        "status: insert lag",
        ops::INSERT_LAG,
        "bigint, boolean",
        "0, false",
    ),
    s(
        "status: commit lag",
        ops::COMMIT_LAG,
        "bigint, bigint, boolean",
        "0, 100, false",
    ),
    s(
        "status: subscriptions",
        ops::SUBSCRIPTIONS,
        "bigint, bigint, boolean",
        "100, 100, false",
    ),
    s(
        "latest values: publish",
        latest::PUBLISH,
        "text, text, text",
        "'fx.rate', '{\"micros\": 1}', '{}'",
    ),
    s(
        "latest values: read",
        latest::READ,
        "text[]",
        "ARRAY['fx.rate', 'flags']::text[]",
    ),
];

/// Claim and renew take the same arguments.
const LEASE_ARGS: &str = "'s', '0190c9d2-0000-7000-8000-000000000001'::uuid, 30000";
