//! The relay's periodic work: the stored watermark (which also extends the lease), operators'
//! requeues of parked events, and its status.

use tokio::time::Instant;

use super::Sink;
use super::runner::{FLUSH_EVERY, Flow, RETRIES_EVERY, RelayRunner, Work};
use crate::position::Position;
use crate::subscription::keyed::progress::{self, Known};
use crate::subscription::status::RunStatus;

impl<K: Sink> RelayRunner<K> {
    pub(super) async fn on_timers(&mut self, work: &mut Work) -> Option<Flow> {
        let now = Instant::now();
        work.lanes.wake_due(now);
        if now >= work.retries_at {
            work.retries_at = now + RETRIES_EVERY.min(self.config.lease / 3);
            self.take_requeues(work).await;
        }
        let moved = work.lanes.watermark() != work.stored.get();
        if (moved && now >= work.flush_at) || now >= work.renew_at {
            return self.flush(work).await;
        }
        if now >= work.flush_at {
            work.flush_at = now + FLUSH_EVERY;
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
        let to = Position::new(c.ordering, work.lanes.watermark());
        // Before the statement is sent: the lease it extends runs from no earlier.
        let asked = Instant::now();
        let flushed =
            progress::flush(&self.pool, &c.name, self.owner, work.stored, to, c.lease).await;
        let now = Instant::now();
        match flushed {
            Ok(Some(RunStatus::Active)) => {
                self.tenure.granted(asked, c.lease);
                work.stored = to;
                work.flush_at = now + FLUSH_EVERY;
                work.renew_at = asked + c.renew_every();
                None
            }
            Ok(_) => {
                self.tenure.lost();
                Some(Flow::Reclaim)
            }
            Err(error) => {
                tracing::warn!(%error, relay = %c.name, "storing the watermark failed");
                work.flush_at = now + super::runner::ERROR_BACKOFF;
                (now >= work.renew_at).then_some(Flow::Reclaim)
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
        if self.tenure.covers(now, deadline, lease) {
            return Ok(Some(now));
        }
        if !self.tenure.may_renew(now) {
            return Ok(None);
        }
        if let Some(flow) = self.flush(work).await {
            return Err(flow);
        }
        let now = Instant::now();
        if self.tenure.covers(now, deadline, lease) {
            return Ok(Some(now));
        }
        tracing::debug!(relay = %self.config.name, "a renewal came too late to cover a batch; not sending until one does");
        self.tenure.renewal_short(now);
        Ok(None)
    }

    async fn take_requeues(&mut self, work: &mut Work) {
        let taken = progress::take_retries(&self.pool, &self.config.name, self.owner).await;
        let positions = match taken {
            Ok(positions) => positions,
            Err(error) => {
                tracing::warn!(%error, relay = %self.config.name, "looking for requeues failed");
                return;
            }
        };
        for position in positions {
            work.stalled_changed = true;
            match work.lanes.find(position) {
                Some(slot) => work.lanes.retry(slot),
                None => {
                    work.known.insert(position, Known::Failing { attempts: 0 });
                }
            }
            tracing::info!(relay = %self.config.name, position, "parked event requeued by an operator");
        }
    }

    /// The handle's status: the watermark, the lag and the parked events' keys.
    pub(super) fn publish_status(&self, work: &mut Work) {
        let ordering = self.config.ordering;
        // Only what is stored: the schedule may be ahead of the marks being written. With no
        // write pending it is not (events done before this claim complete without one).
        if self.writes.is_empty() {
            work.recording.recorded = work.recording.recorded.max(work.lanes.watermark());
        }
        let position = Position::new(ordering, work.recording.recorded);
        let head = match ordering {
            crate::Ordering::Insert => self.lane.frontier(),
            crate::Ordering::Commit => self.commit.head(),
        };
        let lag = head.saturating_sub(position.get());
        metrics::gauge!(crate::telemetry::metrics::SUBSCRIPTION_LAG, "subscription" => self.config.name.clone())
            .set(lag as f64);
        let parked =
            std::mem::take(&mut work.stalled_changed).then(|| work.lanes.stalled_keys(ordering));
        self.status.send_if_modified(|status| {
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
