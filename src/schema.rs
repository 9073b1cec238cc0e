//! Names in the `ordo` schema that more than one part states (the migrator and the errors that
//! tell an operator how to repair it; the latest values and the configuration that keeps their
//! channel). A leaf: it imports nothing of ordo's.

/// The table in which ordo records its applied migrations. It lives in the `ordo` schema, so
/// ordo's history never mixes with an application's own `_sqlx_migrations`.
pub const MIGRATIONS_TABLE: &str = "ordo._sqlx_migrations";

/// The channel `ordo.publish_latest` notifies (fixed in the migration): the latest values
/// listen on it, and the configuration refuses it as the outbox's wake-up channel.
pub(crate) const LATEST_CHANNEL: &str = "ordo_latest";
