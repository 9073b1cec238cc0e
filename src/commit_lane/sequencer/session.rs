//! The sequencer's own connections, and the session settings they run with.

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// The session settings of the sequencer's own connections (they touch nothing else).
///
/// - `synchronous_commit = off`: an append is a pure function of durable data (committed
///   events, the state row), so losing the last appends in a server crash only means folding
///   them again, identically; and anything durable that depends on an append (a
///   subscription's checkpoint) commits after it, so its WAL flush carries the append's commit
///   record too. What it saves is a WAL flush per append, which with one writer was a second
///   flushed transaction per published one.
/// - `jit = off`: no statement of the fold runs long enough to gain from it, and a stock server
///   compiles any plan whose estimate crosses `jit_above_cost`, for hundreds of milliseconds
///   (the statements are also shaped to stay under it, see `sql.rs`).
/// - `enable_seqscan = off`: every statement of the fold reads by index, and a sequential scan
///   of a growing table is never the right plan; but the planner picks one for a generic plan
///   made while a partition of `ordo.events` was small (its first autovacuum ANALYZE, at a few
///   hundred rows, on a fresh database or a partition that has just started to fill), and keeps
///   it until the next ANALYZE, up to a minute later. Each append then read the whole
///   partition: 13 to 198 ms per append (65,751 rows read), the fold up to 12,000 events
///   behind eight writers (`tests/ops/plans.rs` checks the plans).
pub(crate) const SESSION: &[(&str, &str)] = &[
    ("synchronous_commit", "off"),
    ("jit", "off"),
    ("enable_seqscan", "off"),
];

/// [`SESSION`] as the statements a new connection runs (a test checks they agree).
const SET_SESSION: &str = "SET synchronous_commit = off; SET jit = off; SET enable_seqscan = off";

/// A pool of two connections to `pool`'s server, each running [`SESSION`]'s settings.
pub(super) fn own_pool(pool: &PgPool) -> PgPool {
    // Set by statements once connected, not as startup `options`: PgBouncer refuses a
    // connection whose startup packet carries them (`unsupported startup parameter`).
    PgPoolOptions::new()
        .max_connections(2)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::raw_sql(SET_SESSION).execute(conn).await?;
                Ok(())
            })
        })
        .connect_lazy_with(pool.connect_options().as_ref().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statements_a_connection_runs_set_every_session_setting() {
        let statements: Vec<String> = SESSION
            .iter()
            .map(|(name, value)| format!("SET {name} = {value}"))
            .collect();
        assert_eq!(SET_SESSION, statements.join("; "));
    }
}
