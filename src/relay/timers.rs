//! The relay's periodic work: the stored watermark (which also extends the lease), operators'
//! requeues of parked events, and its status.

use std::sync::Arc;

use tokio::time::Instant;

use super::RawPayload;
use super::Sink;
use super::runner::{RelayRunner, Work, item_weight};
use crate::consumer::Keys;
use crate::consumer::{ERROR_BACKOFF, Flow, RunStatus};
use crate::envelope::Envelope;
use crate::position::Position;

impl<K: Sink> RelayRunner<K> {
    pub(super) async fn on_timers(&mut self, work: &mut Work) -> Option<Flow> {
        let due = work.schedule.due(self.config.renew_every());
        if due.retries {
            work.schedule.take_retries(&self.core).await;
        }
        if due.flush {
            return self.flush(work).await;
        }
        None
    }

    /// Stores the watermark and extends the lease; a flow when the row changed under us.
    pub(super) async fn flush(&mut self, work: &mut Work) -> Option<Flow> {
        // The watermark passes only what is stored: the marks of every landed batch first (and
        // their fence refuses rows below a stored watermark, so they must not come after it).
        if let Some(flow) = self.finish_writes(work).await {
            return Some(flow);
        }
        let c = &self.config;
        let to = Position::new(c.ordering, work.schedule.lanes.watermark());
        // Before the statement is sent: the lease it extends runs from no earlier.
        let asked = Instant::now();
        let routes = work.chains.passed(to.get());
        let flushed = super::chain::flush(
            &self.core.pool,
            &c.name,
            self.core.owner,
            work.schedule.stored,
            to,
            c.lease,
            routes,
        )
        .await;
        match flushed {
            Ok(Some(RunStatus::Active)) => {
                work.chains.stored();
                self.core.tenure.granted(asked, c.lease);
                work.schedule.flushed(to, asked, c.renew_every());
                None
            }
            Ok(_) => {
                self.core.tenure.lost();
                Some(Flow::Reclaim)
            }
            Err(error) => {
                tracing::warn!(%error, relay = %c.name, "storing the watermark failed");
                work.schedule
                    .flush_failed(ERROR_BACKOFF)
                    .then_some(Flow::Reclaim)
            }
        }
    }

    /// When a flight may start: now, if it ends (with the margin) while this owner certainly
    /// holds the lease (`tenure.rs`); else after renewing first, if that renewal covers it;
    /// else `None` (the runner waits, and asks again shortly). A flow when the renewal found
    /// the row changed under us.
    pub(super) async fn may_fly(&mut self, work: &mut Work) -> Result<Option<Instant>, Flow> {
        let (deadline, lease) = (self.config.batch_deadline, self.config.lease);
        let now = Instant::now();
        if self.core.tenure.covers(now, deadline, lease) {
            return Ok(Some(now));
        }
        if !self.core.tenure.may_renew(now) {
            return Ok(None);
        }
        if let Some(flow) = self.flush(work).await {
            return Err(flow);
        }
        let now = Instant::now();
        if self.core.tenure.covers(now, deadline, lease) {
            return Ok(Some(now));
        }
        tracing::debug!(relay = %self.config.name, "a renewal came too late to cover a batch; not sending until one does");
        self.core.tenure.renewal_short(now);
        Ok(None)
    }

    /// The handle's status: the watermark, the lag and the parked events' keys.
    pub(super) fn publish_status(&self, work: &mut Work) {
        let ordering = self.config.ordering;
        // Only what is stored: the schedule may be ahead of the marks being written. With no
        // write pending it is not (events done before this claim complete without one).
        if self.writes.is_empty() {
            work.recording.recorded = work.recording.recorded.max(work.schedule.lanes.watermark());
        }
        let position = Position::new(ordering, work.recording.recorded);
        let head = match ordering {
            crate::Ordering::Insert => self.lane.frontier(),
            crate::Ordering::Commit => self.commit.head(),
        };
        let lag = head.saturating_sub(position.get());
        metrics::gauge!(crate::telemetry::metrics::RELAY_LAG, "relay" => self.config.name.clone())
            .set(lag as f64);
        let parked = std::mem::take(&mut work.schedule.stalled_changed)
            .then(|| work.schedule.stalled_keys());
        self.core.status.send_if_modified(|status| {
            let mut changed = status.position != position || status.lag != lag;
            status.position = position;
            status.lag = lag;
            if let Some(parked) = parked {
                changed |= status.stalled != parked;
                status.stalled = parked;
            }
            changed
        });
    }
}

impl<K: Sink> RelayRunner<K> {
    /// Stuck keys' events to the backlog (each with its route chain link), or a page of one
    /// back into the window ([`Schedule::tend`]); a flow when processing must end.
    pub(super) async fn tend(&mut self, work: &mut Work) -> Option<Flow> {
        let keys = &self.keys;
        let chains = &work.chains;
        let link_of = |position: u64| {
            chains.link_of(position).map(|link| {
                let route = link.route.as_deref().map(str::to_owned);
                (route, link.previous)
            })
        };
        let keys_of =
            |event: &Arc<Envelope<RawPayload>>| match super::guarded("key", || keys(event)) {
                Ok(Ok(keys)) => keys,
                _ => Keys::none(),
            };
        let tended = work
            .schedule
            .tend(&self.core, &link_of, keys_of, item_weight)
            .await;
        match tended {
            Ok(Some(links)) => {
                for (position, link) in links {
                    if let Some((route, previous)) = link {
                        let route = route.map(|route| Arc::from(route.as_str()));
                        work.chains
                            .restore(position, super::chain::Link { route, previous });
                    }
                }
                None
            }
            Ok(None) => Some(Flow::Reclaim),
            Err(error) => {
                tracing::warn!(relay = %self.config.name, %error, "moving a stuck key's events aside, or taking them back, failed; will claim again");
                Some(self.core.pause(ERROR_BACKOFF).await)
            }
        }
    }
}
