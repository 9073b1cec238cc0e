//! The write side: the transaction wrapper, `publish_in` for caller-owned transactions, the
//! sink that hands committed events to this process's lane, and the cross-process wake-up
//! notifier.

pub(crate) mod in_doubt;
pub(crate) mod insert;
pub(crate) mod notifier;
pub(crate) mod publish_in;
pub(crate) mod sink;
pub(crate) mod sql;
pub(crate) mod transaction;

use std::sync::Arc;

use sqlx::PgPool;
use tokio::sync::mpsc;

use crate::config::OutboxConfig;
use crate::insert_lane::{CommittedBatch, LaneShared};
use crate::pooler::Statements;
use crate::task::Tasks;
use sink::CommitSink;

/// Starts the write side: the sink commits hand their events to (`handoff` is the insert
/// lane's), and the wake-up notifier when `config` wakes other processes. `pool` is the
/// background parts' pool; `statements` is how the publishing pool takes its statements.
pub(crate) fn spawn<P>(
    tasks: &Tasks,
    pool: &PgPool,
    config: &OutboxConfig,
    lane: &Arc<LaneShared<P>>,
    handoff: mpsc::UnboundedSender<CommittedBatch<P>>,
    statements: Statements,
) -> Arc<CommitSink<P>> {
    let sink = CommitSink::new(pool.clone(), Arc::clone(lane), handoff, statements);
    if config.cross_process_wakeups {
        tasks.spawn(
            "write.notifier",
            notifier::run(
                pool.clone(),
                config.notify_channel.clone(),
                config.notify_debounce,
                (lane.instance, Arc::clone(&lane.audience)),
                sink.watch_committed(),
                tasks.signal(),
            ),
        );
    }
    Arc::new(sink)
}
