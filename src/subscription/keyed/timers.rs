//! The keyed runner's periodic work: backoffs that ended, operators' retries of stalled
//! events, the stored watermark (which also extends the lease), and the status.

use serde::de::DeserializeOwned;
use tokio::time::Instant;

use super::progress::{self, Known};
use super::runner::{FLUSH_EVERY, RETRIES_EVERY, Work};
use crate::position::Position;
use crate::subscription::runner::{ERROR_BACKOFF, Flow, Runner};
use crate::subscription::status::{RunStatus, SubscriptionState};
use crate::subscription::subscriber::Subscriber;

impl<P, S> Runner<P, S>
where
    P: DeserializeOwned + Send + Sync + 'static,
    S: Subscriber<P>,
{
    pub(super) async fn on_timers(&mut self, work: &mut Work<P>) -> Option<Flow> {
        let now = Instant::now();
        work.lanes.wake_due(now);
        if now >= work.retries_at {
            work.retries_at = now + RETRIES_EVERY.min(self.renew_every());
            if let Some(flow) = self.take_retries(work).await {
                return Some(flow);
            }
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

    /// Stores the watermark (and extends the lease); a flow when the row changed under us.
    pub(super) async fn flush(&mut self, work: &mut Work<P>) -> Option<Flow> {
        let to = Position::new(self.config.ordering, work.lanes.watermark());
        let flushed = progress::flush(
            &self.pool,
            &self.config.name,
            self.owner,
            work.stored,
            to,
            self.config.lease,
        )
        .await;
        let now = Instant::now();
        match flushed {
            Ok(Some(RunStatus::Active)) => {
                work.stored = to;
                work.flush_at = now + FLUSH_EVERY;
                work.renew_at = now + self.renew_every();
                let expires = self.lease_expiry();
                self.status
                    .send_modify(|status| status.lease_expires_at = expires);
                None
            }
            // Lost, paused, or moved by an operator.
            Ok(_) => Some(Flow::Reclaim),
            Err(error) => {
                tracing::warn!(%error, subscription = %self.config.name, "storing the watermark failed");
                work.flush_at = now + ERROR_BACKOFF;
                (now >= work.renew_at).then_some(Flow::Reclaim)
            }
        }
    }

    /// Takes operators' retries of stalled events.
    async fn take_retries(&self, work: &mut Work<P>) -> Option<Flow> {
        let positions = match progress::take_retries(&self.pool, &self.config.name, self.owner)
            .await
        {
            Ok(positions) => positions,
            Err(error) => {
                tracing::warn!(%error, subscription = %self.config.name, "looking for retries failed");
                return None;
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
            tracing::info!(subscription = %self.config.name, position, "stalled event retried by an operator");
        }
        None
    }

    pub(super) fn handled(&self, work: &Work<P>) {
        metrics::counter!(crate::telemetry::metrics::SUBSCRIPTION_EVENTS, "subscription" => self.config.name.clone())
            .increment(1);
        let head = match self.config.ordering {
            crate::Ordering::Insert => self.lane.frontier(),
            crate::Ordering::Commit => self.commit.head(),
        };
        metrics::gauge!(crate::telemetry::metrics::SUBSCRIPTION_LAG, "subscription" => self.config.name.clone())
            .set(head.saturating_sub(work.lanes.watermark()) as f64);
    }

    /// The handle's status: the watermark and the stalled keys.
    pub(super) fn publish_status(&self, work: &mut Work<P>) {
        let position = Position::new(self.config.ordering, work.lanes.watermark());
        if !std::mem::take(&mut work.stalled_changed) {
            self.status.send_if_modified(|status| {
                let changed = status.position != position;
                status.position = position;
                changed
            });
            return;
        }
        let stalled = work.lanes.stalled_keys(self.config.ordering);
        metrics::gauge!(crate::telemetry::metrics::SUBSCRIPTION_STALLED_KEYS, "subscription" => self.config.name.clone())
            .set(stalled.len() as f64);
        self.status.send_if_modified(|status| {
            let changed = status.position != position || status.stalled != stalled;
            status.position = position;
            status.stalled = stalled;
            status.state = SubscriptionState::Running;
            changed
        });
    }
}
