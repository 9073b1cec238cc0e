//! A hot-path statement as a part declares it beside its SQL, for `ops::plans` (which lists
//! them all) and `tests/ops/plans.rs` (which fails if PostgreSQL would JIT-compile any).

/// One hot-path statement: a name for the failure message, its text, its parameter types (as
/// `PREPARE name(types)` takes them) and SQL literals for its parameters (`EXECUTE name(args)`).
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct HotStatement {
    /// Where it runs.
    pub name: &'static str,
    /// The statement.
    pub sql: &'static str,
    /// Its parameter types, comma-separated.
    pub types: &'static str,
    /// Its parameters as SQL literals, comma-separated.
    pub args: &'static str,
    /// The session settings of the connections it runs on, where ordo sets any (its
    /// sequencer's own pool); empty for the application's pool.
    pub session: &'static [(&'static str, &'static str)],
}
