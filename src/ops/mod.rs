//! Operations: see and steer a running outbox.

pub(crate) mod grants;
pub(crate) mod plans;
pub(crate) mod prometheus;
pub(crate) mod render;
pub(crate) mod retention;
pub(crate) mod secrets;
pub(crate) mod sql;
pub(crate) mod status;

use sqlx::PgPool;

use crate::config::OutboxConfig;
use crate::task::Tasks;

/// Starts an outbox's operations work: the partition and retention maintainer, which also
/// removes secret payload keys from the events every reader has passed.
pub(crate) fn spawn(tasks: &Tasks, pool: &PgPool, config: &OutboxConfig) {
    tasks.spawn(
        "ops.retention",
        retention::maintain(
            pool.clone(),
            config.retention.clone(),
            config.maintenance_interval,
            config.partition_maintenance,
            tasks.signal(),
        ),
    );
}
