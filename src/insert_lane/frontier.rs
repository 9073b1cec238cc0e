//! The frontier task: advances the insert lane's contiguity frontier.
//!
//! Inputs: committed batches from this process's writers (no round trip), wake-ups (another
//! process's `pg_notify`, a `publish_in` hint), and its own timers: a fast poll while a hole
//! blocks the frontier, an idle resync of the sequence head otherwise. A hole that outlives the
//! grace is handed to a [`Resolver`]; the frontier never moves past a sequence that has no row.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::cache::Slot;
use super::resolve::{Resolution, Resolver};
use super::{CommittedBatch, LaneShared};
use super::{heads, rows};
use crate::config::OutboxConfig;
use crate::error::Result;
use crate::position::EventSequence;
use crate::task::{StopSignal, spawn_owned};
use crate::telemetry::metrics as m;

/// At most this many missing sequences are asked for by name in one fetch.
const MAX_MISSING_PER_FETCH: usize = 512;
/// After a failed statement, wait this long before the next attempt (doubling up to the max).
const ERROR_BACKOFF: Duration = Duration::from_millis(50);
const MAX_ERROR_BACKOFF: Duration = Duration::from_secs(5);

/// A hole the frontier is waiting on.
struct Hole {
    at: u64,
    since: Instant,
    poll: Duration,
}

pub(crate) struct FrontierTask<P> {
    shared: Arc<LaneShared<P>>,
    commits: mpsc::UnboundedReceiver<CommittedBatch<P>>,
    stop: StopSignal,
    config: OutboxConfig,
    frontier: u64,
    /// Resolved slots above the frontier, waiting for the sequences below them.
    pending: BTreeMap<u64, Slot<P>>,
    /// What the payloads in `pending` weigh (bounded by `cache_bytes`, like the cache).
    pending_bytes: usize,
    /// The highest sequence known to exist (drawn), whether or not it is visible yet.
    known_head: u64,
    hole: Option<Hole>,
    resolver: Option<(u64, JoinHandle<Result<Resolution>>)>,
    /// The sequence head at which the rows blocking the frontier were all found above it (a
    /// broken schema contract). No resolver runs until the head moves past it.
    above_head: Option<u64>,
    /// The highest row above the head already reported, so each is logged once.
    reported_above: u64,
    next_poll: Instant,
    error_backoff: Duration,
}

impl<P> FrontierTask<P>
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    pub(crate) fn new(
        shared: Arc<LaneShared<P>>,
        commits: mpsc::UnboundedReceiver<CommittedBatch<P>>,
        stop: StopSignal,
        config: OutboxConfig,
    ) -> Self {
        let frontier = shared.frontier();
        let next_poll = Instant::now() + config.resync_interval;
        Self {
            shared,
            commits,
            stop,
            config,
            frontier,
            pending: BTreeMap::new(),
            pending_bytes: 0,
            known_head: frontier,
            hole: None,
            resolver: None,
            above_head: None,
            reported_above: 0,
            next_poll,
            error_backoff: ERROR_BACKOFF,
        }
    }

    pub(crate) async fn run(mut self) {
        // Anything committed while the outbox was starting is found by this first look.
        let mut look = true;
        loop {
            if look {
                if let Err(error) = self.look().await {
                    tracing::warn!(%error, "insert lane: reading ordo.events failed; retrying");
                    self.next_poll = Instant::now() + self.error_backoff;
                    self.error_backoff = (self.error_backoff * 2).min(MAX_ERROR_BACKOFF);
                } else {
                    self.error_backoff = ERROR_BACKOFF;
                }
            }
            self.advance();
            self.manage_hole();
            look = tokio::select! {
                biased;
                _ = self.stop.stopped() => break,
                batch = self.commits.recv() => match batch {
                    Some(batch) => {
                        self.ingest(batch);
                        while let Ok(more) = self.commits.try_recv() {
                            self.ingest(more);
                        }
                        false
                    }
                    None => break,
                },
                done = wait_resolver(&mut self.resolver) => {
                    self.resolver = None;
                    match done {
                        Ok(Ok(Resolution::AboveHead { head, rows })) => self.rows_above_head(head, &rows),
                        Ok(Ok(resolution)) => tracing::debug!(?resolution, "hole resolved"),
                        Ok(Err(error)) => tracing::warn!(%error, "resolving a hole failed; will retry"),
                        Err(error) if error.is_cancelled() => {}
                        Err(error) => tracing::error!(%error, "hole resolver panicked"),
                    }
                    true
                }
                _ = self.shared.poke.notified() => {
                    self.known_head = self.known_head.max(self.shared.head_hint.load(Ordering::Acquire));
                    // A resync request always looks; so does a wake-up past what this process
                    // holds. Another process's wake-up also looks while a hole blocks the
                    // frontier: the hole may be that process's row, now committed, below what
                    // this one holds (with writers in several processes, waiting for the next
                    // poll instead, backed off to up to 100 ms, held the lane's p99 at 35 ms).
                    let foreign = self.shared.take_foreign_wake();
                    self.shared.resync.swap(false, Ordering::AcqRel)
                        || self.known_head > self.max_known()
                        || (foreign && !self.pending.is_empty())
                }
                _ = tokio::time::sleep_until(self.next_poll) => true,
            };
        }
        if let Some((_, resolver)) = self.resolver.take() {
            resolver.abort();
        }
    }

    /// The highest sequence this task holds a slot for.
    fn max_known(&self) -> u64 {
        self.pending
            .last_key_value()
            .map_or(self.frontier, |(sequence, _)| *sequence)
    }

    fn ingest(&mut self, batch: CommittedBatch<P>) {
        for slot in batch {
            self.known_head = self.known_head.max(slot.sequence);
            // This process just committed the row at this sequence, so it is the row there: a
            // different slot held at the same sequence was read from a row since deleted (a
            // forged row above the head, removed by an operator) and must not be delivered.
            if let Some(stale) = self.pending.remove(&slot.sequence) {
                self.pending_bytes = self.pending_bytes.saturating_sub(stale.bytes);
            }
            if self.pending.len() < self.config.cache_capacity {
                self.hold(slot);
            }
            // Past the pending bound the slot is dropped here and read from the table later.
        }
    }

    /// Keeps a resolved slot above the frontier until the sequences below it resolve. Past
    /// the byte budget it waits without its payload, and listeners read that event from the
    /// table: a long-open hole must not pin every large payload committed above it.
    fn hold(&mut self, slot: Slot<P>) {
        if slot.sequence <= self.frontier || self.pending.contains_key(&slot.sequence) {
            return;
        }
        let slot = if self.pending_bytes + slot.bytes > self.config.cache_bytes {
            slot.without_payload()
        } else {
            slot
        };
        self.pending_bytes += slot.bytes;
        self.pending.insert(slot.sequence, slot);
    }

    /// One look at the table: the holes below what we know, anything new above it, and the
    /// sequence head when idle.
    async fn look(&mut self) -> Result<()> {
        let pool = &self.shared.pool;
        if let Some(head) = self.above_head
            && heads::head(pool).await? > head
        {
            // Writers have drawn more: the holes below the new head can be resolved again.
            self.above_head = None;
        }
        if self.hole.is_none() && self.known_head <= self.max_known() {
            let head = heads::head(pool).await?;
            if head < self.frontier {
                // A sequence never goes back on one server history: every sequence up to the
                // frontier was drawn, and the events among them were read from the table.
                self.shared.rewind.report(format!(
                    "the events sequence is at {head}, below sequence {} that this process's \
                     insert lane had already passed",
                    self.frontier
                ));
                self.schedule(self.config.resync_interval);
                return Ok(());
            }
            self.known_head = self.known_head.max(head);
            if self.known_head <= self.max_known() {
                self.schedule(self.config.resync_interval);
                return Ok(());
            }
        }
        let mut missing = Vec::new();
        let mut sequence = self.frontier + 1;
        let top = self.max_known();
        while sequence <= top && missing.len() < MAX_MISSING_PER_FETCH {
            if !self.pending.contains_key(&sequence) {
                missing.push(EventSequence::new(sequence));
            }
            sequence += 1;
        }
        let room = self
            .config
            .cache_capacity
            .saturating_sub(self.pending.len())
            .min(self.config.page_size);
        let slots = rows::fetch::<P>(pool, &missing, top, room).await?;
        let full_page = room > 0 && slots.iter().filter(|s| s.sequence > top).count() == room;
        for slot in slots {
            self.known_head = self.known_head.max(slot.sequence);
            self.hold(slot);
        }
        if full_page {
            // More is waiting right behind this page: look again at once.
            self.next_poll = Instant::now();
            self.shared.poke.notify_one();
        }
        Ok(())
    }

    /// Moves every contiguous pending slot into the cache and publishes the new frontier.
    fn advance(&mut self) {
        if !self.pending.contains_key(&(self.frontier + 1)) {
            return;
        }
        if let Ok(mut cache) = self.shared.cache.write() {
            while let Some(slot) = self.pending.remove(&(self.frontier + 1)) {
                self.pending_bytes -= slot.bytes;
                self.frontier = slot.sequence;
                cache.push(slot);
            }
        }
        self.shared.frontier.send_replace(self.frontier);
        metrics::gauge!(m::INSERT_FRONTIER).set(self.frontier as f64);
        metrics::gauge!(m::INSERT_KNOWN_HEAD).set(self.known_head as f64);
    }

    /// Decides when to look next, and starts a resolver for a hole that outlived the grace.
    fn manage_hole(&mut self) {
        let now = Instant::now();
        if let Some((from, resolver)) = &self.resolver
            && *from <= self.frontier
        {
            // The hole closed by itself; the proof is no longer needed.
            resolver.abort();
            self.resolver = None;
        }
        let blocked = !self.pending.is_empty();
        let waiting = self.known_head > self.max_known();
        if !blocked && !waiting {
            self.hole = None;
            self.schedule(self.config.resync_interval);
            return;
        }
        let at = self.frontier + 1;
        let hole = match &mut self.hole {
            Some(hole) if hole.at == at => hole,
            _ => self.hole.insert(Hole {
                at,
                since: now,
                poll: self.config.gap_poll,
            }),
        };
        let due = self.next_poll <= now;
        let poll = hole.poll;
        if due {
            // Back off only as polls actually happen, not per commit seen meanwhile.
            hole.poll = (hole.poll * 2).min(self.config.resync_interval);
        }
        let outlived_grace = now.duration_since(hole.since) >= self.config.gap_grace;
        // Only a hole with a committed row above it blocks anyone; a hole at the top is left to
        // its writer until something commits above it.
        if blocked && outlived_grace && self.resolver.is_none() && self.above_head.is_none() {
            let upto = self.known_head.max(self.max_known());
            let resolver = Resolver {
                pool: self.shared.pool.clone(),
                poll: self.config.gap_poll,
                max_poll: self.config.resync_interval,
                timeout: self.config.gap_fill_timeout,
            };
            tracing::debug!(
                from = at,
                upto,
                "hole outlived the grace; proving it abandoned"
            );
            metrics::counter!(m::GAP_WAITS).increment(1);
            let handle = spawn_owned("insert_lane.resolver", async move {
                resolver.resolve(at, upto).await
            });
            self.resolver = Some((at, handle));
        }
        if due {
            self.schedule(poll);
        }
    }

    /// The frontier waits on a hole above the sequence head, behind rows no publish wrote.
    /// They are reported, once each, and left alone: the lane fills nothing above the head, so
    /// it writes no placeholder that a later publish would collide with.
    fn rows_above_head(&mut self, head: u64, rows: &[(u64, uuid::Uuid)]) {
        self.above_head = Some(head);
        // Forget them: an operator may delete them, and a writer later commit a real row at
        // the same sequence, which must then be read, not the forged row held here. Rows above
        // the head are read again once writers have drawn up to them.
        if self.frontier >= head {
            self.pending.retain(|sequence, _| *sequence <= head);
            self.known_head = head;
            // Nothing is waited on below the head: the next look is an idle one, which reads
            // the head and fetches nothing until it moves.
            self.hole = None;
        }
        let new: Vec<String> = rows
            .iter()
            .filter(|(sequence, _)| *sequence > self.reported_above)
            .map(|(sequence, id)| format!("sequence {sequence} (id {id})"))
            .collect();
        if let Some((highest, _)) = rows.last() {
            self.reported_above = self.reported_above.max(*highest);
        }
        if !new.is_empty() {
            tracing::warn!(
                head,
                rows = %new.join(", "),
                "ordo.events has rows above the sequence head that no publish wrote (inserted \
                 with an explicit sequence, or the sequence was set back); the insert lane waits \
                 at the head instead of filling placeholders up to them, and a publish that \
                 draws one of their sequences will fail with a duplicate key: delete the rows, \
                 or move the sequence past them with setval"
            );
        }
    }

    fn schedule(&mut self, after: Duration) {
        let at = Instant::now() + after;
        if self.next_poll <= Instant::now() || at < self.next_poll {
            self.next_poll = at;
        }
    }
}

async fn wait_resolver(
    resolver: &mut Option<(u64, JoinHandle<Result<Resolution>>)>,
) -> Result<Result<Resolution>, tokio::task::JoinError> {
    match resolver {
        Some((_, handle)) => handle.await,
        None => std::future::pending().await,
    }
}
