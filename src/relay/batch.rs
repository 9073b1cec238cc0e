//! One batch of a relay: messages built from the ready events (sent by `flight.rs`), a verdict
//! per event, the marks written by a task of their own, then the schedule updated.

use std::time::Duration;

use tokio::time::Instant;

mod isolate;
mod recording;

use isolate::isolate;

use super::flight::Landed;
use super::marks::{self, Mark, Marks};
use super::outage::{Judged, RELAY_SINK_DOWN};
use super::runner::{BLAMELESS_RETRY, RelayRunner, Verdict, Work};
use super::{Message, SendError, Sink};
use crate::consumer::lanes::Slot;
use crate::position::Position;
use crate::task::spawn_owned;
use crate::telemetry::metrics as m;
pub(crate) use recording::{Recording, Written};

impl<K: Sink> RelayRunner<K> {
    /// The next batch: up to the batch size of ready events, as messages, and no more than
    /// the isolation cap of any event in it (an event that does not fit starts the next
    /// batch). An event that cannot be encoded, or whose key function panicked, is parked at
    /// once (its mark written like a batch's).
    pub(super) fn take_batch(&mut self, work: &mut Work) -> Option<(Vec<Slot>, Vec<Message>)> {
        let mut slots: Vec<Slot> = Vec::new();
        let mut messages: Vec<Message> = Vec::new();
        let mut limit = self.config.batch_size;
        while slots.len() < limit {
            let taken = work.held.take();
            let Some(slot) =
                taken.or_else(|| work.schedule.lanes.take_ready().map(|(slot, _)| slot))
            else {
                break;
            };
            let Some((position, attempts, built)) = self.message_for(work, slot) else {
                continue;
            };
            if let Some(&cap) = work.isolation.get(&position) {
                if slots.len() >= cap {
                    work.held = Some(slot);
                    break;
                }
                limit = limit.min(cap);
            }
            match built {
                Ok(message) => {
                    slots.push(slot);
                    messages.push(message);
                }
                Err(error) => {
                    let failed = vec![(slot, attempts, Verdict::Failed(error))];
                    self.record(work, failed, BLAMELESS_RETRY);
                }
            }
        }
        (!slots.is_empty()).then_some((slots, messages))
    }

    /// The message of the event in `slot` (with its position and failed attempts so far), or
    /// the permanent error that keeps it from being sent.
    fn message_for(
        &self,
        work: &mut Work,
        slot: Slot,
    ) -> Option<(u64, u32, Result<Message, SendError>)> {
        let entry = work.schedule.lanes.entry(slot)?;
        let item = entry.item.as_ref()?;
        let (position, attempts) = (entry.position, entry.attempts);
        let built = match work.poisoned.remove(&position) {
            Some(error) => Err(error),
            None => {
                let history = match self.config.ordering {
                    crate::position::Ordering::Commit => work.histories.of(position),
                    crate::position::Ordering::Insert => None,
                };
                let link = work.chains.link_of(position);
                super::message_of(item, &entry.keys, &self.config, history, link)
                    .map_err(SendError::permanent)
            }
        };
        Some((position, attempts, built))
    }

    /// A batch back from its flight: its carrier goes back to the idle ones, the sink's health
    /// judged from it, its results written (and applied to the schedule once written, in
    /// [`Self::written`]).
    pub(super) fn landed(&mut self, work: &mut Work, landed: Landed<K>) {
        let mut carrier = landed.carrier;
        let mut verdicts = landed.verdicts;
        let cut_short = landed.cut_short.as_deref();
        let probe = landed.probe.as_ref();
        let (release_after, down) = self.judge(work, &mut verdicts, probe, cut_short);
        // A sink that delivered nothing may sit on a wedged connection that still looks open
        // (its per-message timeouts end each send in time): rebuilt before the next send.
        carrier.broken |= down;
        self.idle.push(carrier);
        let latency =
            metrics::histogram!(m::RELAY_DELIVERY_LATENCY, "relay" => self.config.name.clone());
        let now = chrono::Utc::now();
        for (message, verdict) in landed.messages.iter().zip(&verdicts) {
            if matches!(verdict, Verdict::Delivered) {
                latency
                    .record((now - message.recorded_at).num_milliseconds().max(0) as f64 / 1000.0);
            }
        }
        let flight = landed.slots.len();
        let results = landed
            .slots
            .into_iter()
            .zip(verdicts)
            .map(|(slot, verdict)| {
                let attempts = work
                    .schedule
                    .lanes
                    .entry(slot)
                    .map_or(0, |entry| entry.attempts);
                (slot, attempts, isolate(work, slot, verdict, flight))
            })
            .collect();
        self.record(work, results, release_after);
    }

    /// Whether the sink is down, judged from a landed flight (see `outage.rs`): logged and
    /// shown once per change of state (and every 30 s while down), not per batch. Returns how
    /// long the flight's released events wait (a short pause, or the outage's backoff), and
    /// whether the sink is down.
    fn judge(
        &self,
        work: &mut Work,
        verdicts: &mut [Verdict],
        probe: Option<&Result<(), String>>,
        cut_short: Option<&str>,
    ) -> (Duration, bool) {
        let name = &self.config.name;
        let down =
            |value: f64| metrics::gauge!(RELAY_SINK_DOWN, "relay" => name.clone()).set(value);
        if let Some(Ok(())) = probe {
            tracing::debug!(relay = %name, "the sink answered its probe: the failures of a batch that delivered nothing are its messages'");
        }
        match work.health.judge(verdicts, probe) {
            Judged::Working => {
                if let Some(why) = cut_short {
                    let released = verdicts
                        .iter()
                        .filter(|verdict| {
                            !matches!(verdict, Verdict::Delivered | Verdict::Failed(_))
                        })
                        .count();
                    tracing::warn!(relay = %name, reason = %why, released, "batch cut short: the outcomes in hand are kept, the events without one released; the connection is rebuilt before the next send");
                }
                (BLAMELESS_RETRY, false)
            }
            Judged::Recovered(since) => {
                tracing::info!(relay = %name, %since, "the sink answers again");
                down(0.0);
                work.shown.recovered();
                self.core.status.send_modify(|status| {
                    status.last_error = None;
                    status.sink_down = None;
                });
                (BLAMELESS_RETRY, false)
            }
            Judged::Down { streak, log } => {
                if let Some(state) = log {
                    tracing::warn!(relay = %name, %state, "the sink is down: no attempt is counted, nothing parked; the relay backs off and resumes by itself");
                    down(1.0);
                    work.shown.down(state.clone());
                    self.core.status.send_modify(|status| {
                        status.last_error = Some(state.to_string());
                        status.sink_down = Some(state);
                    });
                }
                (self.config.backoff_after(streak, None), true)
            }
        }
    }

    /// Applies `results` (slot, failed attempts so far, verdict) to the schedule and starts
    /// writing their marks. The write runs as a task of its own, so the relay goes on sending
    /// meanwhile (the next event of a delivered key goes out as soon as the receiver has the
    /// one before it: that is all per-key order needs), and a write completes even if this
    /// relay is stopped or dropped while it runs. The stored watermark waits for the writes:
    /// [`flush`](Self::flush) finishes them first, and a write that failed makes the relay
    /// claim again, so nothing it did not store is taken as done.
    fn record(
        &mut self,
        work: &mut Work,
        results: Vec<(Slot, u32, Verdict)>,
        release_after: Duration,
    ) {
        let mut to_store = Marks::default();
        let mut plan = Vec::with_capacity(results.len());
        for (slot, attempts, verdict) in results {
            let Some(entry) = work.schedule.lanes.entry(slot) else {
                continue;
            };
            let Some((position, sequence)) = entry
                .item
                .as_ref()
                .map(|item| (item.position, item.sequence.get()))
            else {
                continue;
            };
            let step = match verdict {
                Verdict::Delivered if entry.aside => {
                    to_store
                        .taken
                        .push(i64::try_from(position.get()).unwrap_or(i64::MAX));
                    work.isolation.remove(&position.get());
                    work.chains.forget(position.get());
                    Step::Done
                }
                Verdict::Delivered => {
                    to_store.delivered.push(position);
                    work.isolation.remove(&position.get());
                    Step::Done
                }
                Verdict::Blameless(why) | Verdict::Unresolved(why) => Step::Release {
                    attempts,
                    why,
                    after: release_after,
                },
                // Its destination is down (the sink said so): no attempt, its own backoff or
                // the outage's, whichever is longer.
                Verdict::Failed(error) if error.is_unavailable() => Step::Release {
                    attempts,
                    after: error.retry_after().map_or(release_after, |after| {
                        after.max(release_after).min(self.config.lease / 2)
                    }),
                    why: error.to_string(),
                },
                Verdict::Failed(error) => {
                    let attempts = attempts + 1;
                    let park = error.is_permanent() || attempts >= self.config.max_attempts;
                    let why = error.to_string();
                    to_store.failed.push(Mark {
                        at: position,
                        sequence,
                        parked: park,
                        attempts,
                        keys: entry.keys.iter().map(str::to_owned).collect(),
                        error: why.clone(),
                        aside: entry.aside,
                    });
                    if park {
                        work.isolation.remove(&position.get());
                        Step::Park { attempts, why }
                    } else {
                        let after = self.config.backoff_after(attempts, error.retry_after());
                        Step::Again {
                            attempts,
                            why,
                            after,
                        }
                    }
                }
            };
            plan.push((slot, step));
        }
        self.apply(work, plan);
        self.store(work, to_store);
    }

    /// Stores `to_store` (the watermark moved past what it can cover) from a task of its own,
    /// after every write before it.
    fn store(&mut self, work: &mut Work, mut to_store: Marks) {
        let watermark = self.advance_with(work, &mut to_store);
        let advance = to_store.advance_to;
        // What the status may call recorded once this write and every one before it are.
        let number = work.recording.start(watermark);
        let writer = marks::Writer::new(&self.core.pool, &self.config.name, self.core.owner);
        // Writes commit one after another, in the order their results were applied: a write
        // that moves the watermark past an event that failed before (and was since delivered)
        // committing first would make the failure's fenced mark find the watermark past it.
        let (done, finished) = tokio::sync::oneshot::channel();
        let before = self.last_write.replace(finished);
        self.writes.push(spawn_owned("relay.marks", async move {
            if let Some(before) = before {
                // An error only says the write before ended without a word (aborted): go on.
                let _ = before.await;
            }
            let written = Written(number, advance, writer.write(to_store).await);
            let _ = done.send(());
            written
        }));
    }

    /// A batch whose delivered events the watermark now covers (the usual case: batches land
    /// in order) stores the watermark instead of a row per event, which the flush would delete
    /// again. Returns the schedule's watermark.
    fn advance_with(&self, work: &mut Work, to_store: &mut Marks) -> u64 {
        let watermark = work.schedule.lanes.watermark();
        let covered = !to_store.delivered.is_empty()
            && to_store.delivered.iter().all(|at| at.get() <= watermark);
        if covered && watermark > work.schedule.stored.get() {
            to_store.advance_to = Some(Position::new(self.config.ordering, watermark));
            // Stored with the watermark; offered again at the next flush (an upsert).
            to_store.routes = work.chains.passed(watermark);
        }
        watermark
    }

    fn apply(&self, work: &mut Work, plan: Vec<(Slot, Step)>) {
        let name = &self.config.name;
        let now = Instant::now();
        // One line per batch with events the sink failed, so that an operator sees why a
        // relay makes no progress before anything is parked (a batch cut short, and an
        // outage, are logged by `judge`).
        let (mut retried, mut reason) = (0u32, None::<String>);
        // Counted per batch, not per event: each `counter!` call looks its series up again.
        let [mut delivered, mut released, mut parked] = [0u64; 3];
        for (slot, step) in plan {
            if let Step::Again { why, .. } = &step {
                retried += 1;
                reason.get_or_insert_with(|| why.clone());
            }
            match step {
                Step::Done => {
                    work.schedule.lanes.complete(slot);
                    delivered += 1;
                }
                Step::Again {
                    attempts,
                    why,
                    after,
                } => {
                    work.schedule
                        .lanes
                        .back_off(slot, attempts, why, now + after);
                }
                Step::Release {
                    attempts,
                    why,
                    after,
                } => {
                    work.schedule
                        .lanes
                        .back_off(slot, attempts, why, now + after);
                    released += 1;
                }
                Step::Park { attempts, why } => {
                    tracing::error!(relay = %name, error = %why, attempts, "event parked until an operator requeues it");
                    work.schedule.stall(slot, attempts, why);
                    parked += 1;
                }
            }
        }
        let counts = [
            ("delivered", delivered),
            ("retried", u64::from(retried)),
            ("released", released),
            ("parked", parked),
        ];
        for (result, count) in counts.into_iter().filter(|(_, count)| *count > 0) {
            metrics::counter!(m::RELAY_EVENTS, "relay" => name.clone(), "result" => result)
                .increment(count);
        }
        if let Some(error) = reason {
            tracing::warn!(relay = %name, retried, %error, "events of a batch failed at the sink; they are tried again after a backoff");
        }
    }
}

/// What a verdict does to the schedule once its mark is stored.
enum Step {
    Done,
    Again {
        attempts: u32,
        why: String,
        after: Duration,
    },
    /// No attempt counted (no outcome, or the sink was down): again `after`.
    Release {
        attempts: u32,
        why: String,
        after: Duration,
    },
    Park {
        attempts: u32,
        why: String,
    },
}
