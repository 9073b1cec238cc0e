//! Going on after a rewind: the ended generation stopped, a new server history begun, and the
//! next generation started from what the server holds and installed, trying again while the
//! server does not answer; or, under [`OnRewind::Stop`], the outbox stopped.

use std::sync::Weak;
use std::time::Duration;

use tokio::sync::watch;

use super::new_history::begin_after_rewind;
use super::{Generation, Hub, Rewind};
use crate::config::OnRewind;
use crate::telemetry::metrics::{SERVER_REWINDS, SERVER_REWOUND};

/// The first and the longest wait between two attempts to start the lanes again after a
/// rewind, while the server does not answer.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// One rewind under `hub` (reported on `rewind`): stops the lanes it ended, then starts new
/// ones from what the server holds, retrying while the server does not answer, or stops the
/// hub under [`OnRewind::Stop`]. Returns whether the hub goes on.
pub(super) async fn after_rewind<P, H>(
    hub: &Weak<H>,
    rewind: &Rewind,
    closed: &mut watch::Receiver<bool>,
) -> bool
where
    P: Send + Sync + 'static,
    H: Hub<P>,
{
    let Some(inner) = hub.upgrade() else {
        return false;
    };
    let resume = inner.on_rewind() == OnRewind::Resume;
    announce(rewind, resume);
    // Its listeners end with the error; the runners' reads end, and they claim again.
    let ended = inner.generations().running();
    ended.stop().await;
    if !resume {
        // Other processes may go on: the positions given again still get a history of their own.
        let _ = begin_after_rewind(inner.background_pool(), &ended.commit, rewind).await;
        inner.stop().await;
        return false;
    }
    drop(inner);
    let mut backoff = RETRY_FIRST;
    let mut history_begun = false;
    loop {
        let Some(inner) = hub.upgrade() else {
            return false;
        };
        if *closed.borrow() {
            return false;
        }
        let tried = try_once(&*inner, &ended, rewind, &mut history_begun, backoff).await;
        if let Some(goes_on) = tried {
            return goes_on;
        }
        drop(inner);
        tokio::select! {
            _ = closed.wait_for(|closed| *closed) => return false,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(RETRY_MAX);
    }
}

/// Says that the database went back in time: the gauge and the count of rewinds, and an error
/// naming what was found and what follows.
fn announce(rewind: &Rewind, resume: bool) {
    let error = rewind
        .error()
        .map(|error| error.to_string())
        .unwrap_or_default();
    metrics::gauge!(SERVER_REWOUND).set(1.0);
    metrics::counter!(SERVER_REWINDS).increment(1);
    tracing::error!(
        %error,
        resume,
        "ordo outbox: the database went back in time; every listener ends here, and {}",
        if resume {
            "the outbox starts again from what the server holds"
        } else {
            "the outbox stops (OnRewind::Stop)"
        }
    );
}

/// One attempt to go on after the rewind that ended `ended`: the new server history (once),
/// then the next generation, installed. `Some(whether the hub goes on)` once settled; `None`
/// if the server did not answer (logged): try again after `retry_in`.
async fn try_once<P, H>(
    hub: &H,
    ended: &Generation<P>,
    rewind: &Rewind,
    history_begun: &mut bool,
    retry_in: Duration,
) -> Option<bool>
where
    P: Send + Sync + 'static,
    H: Hub<P>,
{
    // Before the new lanes append anything: what they append at positions given again
    // must belong to the new history.
    if !*history_begun {
        if let Err(error) = begin_after_rewind(hub.background_pool(), &ended.commit, rewind).await {
            tracing::warn!(%error, ?retry_in, "ordo outbox: beginning a new server history after the rewind failed; trying again");
            return None;
        }
        *history_begun = true;
    }
    match hub.start().await {
        Ok(next) => Some(install(hub, next)),
        Err(error) => {
            tracing::warn!(%error, ?retry_in, "ordo outbox: starting again after the rewind failed; trying again");
            None
        }
    }
}

/// Makes `next` the hub's running generation, and says so; false if the hub was shut down
/// meanwhile (`next` is then stopped).
fn install<P, H: Hub<P>>(hub: &H, next: Generation<P>) -> bool {
    let (frontier, head) = (next.lane.frontier(), next.commit.head());
    if !hub.generations().install(next, |next| hub.hand_over(next)) {
        return false;
    }
    metrics::gauge!(SERVER_REWOUND).set(0.0);
    tracing::warn!(
        insert_frontier = frontier,
        commit_head = head,
        "ordo outbox started again after the rewind, from what the server holds: \
         listen again to follow it; subscriptions and relays go on from their \
         positions stored there"
    );
    true
}
