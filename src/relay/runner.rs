//! The relay runner: claims its lease, reads the lane from the low watermark, takes the
//! events whose keys are free (the keyed schedule of `subscription::keyed`) in batches, sends
//! each batch under one deadline with no database transaction open, then records the results
//! (`marks.rs`) fenced by the lease.
//!
//! - **Delivered**: the event is done. A batch that the schedule's watermark covers once it
//!   lands (batches landing in order) stores that watermark; one that lands ahead of an earlier
//!   batch stores a completion row per event, which the next flush folds into the watermark.
//! - **Failed** (the sink blamed the message): an attempt is counted and stored; the event
//!   backs off in place, first in its keys; after `max_attempts`, or at once for a permanent
//!   error, it is **parked**: its keys wait until an operator requeues it.
//! - **Unresolved** (no outcome: the deadline expired, the sink panicked or returned without
//!   one): tried again shortly, no attempt counted, in a batch at most half as big; alone, it
//!   counts an attempt (`batch.rs`, `isolate`).
//! - **Blameless** (the sink was down: `outage.rs`): no attempt counted, nothing parked, the
//!   sink's connection rebuilt and the events tried again after a capped, jittered backoff.
//!
//! The results apply to the schedule at once (a key's next event goes out as soon as the
//! receiver has the one before it) and are written by a task of their own while the relay goes
//! on sending; the stored watermark waits for those writes. So a relay stopped between the send
//! and the marks still records what the receiver took; a relay that lost its lease writes nothing (its
//! marks are dropped and logged), and the new owner sends those events again (at least once:
//! the receiver deduplicates by message id).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use tokio::task::{JoinHandle, JoinSet};

use super::batch::{Recording, Written};
use super::chain::Chains;
use super::config::{OnParked, RelayConfig};
use super::flight::{Carrier, Landed};
use super::histories::Histories;
use super::outage::Health;
use super::sink_down::Shown;
use super::turn::Turn;
use super::{RawPayload, SendError, Sink};
use crate::commit_lane::CommitShared;
use crate::consumer::LaneSet;
use crate::consumer::driver::drive;
use crate::consumer::lanes::{Lanes, Slot};
use crate::consumer::source::{Item, ReadAhead, Source};
use crate::consumer::sql::Stored;
use crate::consumer::{Consumer, ERROR_BACKOFF, Executor, Flow, Keys, ReadFailed, Schedule};
use crate::envelope::Envelope;
use crate::insert_lane::LaneShared;
use crate::position::Position;
use crate::task::StopSignal;

/// Events released by an expired deadline are tried again after this.
pub(super) const BLAMELESS_RETRY: Duration = Duration::from_millis(100);

/// The keys of an event, as the relay's user defines them.
pub(crate) type KeyFn<P> = Arc<dyn Fn(&Envelope<P>) -> Keys + Send + Sync>;

/// The keys of an event read as its stored text: the user's [`KeyFn`] run on the payload
/// decoded as the user's type, or why it does not decode (its keys cannot be known).
pub(crate) type Keyer = Arc<dyn Fn(&Envelope<RawPayload>) -> Result<Keys, String> + Send + Sync>;

/// What happened to one message of a batch.
#[derive(Clone)]
pub(super) enum Verdict {
    Delivered,
    /// The sink blamed this message: an attempt counts.
    Failed(SendError),
    /// The sink failed as a whole: released, no attempt counted.
    Blameless(String),
    /// No outcome: the deadline expired, the sink panicked, or it returned without one.
    /// Released into a batch half as big, or blamed when it was sent alone.
    Unresolved(String),
}

/// The outbox's lanes now, the insert lane read as stored text: taken at each claim.
pub(crate) type LanesNow = Arc<dyn Fn() -> LaneSet<RawPayload> + Send + Sync>;

pub(crate) struct RelayRunner<K> {
    pub(crate) core: Consumer,
    pub(crate) lanes_now: LanesNow,
    /// The lane read as stored text (see [`LaneShared::table_view`]).
    pub(crate) lane: Arc<LaneShared<RawPayload>>,
    pub(crate) commit: Arc<CommitShared>,
    /// Set when `lane` and `commit` stop: this claim's reads end.
    pub(crate) lanes_stop: StopSignal,
    pub(crate) config: RelayConfig,
    /// The sinks not in flight (one per batch that may be in flight at once).
    pub(crate) idle: Vec<Carrier<K>>,
    /// The batches in flight, each with its carrier.
    pub(crate) flights: JoinSet<Landed<K>>,
    /// The writes of landed batches' marks, each a task of its own (dropping this set detaches
    /// them: they complete anyway).
    pub(crate) writes: FuturesUnordered<JoinHandle<Written>>,
    /// Done when the latest write started so far has finished: the next one waits for it, so
    /// marks commit in the order their results were applied (a write that moves the watermark
    /// past an event must not commit before the one recording that event's failure).
    pub(crate) last_write: Option<tokio::sync::oneshot::Receiver<()>>,
    pub(crate) keys: Keyer,
    /// The sink's routes, for the chains ([`Sink::router`] of the first sink).
    pub(crate) router: Option<super::Router>,
}

pub(super) struct Work {
    /// The core's keyed schedule (the parked events are its stalled ones).
    pub(super) schedule: Schedule<RawPayload>,
    /// How far the results are stored (what the status reports).
    pub(super) recording: Recording,
    /// Events left without an outcome by an earlier batch, by position: the most events the
    /// next batch holding one may have (halved each time, see `batch.rs`).
    pub(super) isolation: HashMap<u64, usize>,
    /// An event taken for a batch it did not fit (its isolation cap): it starts the next one.
    pub(super) held: Option<Slot>,
    /// Events whose key function panicked, by position, with the panic: parked when taken.
    pub(super) poisoned: HashMap<u64, SendError>,
    /// Whether the sink is down (an outage: see `outage.rs`).
    pub(super) health: Health,
    /// The sink's state as operators see it in the database, written by a task of its own.
    pub(super) shown: Shown,
    /// The server history of each commit position read so far (`Message::history`).
    pub(super) histories: Histories,
    /// The highest position admitted so far.
    pub(super) admitted: u64,
    /// Each event's place in its route's chain (`chain.rs`).
    pub(super) chains: Chains,
}

impl<K: Sink> Executor for RelayRunner<K> {
    fn consumer(&mut self) -> &mut Consumer {
        &mut self.core
    }

    /// Sooner than a third of the lease when a batch deadline would not fit in what is left.
    fn renew_every(&self) -> Duration {
        self.config.renew_every()
    }

    async fn process(&mut self, row: Stored) -> Flow {
        let lanes = (self.lanes_now)();
        self.lane = lanes.lane;
        self.commit = lanes.commit;
        self.lanes_stop = lanes.stop;
        self.process_from(row.position).await
    }
}

impl<K: Sink> RelayRunner<K> {
    async fn process_from(&mut self, watermark: Position) -> Flow {
        let (known, backlogs) = match self.core.progress_above(watermark).await {
            Ok(loaded) => loaded,
            Err(flow) => return flow,
        };
        let chains = Chains::load(
            &self.core.pool,
            &self.config.name,
            watermark.get(),
            self.router.clone(),
        )
        .await;
        let chains = match chains {
            Ok(chains) => chains,
            Err(error) => {
                tracing::warn!(relay = %self.config.name, %error, "reading the relay's route chains failed; trying again");
                return self.core.pause(ERROR_BACKOFF).await;
            }
        };
        let source = Source::new(
            &self.lane,
            &self.commit,
            self.core.stop.clone().or(&self.lanes_stop),
            watermark,
            self.config.types.clone(),
        );
        // Up to a page read ahead, beside the runner (see `ReadAhead`); pages, and what is
        // read ahead, each weigh at most about a quarter of the window's bytes.
        let quarter = (self.config.window_bytes / 4).max(1);
        let source = source
            .page_bytes(quarter, item_weight)
            .refusing_reused_ids(self.core.pool.clone());
        let mut source =
            ReadAhead::spawn_weighed(source, self.lane.page_size, quarter, item_weight);
        let lanes = match self.config.on_parked {
            OnParked::HoldKeys => Lanes::new(watermark.get()),
            OnParked::Continue => Lanes::new(watermark.get()).let_stalled_go(),
        };
        let mut work = Work {
            schedule: Schedule::new(lanes, known, watermark, self.config.renew_every(), backlogs),
            recording: Recording::new(watermark.get()),
            isolation: HashMap::new(),
            held: None,
            poisoned: HashMap::new(),
            health: Health::default(),
            shown: Shown::spawn(&self.core.pool, &self.config.name, self.core.owner),
            histories: Histories::default(),
            admitted: watermark.get(),
            chains,
        };
        let flow = drive(&mut Turn::new(self, &mut work), &mut source).await;
        // The batches in flight come back (each is bounded by the deadline): on a stop their
        // results are stored; otherwise the lease is lost or in doubt, and their events go to
        // whoever claims next.
        while let Some(joined) = self.flights.join_next().await {
            let Ok(landed) = joined else { continue };
            if matches!(flow, Flow::Stop) {
                self.landed(&mut work, landed);
            } else {
                self.idle.push(landed.carrier);
            }
        }
        // Every write of marks finishes before the next claim or the stop's last flush.
        let unstored = self.finish_writes(&mut work).await;
        if matches!(flow, Flow::Stop) && unstored.is_none() {
            let _ = self.flush(&mut work).await;
        }
        flow
    }

    /// A failed read of the lane: below the retention floor the relay halts, as a subscription
    /// does (see [`Consumer::read_failed`]), at its stored watermark once every write of marks in flight
    /// has landed (one may move it); anything else is retried.
    pub(super) async fn read_failed(&mut self, error: &crate::Error, work: &mut Work) -> Flow {
        if let crate::Error::BelowRetentionFloor { .. } = error
            && let Some(flow) = self.finish_writes(work).await
        {
            return flow;
        }
        let at = work.schedule.stored;
        match self.core.read_failed(error, at).await {
            ReadFailed::Halted => Flow::Reclaim,
            ReadFailed::Retry => self.core.pause(ERROR_BACKOFF).await,
        }
    }

    /// A read event into the schedule. A key function that panics on it parks it when it is
    /// taken (a key cannot be guessed; the event holds no key meanwhile), never the relay. One
    /// whose payload does not decode as the key function's type is still sent as stored, as a
    /// barrier: its keys cannot be known, so it is ordered with every event.
    pub(super) fn admit(&self, work: &mut Work, item: Item<RawPayload>) {
        if let Some(first) = item.refused {
            self.refused(&item, first);
        }
        let keys = &self.keys;
        let position = item.position.get();
        work.admitted = work.admitted.max(position);
        let weight = item.event.as_deref().map_or(0, weight_of);
        let poisoned = &mut work.poisoned;
        let chains = &mut work.chains;
        let config = &self.config;
        let keys_of = |event: &Arc<Envelope<RawPayload>>| {
            let keys = match super::guarded("key", || keys(event)) {
                Ok(Ok(keys)) => Some(keys),
                Ok(Err(why)) => {
                    tracing::warn!(
                        relay = %config.name, sequence = event.sequence.get(), error = %super::quoted(&why),
                        "the payload does not decode as the relay's payload type, so its keys cannot be known: it is sent as stored, after every event before it and before every event after it"
                    );
                    None
                }
                Err(error) => {
                    poisoned.insert(position, error);
                    Some(Keys::none())
                }
            };
            // Linked in lane order, as read: every event that will be sent, whatever its fate.
            // One its templates cannot route is in no chain: it can never be sent.
            let message = chains.routed().then(|| {
                let none = Keys::none();
                super::start::message_of_event(
                    event,
                    position,
                    keys.as_ref().unwrap_or(&none),
                    config,
                    None,
                )
                .ok()
            });
            let message = message.flatten();
            chains.link(position, message.as_ref());
            keys
        };
        work.schedule.admit(item, keys_of, weight);
    }

    /// Whether the window may take another event: fewer than its events and its bytes (one
    /// event is always taken, however large).
    pub(super) fn window_open(&self, work: &Work) -> bool {
        let lanes = &work.schedule.lanes;
        lanes.len() < self.config.window
            && (lanes.held_bytes() < self.config.window_bytes || lanes.held_bytes() == 0)
    }
}

/// What an item read weighs (see [`weight_of`]).
pub(super) fn item_weight(item: &Item<RawPayload>) -> usize {
    item.event.as_deref().map_or(0, weight_of)
}

/// What an event held in the window weighs: its payload's text, its headers (strings by their
/// length, anything else by a flat 16 bytes) and the envelope itself.
fn weight_of(event: &Envelope<RawPayload>) -> usize {
    const ENVELOPE: usize = 160;
    let headers: usize = event
        .headers
        .iter()
        .map(|(name, value)| name.len() + value.as_str().map_or(16, str::len))
        .sum();
    ENVELOPE + event.payload.get().len() + headers
}
