//! The rewind watcher: one task per outbox, for as long as the outbox lives, that waits for a
//! rewind under whichever generation runs and has the outbox go on after it ([`resume`]).

use std::sync::{Arc, Weak};

use tokio::sync::watch;

use super::{Hub, resume};
use crate::task::StopSignal;

/// The watcher's task name, as the other tasks are named: part, then task.
const NAME: &str = "commit_lane.rewind.watcher";

/// Watches for the database going back in time under `hub`
/// ([`Error::ServerRewound`](crate::Error::ServerRewound)): its lanes hold events the server no
/// longer has, and going on with them would deliver positions the server gives again to other
/// events as if they had been delivered. The lanes stop (every listener ends with the error),
/// and then, per `OutboxConfig::on_rewind`, either new lanes start from what the server holds
/// (the runners claim again onto them) or the outbox stops. A task of the hub's own (under
/// [`Generations::tasks`](super::Generations)), which ends with the hub: when it is closed, or
/// dropped. It holds the hub only while it acts.
pub(crate) fn spawn<P, H>(hub: &Arc<H>)
where
    P: Send + Sync + 'static,
    H: Hub<P>,
{
    let generations = hub.generations();
    let work = run(
        Arc::downgrade(hub),
        generations.closed(),
        generations.tasks.signal(),
    );
    generations.tasks.spawn(NAME, work);
}

async fn run<P, H>(hub: Weak<H>, mut closed: watch::Receiver<bool>, mut stop: StopSignal)
where
    P: Send + Sync + 'static,
    H: Hub<P>,
{
    loop {
        let (rewind, mut stopped) = match hub.upgrade() {
            Some(hub) => {
                let generation = hub.generations().running();
                (
                    Arc::clone(&generation.lane.rewind),
                    generation.tasks.signal(),
                )
            }
            None => return,
        };
        tokio::select! {
            _ = closed.wait_for(|closed| *closed) => return,
            // The hub's own tasks stop only when it is dropped.
            _ = stop.stopped() => return,
            // Stopped without a rewind: the outbox was dropped.
            _ = stopped.stopped() => if !rewind.is_reported() { return },
            _ = rewind.reported() => {}
        }
        if !resume::after_rewind(&hub, &rewind, &mut closed).await {
            return;
        }
    }
}
