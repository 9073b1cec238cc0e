//! The sequencer's talk with other processes' sequencers: announcing its appends on the
//! wake-up channel, taking in what they appended (after a refused append, and, while it
//! yields, at each look).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::time::Instant;

use super::Sequencer;
use crate::commit_lane::LogEntry;
use crate::commit_lane::store::{self, PeerAppends, Planned, Restart};
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

    /// The append of `in_flight` was refused: a peer appended first. Continues from what the
    /// peer appended ([`Self::follow`]); the groups read during the append (`plan`) stay planned
    /// behind the refused ones.
    pub(super) async fn refused(
        &mut self,
        state: &mut Restart,
        reader: &mut LaneReader<P>,
        plan: &mut Vec<Planned>,
        in_flight: Vec<Planned>,
    ) -> Result<()> {
        let mut refused = in_flight;
        refused.append(plan);
        *plan = refused;
        metrics::counter!(m::FOLD_APPENDS, "result" => "refused").increment(1);
        // A peer folds too: leave it other processes' groups from now on.
        self.turns.lost();
        match store::catch_up(&self.pool, state.head).await? {
            Some(peer) => {
                // A peer folded on a promoted server past positions this process saw: they
                // are not appended again, so they are checked now.
                if self.commit.note_server(peer.server) {
                    self.commit.went_back.check(&self.pool).await?;
                }
                self.follow(state, reader, plan, peer);
            }
            None => self.restart(state, reader, plan).await?,
        }
        Ok(())
    }

    /// Takes in a peer's appends: its entries join the log cache (listeners here read them
    /// without a table read), its groups join the skip set, and the plan keeps only groups
    /// above the peer's cursor (every group whose first event is at or below it, the peer
    /// logged: the fold is the same function everywhere). Returns how many groups the peer
    /// appended, and how many of them were this process's.
    fn follow(
        &mut self,
        state: &mut Restart,
        reader: &mut LaneReader<P>,
        plan: &mut Vec<Planned>,
        peer: PeerAppends,
    ) -> (u32, u32) {
        let mut tops: HashMap<i64, u64> = HashMap::new();
        // Ours: planned as ours already, or still waited for (taken here).
        let planned_own: HashSet<i64> = plan.iter().filter(|g| g.own).map(|g| g.xid).collect();
        let mut own = 0u32;
        for (entry, xid) in &peer.entries {
            let top = tops.entry(*xid).or_insert_with(|| {
                // Ours, appended by the peer: not to be waited for any more.
                if self.lane.take_own_commit(*xid).is_some() || planned_own.contains(xid) {
                    own = own.saturating_add(1);
                }
                entry.sequence
            });
            *top = (*top).max(entry.sequence);
        }
        let groups = u32::try_from(tops.len()).unwrap_or(u32::MAX);
        // The peer's tops replace our marks for the planned groups it logged.
        state.logged.extend(tops);
        let cursor = peer.cursor;
        plan.retain(|group| group.low > cursor);
        if cursor >= reader.position() {
            plan.clear();
            reader.seek(cursor);
        }
        // Groups still planned carry the PLANNED mark, above any cursor.
        state.logged.retain(|_, top| *top > cursor);
        state.cursor = cursor;
        let entries: Vec<LogEntry> = peer.entries.into_iter().map(|(e, _)| e).collect();
        self.publish(state, peer.head, &entries);
        self.promise_again(state, plan);
        (groups, own)
    }
}
