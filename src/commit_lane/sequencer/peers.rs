//! The sequencer's talk with other processes' sequencers: announcing its appends on the
//! wake-up channel, and, while it yields, looking at what they appended.

use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::time::Instant;

use super::Sequencer;
use crate::commit_lane::store::{self, Planned, Restart};
use crate::error::Result;
use crate::insert_lane::reader::LaneReader;
use crate::task::StopSignal;
use crate::telemetry::metrics as m;

/// What a sequencer tells other processes' sequencers: the log head it appended (or, yielding,
/// knows) and the insert sequence the log covers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Announcement {
    pub(super) head: u64,
    pub(super) covered: u64,
}

/// After an append, peers are told of it while one of them spoke within this long: a yielding
/// peer says so this often ([`YIELDING_SAID_EVERY`]), and a process alone sends nothing.
pub(super) const PEERS_HEARD: Duration = Duration::from_secs(3);
/// How often a yielding sequencer tells the peers that it reads their appends.
pub(super) const YIELDING_SAID_EVERY: Duration = Duration::from_secs(1);

impl<P> Sequencer<P>
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    /// The task that sends this sequencer's announcements on `channel`, one at a time, always
    /// the latest (a burst of appends is told as its last). A yielding peer then reads an
    /// append as soon as it is made instead of at its next poll. The wake-up rides on the
    /// channel the insert lanes listen on; a process of an older version takes it as a commit
    /// hint at the covered sequence, which it holds already.
    pub(crate) fn announcer(
        &mut self,
        channel: String,
        mut stop: StopSignal,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (sender, mut latest) = watch::channel(Announcement::default());
        self.announce = Some(sender);
        let pool = self.pool.clone();
        let instance = self.lane.instance;
        async move {
            loop {
                tokio::select! {
                    biased;
                    _ = stop.stopped() => return,
                    changed = latest.changed() => if changed.is_err() { return },
                }
                let Announcement { head, covered } = *latest.borrow_and_update();
                if let Err(error) = store::announce(&pool, &channel, covered, instance, head).await
                {
                    // Peers poll as well: a lost announcement costs them latency only.
                    tracing::debug!(%error, "telling peers of an append failed");
                }
            }
        }
    }

    pub(super) fn tell_peers(&self, state: &Restart) {
        if let Some(announce) = &self.announce {
            announce.send_replace(Announcement {
                head: state.head,
                covered: state.cursor,
            });
        }
    }

    /// One look at what peers appended while yielding; follows them if they moved.
    pub(super) async fn ask_peer(
        &mut self,
        state: &mut Restart,
        reader: &mut LaneReader<P>,
        plan: &mut Vec<Planned>,
    ) -> Result<()> {
        if self
            .yielded_at
            .is_none_or(|at| at.elapsed() >= YIELDING_SAID_EVERY)
        {
            self.yielded_at = Some(Instant::now());
            self.tell_peers(state);
        }
        match store::catch_up(&self.pool, state.head).await? {
            Some(peer) if peer.cursor > state.cursor || peer.head > state.head => {
                metrics::counter!(m::FOLD_APPENDS, "result" => "left_to_peer").increment(1);
                let (groups, own) = self.follow(state, reader, plan, peer);
                self.turns.peer_moved(plan);
                self.turns.peer_covered(groups, own);
            }
            Some(_) => {}
            None => self.restart(state, reader, plan).await?,
        }
        Ok(())
    }
}
