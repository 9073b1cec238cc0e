//! The keyed runner's periodic work: backoffs that ended, operators' retries of stalled
//! events and of dead letters, the stored watermark (which also extends the lease), and the
//! status. When each is due is the core's (`consumer/schedule.rs`), but for dead letters,
//! which only subscriptions have (`dead_letters.rs`).

use std::sync::Arc;

use serde::de::DeserializeOwned;
use tokio::time::Instant;

use super::runner::Work;
use crate::consumer::{ERROR_BACKOFF, Flow, RunStatus, SubscriptionState, progress};
use crate::envelope::Envelope;
use crate::position::Position;
use crate::subscription::runner::Runner;
use crate::subscription::subscriber::Subscriber;
use crate::telemetry::metrics as m;

impl<P, S> Runner<P, S>
where
    P: DeserializeOwned + Send + Sync + 'static,
    S: Subscriber<P>,
{
    pub(super) async fn on_timers(&mut self, work: &mut Work<P>) -> Option<Flow> {
        let due = work.schedule.due(self.core.renew_every());
        if due.retries {
            work.schedule.take_retries(&self.core).await;
        }
        self.start_redelivery(&mut work.redelivery);
        if due.flush {
            return self.flush(work).await;
        }
        None
    }

    /// Stores the watermark (and extends the lease); a flow when the row changed under us.
    pub(super) async fn flush(&mut self, work: &mut Work<P>) -> Option<Flow> {
        let schedule = &mut work.schedule;
        let to = Position::new(self.config.ordering, schedule.lanes.watermark());
        let core = &mut self.core;
        // Before the statement is sent: the lease it extends runs from no earlier.
        let asked = Instant::now();
        let flushed = progress::flush(
            &core.pool,
            &core.name,
            core.owner,
            schedule.stored,
            to,
            core.lease,
        )
        .await;
        match flushed {
            Ok(Some(RunStatus::Active)) => {
                core.tenure.granted(asked, core.lease);
                schedule.flushed(to, asked, core.renew_every());
                let expires = core.lease_expiry();
                core.status
                    .send_modify(|status| status.lease_expires_at = expires);
                None
            }
            // Lost, paused, or moved by an operator.
            Ok(_) => Some(Flow::Reclaim),
            Err(error) => {
                tracing::warn!(%error, subscription = %core.name, "storing the watermark failed");
                schedule
                    .flush_failed(ERROR_BACKOFF)
                    .then_some(Flow::Reclaim)
            }
        }
    }

    pub(super) fn handled(&self, work: &Work<P>) {
        metrics::counter!(m::SUBSCRIPTION_EVENTS, "subscription" => self.config.name.clone())
            .increment(1);
        let head = match self.config.ordering {
            crate::Ordering::Insert => self.lane.frontier(),
            crate::Ordering::Commit => self.commit.head(),
        };
        metrics::gauge!(m::SUBSCRIPTION_LAG, "subscription" => self.config.name.clone())
            .set(head.saturating_sub(work.schedule.lanes.watermark()) as f64);
    }

    /// The handle's status: the watermark and the stalled keys.
    pub(super) fn publish_status(&self, work: &mut Work<P>) {
        let schedule = &mut work.schedule;
        let position = Position::new(self.config.ordering, schedule.lanes.watermark());
        let status = &self.core.status;
        if !std::mem::take(&mut schedule.stalled_changed) {
            status.send_if_modified(|status| {
                let changed = status.position != position;
                status.position = position;
                changed
            });
            return;
        }
        let stalled = schedule.stalled_keys();
        metrics::gauge!(m::SUBSCRIPTION_STALLED_KEYS, "subscription" => self.config.name.clone())
            .set(stalled.len() as f64);
        status.send_if_modified(|status| {
            let changed = status.position != position || status.stalled != stalled;
            status.position = position;
            status.stalled = stalled;
            status.state = SubscriptionState::Running;
            changed
        });
    }
}

impl<P, S> Runner<P, S>
where
    P: DeserializeOwned + Send + Sync + 'static,
    S: Subscriber<P>,
{
    /// Stuck keys' events to the backlog, or a page of one back into the window
    /// ([`Schedule::tend`]); a flow when processing must end.
    pub(super) async fn tend(&mut self, work: &mut Work<P>) -> Option<Flow> {
        let subscriber = &self.subscriber;
        let tended = work
            .schedule
            .tend(
                &self.core,
                &|_| None,
                |event: &Arc<Envelope<P>>| subscriber.keys(event),
                |_| 0,
            )
            .await;
        match tended {
            Ok(Some(_)) => None,
            Ok(None) => Some(Flow::Reclaim),
            Err(error) => {
                tracing::warn!(subscription = %self.config.name, %error, "moving a stuck key's events aside, or taking them back, failed; will claim again");
                Some(self.core.pause(ERROR_BACKOFF).await)
            }
        }
    }
}
