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

/// One of ordo's three roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RoleKind {
    /// An application: publishes, and runs an [`Outbox`](crate::Outbox) with its insert lane,
    /// sequencer and subscriptions. May insert only `id`, `payload` and `headers` into
    /// `ordo.events` (never `sequence` or `commit_xid`: a forged position or group would
    /// misorder the stream), writes placeholders only through `ordo.fill_placeholders`, appends
    /// to the commit log, and moves subscriptions and dead letters. No DDL: it cannot create
    /// partitions.
    Writer,
    /// Read only: `ordo status`, `ordo tail`, listeners of an outbox with the sequencer off.
    /// Its insert lane waits for a writer to resolve holes (it may not write placeholders).
    Reader,
    /// Partitions and retention (`ordo retention`), subscription administration: a member of
    /// the role that owns ordo's tables, since PostgreSQL lets only a table's owner create its
    /// partitions.
    Operator,
}

impl RoleKind {
    /// `writer`, `reader` or `operator`.
    pub fn as_str(self) -> &'static str {
        match self {
            RoleKind::Writer => "writer",
            RoleKind::Reader => "reader",
            RoleKind::Operator => "operator",
        }
    }

    fn statement(self) -> &'static str {
        match self {
            RoleKind::Writer => "SELECT ordo.grant_writer($1)",
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
/// let grants = Grants::writer("app").and(Grants::reader("dashboard"));
/// assert_eq!(grants.roles().count(), 2);
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
/// Grants add privileges: a role keeps what it was granted before, except that a writer loses
/// table-level `INSERT`, `UPDATE`, `DELETE` and `TRUNCATE` on `ordo.events` and `UPDATE` on
/// its sequence (column privileges restrict nothing while those stand). The equivalent SQL is
/// `SELECT ordo.grant_writer('role')` (and `grant_reader`, `grant_operator`);
/// `docs/operations.md` lists the statements each runs.
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
