//! Connection poolers in front of PostgreSQL: telling a transaction-mode pooler apart from a
//! server session, and what may run through one.
//!
//! A transaction-mode pooler (PgBouncer's `pool_mode = transaction`, the default of many managed
//! services) gives a client connection a server connection for one transaction at a time. What
//! lives in a session does not survive from one transaction to the next: `LISTEN`, session
//! settings (the sequencer's `enable_seqscan = off`), session advisory locks (the migrator's),
//! and named prepared statements, which is how sqlx sends every statement with parameters. So
//! ordo's background parts need a session of their own; an application's publishing
//! transactions may go through the pooler if their statements are unnamed (inside a
//! transaction, the server connection stays the same from `BEGIN` to `COMMIT`).
//!
//! [`probe`] finds out with simple-protocol statements only, which any pooler passes: a
//! session setting made on one connection is looked for on a second connection inside a
//! transaction (a pooler hands it the server connection the first one just released) and then
//! again on the first (a pooler gives it another server connection while the second holds that
//! one). Seeing the setting where it was not made, or not seeing it where it was, proves that
//! sessions are not kept. A session pooler and a direct connection keep it in both looks.

use std::time::Duration;

use sqlx::{Connection, PgConnection, PgPool};

use crate::error::{Error, Result};

/// How many times [`probe`] looks. Each look proves a transaction pooler unless other clients
/// take the released server connection between its statements; three looks make that
/// vanishingly rare on a start.
const LOOKS: usize = 3;

/// How long [`probe`]'s first connection may wait for its own session's answer while the
/// second holds a transaction. A session of its own answers in a round trip; only a pooler
/// with no server connection free makes it wait.
const OWN_SESSION_PATIENCE: Duration = Duration::from_secs(3);

/// Clears the custom setting [`probe`] sets in a session and looks for.
const RESET: &str = "RESET ordo.pooler_probe";

/// Reads that setting (empty or NULL where this session never set it).
const READ: &str = "SELECT current_setting('ordo.pooler_probe', true)";

/// Whether a pool's connections keep their server session between transactions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sessions {
    /// A direct connection, or a session-mode pooler: everything works.
    Kept,
    /// A transaction-mode (or statement-mode) pooler: each transaction may run on another
    /// server connection.
    PerTransaction,
}

/// What one of [`probe`]'s looks saw.
enum Look {
    /// The session kept its setting, and no other session had it.
    Kept,
    /// Another session had it, or this one lost it: a pooler's server connections.
    Shared,
    /// The first connection waited for a server connection: a pooler's, then. It is left
    /// mid-statement and must not be reused.
    Waited,
}

/// How a publishing transaction sends its statements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Statements {
    /// Named prepared statements, parsed once per connection (the fast path).
    Named,
    /// Unnamed statements, parsed each time: what a transaction-mode pooler allows.
    Unnamed,
}

impl Statements {
    /// What sqlx's `Query::persistent` takes.
    pub(crate) fn persistent(self) -> bool {
        self == Statements::Named
    }
}

/// Finds out whether `pool`'s connections keep their server session between transactions.
/// Holds one of its connections for a few round trips, and opens a second connection with its
/// options (not from the pool, which may have no second one free), closed at the end.
///
/// # Errors
/// [`Error::Database`] if a connection cannot be had or a statement fails.
pub(crate) async fn probe(pool: &PgPool) -> Result<Sessions> {
    let mut first = pool.acquire().await?;
    let mut second = PgConnection::connect_with(pool.connect_options().as_ref()).await?;
    let mut sessions = Sessions::Kept;
    for _ in 0..LOOKS {
        match look_once(&mut first, &mut second).await? {
            Look::Kept => {}
            Look::Shared => {
                sessions = Sessions::PerTransaction;
                break;
            }
            Look::Waited => {
                first.close_on_drop();
                sessions = Sessions::PerTransaction;
                break;
            }
        }
    }
    if sessions == Sessions::Kept {
        // Leave the application's connection as it was.
        sqlx::raw_sql(RESET).execute(&mut *first).await?;
    }
    // Best effort: the server ends the session anyway when the socket closes.
    let _ = second.close().await;
    Ok(sessions)
}

/// One look: set a token in `first`'s session, look for it from `second` inside a
/// transaction, then from `first` again while that transaction holds its server connection.
/// A session of its own answers `first` at once; a pooler with no server connection left for
/// it makes it wait, which is as telling as another session's answer.
async fn look_once(first: &mut PgConnection, second: &mut PgConnection) -> Result<Look> {
    // Hexadecimal digits only: safe to put in the statement's text.
    let token = uuid::Uuid::new_v4().simple().to_string();
    let set = format!("SELECT set_config('ordo.pooler_probe', '{token}', false)");
    sqlx::raw_sql(sqlx::AssertSqlSafe(set))
        .execute(&mut *first)
        .await?;
    let mut held = second.begin().await?;
    let seen_elsewhere = setting(&mut held).await?;
    if seen_elsewhere.as_deref() == Some(token.as_str()) {
        held.rollback().await?;
        return Ok(Look::Shared);
    }
    let seen_here = tokio::time::timeout(OWN_SESSION_PATIENCE, setting(first)).await;
    held.rollback().await?;
    let Ok(seen_here) = seen_here else {
        return Ok(Look::Waited);
    };
    Ok(if seen_here?.as_deref() == Some(token.as_str()) {
        Look::Kept
    } else {
        Look::Shared
    })
}

/// The probe's setting as this connection's server session has it, by the simple protocol.
async fn setting(conn: &mut PgConnection) -> Result<Option<String>> {
    use sqlx::Row;
    let mut rows = sqlx::raw_sql(READ).fetch_all(conn).await?;
    Ok(match rows.pop() {
        Some(row) => row
            .try_get::<Option<String>, _>(0)?
            .filter(|v| !v.is_empty()),
        None => None,
    })
}

/// Refuses a pool that reaches PostgreSQL through a transaction-mode pooler for `part`,
/// which needs a session; `fix` says where a session comes from.
pub(crate) async fn require_sessions(
    pool: &PgPool,
    part: &'static str,
    fix: &'static str,
) -> Result<()> {
    match probe(pool).await? {
        Sessions::Kept => Ok(()),
        Sessions::PerTransaction => Err(Error::TransactionPooler { part, fix }),
    }
}

/// Whether `pool`'s connections keep their server session from one transaction to the next:
/// `false` when they go through a transaction-mode pooler (PgBouncer's
/// `pool_mode = transaction`), where `LISTEN`, session settings, advisory locks and sqlx's
/// named prepared statements cannot work. Every part of ordo that needs a session checks this
/// when it starts and refuses with [`Error::TransactionPooler`]; call it to check a pool of
/// your own the same way. It holds one of the pool's connections and one more of its own for a
/// few round trips, and sends only simple-protocol statements, which any pooler passes.
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> ordo::Result<()> {
/// if !ordo::admin::keeps_sessions(&pool).await? {
///     eprintln!("this pool goes through a transaction-mode pooler");
/// }
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::Database`] if a connection cannot be had or a statement fails.
pub async fn keeps_sessions(pool: &PgPool) -> Result<bool> {
    Ok(probe(pool).await? == Sessions::Kept)
}
