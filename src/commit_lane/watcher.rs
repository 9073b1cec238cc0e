//! The log head for a process that does not run a sequencer: read from the state row shortly
//! after the insert lane moves (a peer is about to fold it), and on the idle resync.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::watch;

use super::{CommitShared, HEAD_SQL};
use crate::insert_lane::rows::to_u64;
use crate::task::StopSignal;

/// How long after the insert lane moves the head is read: a peer's fold takes about a round
/// trip, so reading at once would mostly see the old head.
const AFTER_FRONTIER: Duration = Duration::from_millis(2);

pub(crate) async fn run(
    pool: PgPool,
    commit: Arc<CommitShared>,
    mut frontier: watch::Receiver<u64>,
    resync: Duration,
    mut stop: StopSignal,
) {
    loop {
        tokio::select! {
            biased;
            _ = stop.stopped() => return,
            changed = frontier.changed() => {
                if changed.is_err() {
                    return;
                }
                tokio::time::sleep(AFTER_FRONTIER).await;
            }
            _ = tokio::time::sleep(resync) => {}
        }
        match sqlx::query_scalar::<_, i64>(HEAD_SQL)
            .fetch_one(&pool)
            .await
        {
            Ok(head) => commit.publish_head(to_u64(head)),
            Err(error) => tracing::warn!(%error, "reading the commit log head failed"),
        }
    }
}
