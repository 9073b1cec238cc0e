//! An operator assigns a subscription or relay row from before ordo recorded roles (`role`
//! NULL in `ordo.subscriptions`) to the role that runs it. Row security lets no other role take
//! such a row (migration `20261210000400`): a runner of another role is refused at start with
//! [`Error::Unadopted`], which names this command.

use sqlx::PgPool;

use crate::error::{Error, Result};
use crate::telemetry::printable;

/// Assigns row `$1` to role `$2` if it has no role yet and the role exists; then the row's
/// role, whether `$2` exists, and the connected role. No row: no such subscription.
pub(crate) const ADOPT: &str = r#"
WITH adopted AS (
    UPDATE ordo.subscriptions AS s SET role = $2, updated_at = now()
    WHERE s.name = $1 AND s.role IS NULL
      AND EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $2)
    RETURNING s.role
)
SELECT coalesce((SELECT role FROM adopted), s.role) AS role,
       EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $2) AS known,
       current_user::text AS connected
FROM ordo.subscriptions AS s
WHERE s.name = $1
"#;

/// Assigns the subscription or relay `name`, created before ordo recorded the role that runs
/// each row, to database role `role` (`ordo subscriptions adopt NAME --role ROLE`). Then
/// `role` (and roles that act as it) runs it, and no other role but the owner writes it, its
/// progress, dead letters or attempts. Idempotent. Run it as an operator (a member of the
/// owner of ordo's tables): row security keeps other roles off such rows.
///
/// ```no_run
/// # async fn run(operator_pool: sqlx::PgPool) -> ordo::Result<()> {
/// ordo::admin::adopt_subscription(&operator_pool, "billing", "billing_app").await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::UnknownSubscription`] if there is no such row; [`Error::InvalidConfig`] if `role`
/// does not exist, or the row is run by another role already (the owner moves it by SQL:
/// `UPDATE ordo.subscriptions SET role = …`); [`Error::Unadopted`] if the connected role may
/// not assign it (not an operator); [`Error::Database`] if the statement fails.
pub async fn adopt_subscription(pool: &PgPool, name: &str, role: &str) -> Result<()> {
    let Some((stored, known, connected)) =
        sqlx::query_as::<_, (Option<String>, bool, String)>(ADOPT)
            .bind(name)
            .bind(role)
            .fetch_optional(pool)
            .await?
    else {
        return Err(Error::UnknownSubscription {
            name: name.to_owned(),
        });
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
                "{:?} in ordo.subscriptions is run by role {:?} already; adopting assigns only a row without a role (the owner moves it by SQL: UPDATE ordo.subscriptions SET role = … WHERE name = …)",
                printable(name),
                printable(&stored)
            ),
        ),
        // Row security hid the row from the update: the connected role may not write it.
        None => Err(Error::Unadopted {
            name: name.to_owned(),
            table: "ordo.subscriptions",
            adopt: format!(
                "ordo subscriptions adopt {} --role {}, run as an operator",
                printable(name),
                printable(role)
            ),
            connected,
        }),
    }
}
