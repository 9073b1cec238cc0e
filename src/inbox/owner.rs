//! Which role an inbox consumer name belongs to (`ordo.inbox_consumers`, migration
//! `20261210000500_inbox_consumers.sql`). Row security on `ordo.inbox` and
//! `ordo.inbox_watermarks` lets a role write only the rows of consumers that belong to a role
//! it acts as, so an `Inbox` names its consumer for its role before its first statement, and
//! refuses at once, naming both roles, a name that belongs to another.

use sqlx::PgPool;

use crate::error::{Error, Result};
use crate::pooler::Statements;
use crate::telemetry::printable;

/// Names `$1` for the connected role (the column's default) if no role has it yet. Row
/// security lets a role name only itself.
pub(crate) const CLAIM: &str = r#"
INSERT INTO ordo.inbox_consumers (name) VALUES ($1) ON CONFLICT (name) DO NOTHING
"#;

/// The role `$1` belongs to, the connected role, and whether it may write the consumer's rows:
/// it is that role or inherits its privileges, or bypasses row security (a superuser, a role
/// with BYPASSRLS, the owner of the inbox tables or a member of it). A name without a role
/// (from before the roles were recorded) is writable only by those that bypass it.
pub(crate) const IDENTITY: &str = r#"
SELECT c.role, current_user::text AS connected,
       c.role = current_user::text
       OR EXISTS (SELECT 1 FROM pg_roles AS r
                  WHERE r.rolname::text = c.role AND pg_has_role(current_user, r.oid, 'USAGE'))
       OR EXISTS (SELECT 1 FROM pg_roles AS r
                  WHERE r.rolname = current_user AND (r.rolsuper OR r.rolbypassrls))
       OR pg_has_role(current_user, (SELECT t.relowner FROM pg_class AS t
                                     WHERE t.oid = 'ordo.inbox'::regclass), 'USAGE')
           AS writable
FROM ordo.inbox_consumers AS c
WHERE c.name = $1
"#;

/// Assigns consumer `$1` to role `$2` if it has no role yet (created for it when unknown), as
/// an operator; then what the name holds, whether `$2` exists, and the connected role.
pub(crate) const ADOPT: &str = r#"
WITH adopted AS (
    INSERT INTO ordo.inbox_consumers AS c (name, role)
    SELECT $1, $2 WHERE EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $2)
    ON CONFLICT (name) DO UPDATE SET role = EXCLUDED.role WHERE c.role IS NULL
    RETURNING c.role
)
SELECT coalesce((SELECT role FROM adopted),
                (SELECT role FROM ordo.inbox_consumers WHERE name = $1)) AS role,
       EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $2) AS known,
       current_user::text AS connected
"#;

/// Names `consumer` for the connected role, or says why this role may not receive for it.
/// In one transaction, so that a transaction-mode pooler keeps both unnamed statements on one
/// server connection (see `watermark.rs`).
pub(crate) async fn claim(pool: &PgPool, statements: Statements, consumer: &str) -> Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query(CLAIM)
        .persistent(statements.persistent())
        .bind(consumer)
        .execute(&mut *tx)
        .await?;
    let (role, connected, writable): (Option<String>, String, Option<bool>) =
        sqlx::query_as(IDENTITY)
            .persistent(statements.persistent())
            .bind(consumer)
            .fetch_one(&mut *tx)
            .await?;
    tx.commit().await?;
    if writable == Some(true) {
        return Ok(());
    }
    Err(match role {
        Some(owner) => Error::NotOwnInbox {
            consumer: consumer.to_owned(),
            owner,
            connected,
        },
        None => Error::Unadopted {
            name: consumer.to_owned(),
            table: "ordo.inbox_consumers",
            adopt: format!(
                "ordo inbox adopt {} --role {}",
                printable(consumer),
                printable(&connected)
            ),
            connected,
        },
    })
}

/// Assigns inbox consumer `consumer` to database role `role` (`ordo inbox adopt CONSUMER
/// --role ROLE`): for a consumer whose rows predate the roles' record and whose role the
/// upgrade could not tell (several roles could write the inbox), or a name no role has used
/// yet. Then only `role` (and roles that act as it, and the owner) may write its rows in
/// `ordo.inbox` and `ordo.inbox_watermarks`. Idempotent; run it as an operator (a member of
/// the owner of ordo's tables): row security keeps other roles from assigning a name.
///
/// ```no_run
/// # async fn run(operator_pool: sqlx::PgPool) -> ordo::Result<()> {
/// ordo::inbox::adopt_consumer(&operator_pool, "billing", "billing_app").await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::InvalidConfig`] if `role` does not exist, or the consumer belongs to another role
/// already (the owner moves it by SQL: `UPDATE ordo.inbox_consumers SET role = …`);
/// [`Error::Unadopted`] if the connected role may not assign it (not an operator);
/// [`Error::Database`] if a statement fails.
pub async fn adopt_consumer(pool: &PgPool, consumer: &str, role: &str) -> Result<()> {
    let result = sqlx::query_as::<_, (Option<String>, bool, String)>(ADOPT)
        .bind(consumer)
        .bind(role)
        .fetch_one(pool)
        .await;
    let (stored, known, connected) = match result {
        Ok(row) => row,
        // A role that is not an operator: row security refuses the row it would write.
        Err(sqlx::Error::Database(error)) if error.code().as_deref() == Some("42501") => {
            let connected: String = sqlx::query_scalar("SELECT current_user::text")
                .fetch_one(pool)
                .await?;
            return Err(Error::Unadopted {
                name: consumer.to_owned(),
                table: "ordo.inbox_consumers",
                adopt: format!(
                    "ordo inbox adopt {} --role {}, run as an operator",
                    printable(consumer),
                    printable(role)
                ),
                connected,
            });
        }
        Err(error) => return Err(error.into()),
    };
    if !known {
        return Error::invalid_config(
            "role",
            &format!(
                "role {:?} does not exist (CREATE ROLE … LOGIN, then ordo grant --consumer)",
                printable(role)
            ),
        );
    }
    match stored {
        Some(stored) if stored == role => Ok(()),
        Some(stored) => Error::invalid_config(
            "role",
            &format!(
                "inbox consumer {:?} belongs to role {:?} already; adopting assigns only a consumer without a role (the owner moves it by SQL: UPDATE ordo.inbox_consumers SET role = … WHERE name = …)",
                printable(consumer),
                printable(&stored)
            ),
        ),
        None => Err(Error::Unadopted {
            name: consumer.to_owned(),
            table: "ordo.inbox_consumers",
            adopt: format!(
                "ordo inbox adopt {} --role {}, run as an operator",
                printable(consumer),
                printable(role)
            ),
            connected,
        }),
    }
}
