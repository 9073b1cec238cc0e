//! The log head for a process that does not run a sequencer: read from the state row shortly
//! after the insert lane moves (a peer is about to fold it), again with a growing pause until
//! the peer's fold has covered what this process's insert lane holds, and on the idle resync.
//! Only while something in this process follows the head (a commit-lane listener, a
//! commit-ordered subscription or relay, a wait): otherwise at most every [`UNFOLLOWED_EVERY`],
//! for the lag figures and a `Start::Now`. A writer that neither folds nor reads the commit lane
//! read the state row after nearly every commit: a fifth more statements than it wrote.
//!
//! Each read also takes in the newest server history: a process that does not fold learns
//! of a failover that gave positions it saw to other events
//! ([`went_back`](super::rewind::went_back)).

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::watch;

use super::CommitShared;
use super::store::head_and_cursor;
use crate::task::StopSignal;

/// How long after the insert lane moves the head is read first: a peer's fold takes about a
/// round trip, so reading at once would mostly see the old head.
const AFTER_FRONTIER: Duration = Duration::from_millis(2);

/// The longest pause between reads while the peer's fold is behind this process's frontier.
/// Before, a head read that came before the peer's append waited for the next frontier move or
/// the idle resync (a second outbox without a sequencer measured p99 38 ms at 500 tx/s).
const CHASE_MAX: Duration = Duration::from_millis(16);

/// Reads while chasing, at most, after each frontier move: the fold's cursor can legitimately
/// stay below the frontier (placeholders and members of logged groups are not appended), and an
/// idle process must not poll every few milliseconds for ever.
const CHASE_READS: u32 = 8;

/// How often, at most, the head is read after the insert lane moves while nothing in this
/// process follows it.
const UNFOLLOWED_EVERY: Duration = Duration::from_millis(50);

pub(crate) async fn run(
    pool: PgPool,
    commit: Arc<CommitShared>,
    mut frontier: watch::Receiver<u64>,
    resync: Duration,
    mut stop: StopSignal,
) {
    // While the fold is behind what this process holds, the next read comes after `chase`.
    let mut chase: Option<Duration> = None;
    let mut chased = 0u32;
    loop {
        let wait = chase.unwrap_or(resync);
        tokio::select! {
            biased;
            _ = stop.stopped() => return,
            changed = frontier.changed() => {
                if changed.is_err() {
                    return;
                }
                let followed = commit.head.receiver_count() > 0;
                tokio::time::sleep(if followed { AFTER_FRONTIER } else { UNFOLLOWED_EVERY })
                    .await;
                chase = None;
                // Unfollowed: one read, no chase.
                chased = if followed { 0 } else { CHASE_READS };
            }
            _ = tokio::time::sleep(wait) => {}
        }
        let target = *frontier.borrow();
        match head_and_cursor(&pool).await {
            Ok(read) => {
                // Positions this process saw that a newer server history or a lower head gave
                // again are checked before a higher head wakes the readers past them.
                let waits = commit.note_server(read.server);
                if read.head < commit.head() {
                    commit.publish_head(read.head);
                }
                if (waits || commit.went_back.pending())
                    && let Err(error) = commit.went_back.check(&pool).await
                {
                    tracing::warn!(%error, "checking the positions the commit log went back below failed");
                    continue;
                }
                if commit.went_back.reported() {
                    return;
                }
                commit.publish_head(read.head);
                chased += 1;
                chase = (read.cursor < target && chased < CHASE_READS)
                    .then(|| chase.map_or(AFTER_FRONTIER, |pause| (pause * 2).min(CHASE_MAX)));
            }
            Err(error) => {
                tracing::warn!(%error, "reading the commit log head failed");
                chase = None;
            }
        }
    }
}
