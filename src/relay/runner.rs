//! The relay runner: claims its lease, reads the lane from the low watermark, takes the
//! events whose keys are free (the keyed schedule of `subscription::keyed`) in batches, sends
//! each batch under one deadline with no database transaction open, then records the results
//! (`marks.rs`) fenced by the lease.
//!
//! - **Delivered**: the event is done (its completion row; the watermark moves past it).
//! - **Failed** (the sink blamed the message): an attempt is counted and stored; the event
//!   backs off in place, first in its keys; after `max_attempts`, or at once for a permanent
//!   error, it is **parked**: its keys wait until an operator requeues it.
//! - **Blameless** (the deadline expired, or the batch failed as a whole): the sink is reset
//!   and the events are tried again shortly, no attempt counted.
//!
//! The results are written by a task of their own, so a relay stopped between the send and the
//! marks still records what the receiver took; a relay that lost its lease writes nothing (its
//! marks are dropped and logged), and the new owner sends those events again (at least once:
//! the receiver deduplicates by message id).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::time::Instant;
use uuid::Uuid;

use super::config::RelayConfig;
use super::{SendError, Sink};
use crate::commit_lane::CommitShared;
use crate::envelope::Envelope;
use crate::insert_lane::LaneShared;
use crate::subscription::handle::Position;
use crate::subscription::keyed::Keys;
use crate::subscription::keyed::lanes::Lanes;
use crate::subscription::keyed::progress::{self, Known};
use crate::subscription::keyed::runner::admit;
use crate::subscription::source::{Item, Source};
use crate::subscription::sql;
use crate::subscription::status::{RunStatus, SubscriptionState, SubscriptionStatus};
use crate::task::StopSignal;

/// After a database error, or an unreachable sink, wait this long before trying again.
pub(super) const ERROR_BACKOFF: Duration = Duration::from_millis(200);
/// Events released by an expired deadline are tried again after this.
pub(super) const BLAMELESS_RETRY: Duration = Duration::from_millis(100);
/// The stored watermark follows delivered events this often.
pub(super) const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// Operators' requeues are looked for this often.
pub(super) const RETRIES_EVERY: Duration = Duration::from_secs(1);

/// The keys of an event, as the relay's user defines them.
pub(crate) type KeyFn<P> = Arc<dyn Fn(&Envelope<P>) -> Keys + Send + Sync>;

pub(super) enum Flow {
    Reclaim,
    Stop,
}

/// What happened to one message of a batch.
pub(super) enum Verdict {
    Delivered,
    Failed(SendError),
    Blameless(String),
}

pub(crate) struct RelayRunner<P, K> {
    pub(crate) pool: sqlx::PgPool,
    pub(crate) lane: Arc<LaneShared<P>>,
    pub(crate) commit: Arc<CommitShared>,
    pub(crate) config: RelayConfig,
    pub(crate) sink: K,
    pub(crate) keys: KeyFn<P>,
    pub(crate) owner: Uuid,
    pub(crate) stop: StopSignal,
    pub(crate) status: watch::Sender<SubscriptionStatus>,
}

pub(super) struct Work<P> {
    pub(super) lanes: Lanes<Item<P>>,
    pub(super) known: HashMap<u64, Known>,
    pub(super) stored: Position,
    pub(super) flush_at: Instant,
    pub(super) renew_at: Instant,
    pub(super) retries_at: Instant,
    pub(super) sink_broken: bool,
    /// The parked events changed since the status last listed them.
    pub(super) stalled_changed: bool,
}

impl<P, K> RelayRunner<P, K>
where
    P: Serialize + DeserializeOwned + Send + Sync + 'static,
    K: Sink,
{
    pub(crate) async fn run(mut self) {
        loop {
            if self.stop.is_stopped() {
                break;
            }
            let c = &self.config;
            let claimed = sql::claim(&self.pool, &c.name, c.ordering, self.owner, c.lease).await;
            let flow = match claimed {
                Ok(Some(row)) if row.status == RunStatus::Active => {
                    self.set_state(SubscriptionState::Running, Some(row.position));
                    self.process(row.position).await
                }
                Ok(Some(_)) => {
                    self.set_state(SubscriptionState::Paused, None);
                    self.pause(self.config.lease / 3).await
                }
                Ok(None) => {
                    self.set_state(SubscriptionState::Standby, None);
                    self.pause(self.config.lease / 3).await
                }
                Err(error) => {
                    tracing::warn!(%error, relay = %self.config.name, "claiming failed");
                    self.pause(ERROR_BACKOFF).await
                }
            };
            if matches!(flow, Flow::Stop) {
                break;
            }
        }
        if let Err(error) = sql::release(&self.pool, &self.config.name, self.owner).await {
            tracing::warn!(%error, relay = %self.config.name, "releasing the lease failed; it expires by itself");
        }
        self.set_state(SubscriptionState::Stopped, None);
    }

    fn set_state(&self, state: SubscriptionState, position: Option<Position>) {
        self.status.send_modify(|status| {
            status.state = state;
            if let Some(position) = position {
                status.position = position;
            }
        });
    }

    async fn pause(&mut self, wait: Duration) -> Flow {
        tokio::select! {
            biased;
            _ = self.stop.stopped() => Flow::Stop,
            _ = tokio::time::sleep(wait) => Flow::Reclaim,
        }
    }

    async fn process(&mut self, watermark: Position) -> Flow {
        let known = match progress::load(&self.pool, &self.config.name, watermark).await {
            Ok(known) => known,
            Err(error) => {
                tracing::warn!(%error, relay = %self.config.name, "reading the relay's progress failed");
                return self.pause(ERROR_BACKOFF).await;
            }
        };
        let filter = crate::event_type::TypeFilter::default();
        let mut source = Source::new(
            &self.lane,
            &self.commit,
            self.stop.clone(),
            watermark,
            filter,
        );
        let now = Instant::now();
        let mut work = Work {
            lanes: Lanes::new(watermark.get()),
            known,
            stored: watermark,
            flush_at: now + FLUSH_EVERY,
            renew_at: now + self.config.lease / 3,
            retries_at: now,
            sink_broken: false,
            stalled_changed: true,
        };
        let flow = self.relay_loop(&mut work, &mut source).await;
        if matches!(flow, Flow::Stop) {
            let _ = self.flush(&mut work).await;
        }
        flow
    }

    async fn relay_loop(&mut self, work: &mut Work<P>, source: &mut Source<P>) -> Flow {
        loop {
            if self.stop.is_stopped() {
                return Flow::Stop;
            }
            while work.lanes.len() < self.config.window {
                let Some(item) = source.pop() else { break };
                self.admit(work, item);
            }
            if work.sink_broken && !work.lanes.has_ready() {
                // Nothing to send yet: the reset waits for the next batch.
            } else if work.sink_broken {
                // A receiver that does not answer must not hang the relay in its reset either.
                let reset =
                    tokio::time::timeout(self.config.batch_deadline, self.sink.reset()).await;
                match reset.unwrap_or_else(|_| {
                    Err(SendError::transient(
                        "the reset did not finish within the batch deadline",
                    ))
                }) {
                    Ok(()) => work.sink_broken = false,
                    Err(error) => {
                        tracing::warn!(%error, sink = %self.sink.describe(), "rebuilding the sink's connection failed");
                        if let Flow::Stop = self.pause(ERROR_BACKOFF).await {
                            return Flow::Stop;
                        }
                        continue;
                    }
                }
            }
            if work.lanes.has_ready() && !work.sink_broken {
                if let Some(flow) = self.send_batch(work).await {
                    return flow;
                }
                continue;
            }
            self.publish_status(work);
            let wake = [
                Some(work.flush_at),
                Some(work.renew_at),
                Some(work.retries_at),
                work.lanes.next_due(),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(work.renew_at);
            let may_read = work.lanes.len() < self.config.window && !source.has_buffered();
            tokio::select! {
                biased;
                _ = self.stop.stopped() => return Flow::Stop,
                filled = source.fill(), if may_read => match filled {
                    None => return Flow::Stop,
                    Some(Ok(())) => {}
                    Some(Err(error)) => {
                        tracing::warn!(%error, relay = %self.config.name, "reading the lane failed");
                        return self.pause(ERROR_BACKOFF).await;
                    }
                },
                _ = tokio::time::sleep_until(wake) => {
                    if let Some(flow) = self.on_timers(work).await {
                        return flow;
                    }
                }
            }
        }
    }

    fn admit(&self, work: &mut Work<P>, item: Item<P>) {
        let keys = &self.keys;
        work.stalled_changed |= admit(&mut work.lanes, &mut work.known, item, |event| keys(event));
    }
}
