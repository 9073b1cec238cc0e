//! Least-privilege roles: what an application, a dashboard and an operator each need, granted
//! by [`grant`].
//!
//! The grants themselves live in SQL, in one place: the functions `ordo.grant_writer`,
//! `ordo.grant_reader` and `ordo.grant_operator` (migration `20261130000200_roles`), so plain
//! SQL (`SELECT ordo.grant_writer('app')`) does exactly what this API and `ordo grant` do. Role
//! names travel as bound parameters and are quoted there with `format('%I')`; none is ever
//! spliced into a statement here.

use sqlx::PgPool;
use sqlx::postgres::PgDatabaseError;

use crate::error::{Error, Result};

/// One of ordo's roles: what each part of a deployment needs, and no more.
///
/// | role | publish | resolve holes, fold | own subscriptions, relays, inboxes | read | partitions, retention, admin |
/// |---|---|---|---|---|---|
/// | [`Publisher`](RoleKind::Publisher) | yes | | | yes | |
/// | [`Sequencer`](RoleKind::Sequencer) | | yes | | yes | |
/// | [`Consumer`](RoleKind::Consumer) | | yes | yes | yes | |
/// | [`Writer`](RoleKind::Writer) | yes | yes | yes | yes | |
/// | [`Reader`](RoleKind::Reader) | | | | yes | |
/// | [`Operator`](RoleKind::Operator) | yes | yes | every row | yes | yes |
///
/// No role but the operator writes ordo's shared state directly where a forged write would
/// break another consumer's guarantees: placeholders and commit-log appends go through
/// functions that verify them against `ordo.events` (`ordo.fill_placeholders`,
/// `ordo.append_commit_log`), and row security keeps each role to the subscriptions and relays
/// it runs (`ordo.subscriptions.role`: the role that created the row), with their progress,
/// dead letters and attempt history. `docs/operations.md` lists what each grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RoleKind {
    /// An application that publishes and runs an [`Outbox`](crate::Outbox) with its lanes,
    /// sequencer and subscriptions: a [`Publisher`](RoleKind::Publisher) and a
    /// [`Consumer`](RoleKind::Consumer) in one.
    Writer,
    /// Publishes only. May insert only `id`, `payload`, `headers` and `event_type` into
    /// `ordo.events` (never `sequence` or `commit_xid`: a forged position or group would
    /// misorder the stream) and latest values through `ordo.publish_latest`. Its
    /// [`Outbox`](crate::Outbox) runs with the sequencer off
    /// ([`OutboxConfig::sequencer`](crate::OutboxConfig::sequencer)); its insert lane waits
    /// for another role to resolve holes.
    Publisher,
    /// A folding process (`ordo fold`, or an [`Outbox`](crate::Outbox) that only runs its
    /// sequencer): writes placeholders through `ordo.fill_placeholders` and appends to the
    /// commit log through `ordo.append_commit_log`, which verify what they write. No direct
    /// write on `ordo.commit_chunks` or `ordo.sequencer_state`.
    Sequencer,
    /// Runs subscriptions, relays and inboxes, and folds (an Outbox runs a sequencer by
    /// default): a [`Sequencer`](RoleKind::Sequencer) that may also write its **own** rows of
    /// `ordo.subscriptions` (the ones it created), their progress, dead letters and attempts,
    /// and the inbox. It cannot move another role's subscription, nor run a relay on a
    /// subscription's row.
    Consumer,
    /// Read only: `ordo status`, `ordo tail`, listeners of an outbox with the sequencer off.
    /// Its insert lane waits for a writer to resolve holes (it may not write placeholders).
    Reader,
    /// Partitions and retention (`ordo retention`), subscription administration: a member of
    /// the role that owns ordo's tables, since PostgreSQL lets only a table's owner create its
    /// partitions. Row security does not restrict it (it acts as the owner).
    Operator,
}

impl RoleKind {
    /// `writer`, `publisher`, `sequencer`, `consumer`, `reader` or `operator`.
    pub fn as_str(self) -> &'static str {
        match self {
            RoleKind::Writer => "writer",
            RoleKind::Publisher => "publisher",
            RoleKind::Sequencer => "sequencer",
            RoleKind::Consumer => "consumer",
            RoleKind::Reader => "reader",
            RoleKind::Operator => "operator",
        }
    }

    fn statement(self) -> &'static str {
        match self {
            RoleKind::Writer => "SELECT ordo.grant_writer($1)",
            RoleKind::Publisher => "SELECT ordo.grant_publisher($1)",
            RoleKind::Sequencer => "SELECT ordo.grant_sequencer($1)",
            RoleKind::Consumer => "SELECT ordo.grant_consumer($1)",
            RoleKind::Reader => "SELECT ordo.grant_reader($1)",
            RoleKind::Operator => "SELECT ordo.grant_operator($1)",
        }
    }
}

/// The grants [`grant`] makes: roles and what each may do.
///
/// ```
/// use ordo::Grants;
///
/// let grants = Grants::publisher("web")
///     .and(Grants::consumer("worker"))
///     .and(Grants::reader("dashboard"));
/// assert_eq!(grants.roles().count(), 3);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    roles: Vec<(RoleKind, String)>,
}

impl Grants {
    /// Makes `role` an ordo writer (see [`RoleKind::Writer`]).
    pub fn writer(role: impl Into<String>) -> Self {
        Self::role(RoleKind::Writer, role)
    }

    /// Makes `role` an ordo publisher (see [`RoleKind::Publisher`]).
    pub fn publisher(role: impl Into<String>) -> Self {
        Self::role(RoleKind::Publisher, role)
    }

    /// Makes `role` an ordo sequencer (see [`RoleKind::Sequencer`]).
    pub fn sequencer(role: impl Into<String>) -> Self {
        Self::role(RoleKind::Sequencer, role)
    }

    /// Makes `role` an ordo consumer (see [`RoleKind::Consumer`]).
    pub fn consumer(role: impl Into<String>) -> Self {
        Self::role(RoleKind::Consumer, role)
    }

    /// Makes `role` an ordo reader (see [`RoleKind::Reader`]).
    pub fn reader(role: impl Into<String>) -> Self {
        Self::role(RoleKind::Reader, role)
    }

    /// Makes `role` an ordo operator (see [`RoleKind::Operator`]).
    pub fn operator(role: impl Into<String>) -> Self {
        Self::role(RoleKind::Operator, role)
    }

    /// Makes `role` an ordo `kind`.
    pub fn role(kind: RoleKind, role: impl Into<String>) -> Self {
        Self {
            roles: vec![(kind, role.into())],
        }
    }

    /// These grants and `other`'s, made in this order.
    pub fn and(mut self, other: Grants) -> Self {
        self.roles.extend(other.roles);
        self
    }

    /// The roles and what each is made, in the order they are granted.
    pub fn roles(&self) -> impl Iterator<Item = (RoleKind, &str)> {
        self.roles.iter().map(|(kind, role)| (*kind, role.as_str()))
    }
}

/// Grants each role of `grants` what its kind needs on the `ordo` schema, in one transaction
/// (all or nothing). Idempotent: run it again after every [`migrate`](crate::migrate), since
/// a new migration may add tables a role needs. Run it as a role that may grant on ordo's
/// objects (their owner or a superuser) and, for an operator, grant membership in the owner
/// (a superuser, or a role with `CREATEROLE` or with the owner's admin option).
///
/// Grants add privileges: a role keeps what it was granted before, except that a writer or
/// publisher loses table-level `INSERT`, `UPDATE`, `DELETE` and `TRUNCATE` on `ordo.events`
/// and `UPDATE` on its sequence (column privileges restrict nothing while those stand), and a
/// writer, consumer or sequencer loses every direct write on `ordo.commit_chunks` and
/// `ordo.sequencer_state` (it appends through `ordo.append_commit_log`). The equivalent SQL is
/// `SELECT ordo.grant_writer('role')` (and `grant_publisher`, `grant_sequencer`,
/// `grant_consumer`, `grant_reader`, `grant_operator`); `docs/operations.md` lists the
/// statements each runs.
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> ordo::Result<()> {
/// use ordo::Grants;
///
/// ordo::admin::grant(&pool, &Grants::writer("app").and(Grants::reader("dashboard"))).await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::Grant`] when a role does not exist, is a superuser or the owner of ordo's tables
/// (as a writer or a reader: privileges cannot restrict it), or when an operator is asked for
/// while the owner is a superuser (membership would make the operator one); nothing is granted
/// then. [`Error::Database`] when the caller may not grant (or the schema is not migrated).
pub async fn grant(pool: &PgPool, grants: &Grants) -> Result<()> {
    let mut tx = pool.begin().await?;
    for (kind, role) in grants.roles() {
        sqlx::query(kind.statement())
            .bind(role)
            .execute(&mut *tx)
            .await
            .map_err(|error| refused(error, kind, role))?;
    }
    tx.commit().await?;
    Ok(())
}

/// `undefined_object` and `invalid_grant_operation`, raised by the grant functions with a hint.
const REFUSALS: [&str; 2] = ["42704", "0LP01"];

fn refused(error: sqlx::Error, kind: RoleKind, role: &str) -> Error {
    let Some(database) = error
        .as_database_error()
        .and_then(|e| e.try_downcast_ref::<PgDatabaseError>())
    else {
        return Error::Database(error);
    };
    if !REFUSALS.contains(&database.code()) {
        return Error::Database(error);
    }
    let reason = match database.hint() {
        Some(hint) => format!("{} ({hint})", database.message()),
        None => database.message().to_owned(),
    };
    Error::Grant {
        role: role.to_owned(),
        kind: kind.as_str(),
        reason,
    }
}
