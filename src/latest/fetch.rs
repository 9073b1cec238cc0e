//! The `latest.fetch` task: reads the rows of the notified types, once per burst, and hands
//! them to every stream of the process; and raises the resync epoch every
//! [`RESYNC_EVERY`](super::RESYNC_EVERY).

use std::sync::Arc;

use tokio::time::MissedTickBehavior;

use super::{HubShared, RESYNC_EVERY, sql};
use crate::task::StopSignal;

pub(crate) async fn run(shared: Arc<HubShared>, mut stop: StopSignal) {
    let mut resync = tokio::time::interval(RESYNC_EVERY);
    resync.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // The first tick is immediate; the LISTEN task raises the epoch when it connects.
    resync.tick().await;
    loop {
        tokio::select! {
            biased;
            _ = stop.stopped() => return,
            _ = shared.poke.notified() => fetch(&shared).await,
            _ = resync.tick() => shared.resync(),
        }
    }
}

/// Reads the pending types and broadcasts their rows. On failure the streams read their types
/// themselves (they retry transient failures with backoff), so nothing notified is lost.
async fn fetch(shared: &HubShared) {
    let types = shared.take_pending();
    // Nobody listens: a stream that starts later reads the table first.
    if types.is_empty() || shared.rows.receiver_count() == 0 {
        return;
    }
    match sql::read(&shared.pool, &types).await {
        Ok(rows) => {
            for row in rows {
                // An error means no receiver is left, which is fine.
                let _ = shared.rows.send(Arc::new(row));
            }
        }
        Err(error) => {
            tracing::warn!(%error, "could not read notified latest values; streams read them again");
            shared.resync();
        }
    }
}
