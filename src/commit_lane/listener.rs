//! The public commit-lane stream: dense commit sequences, each once, from the log this process
//! appended (events from the insert lane's cache) or, further behind, from the log joined to
//! the events by pages.

use std::sync::Arc;

use futures::stream::BoxStream;
use serde::de::DeserializeOwned;
use sqlx::{Connection, Row};
use tokio::sync::watch;

use super::sql::PAGE;
use super::{CommitShared, LogEntry};
use crate::envelope::{CommitOrderedEnvelope, Envelope};
use crate::error::{Error, Result};
use crate::insert_lane::LaneShared;
use crate::insert_lane::cache::Decoded;
use crate::insert_lane::rows::{check_retention_floor, decode_full};
use crate::listener::{BatchSource, retrying_stream};
use crate::position::{CommitSequence, EventSequence, Ordering};
use crate::task::StopSignal;
use crate::telemetry::metrics as m;

/// The stream returned by [`Outbox::listen_committed`](crate::Outbox::listen_committed).
///
/// Items carry commit sequences that increase by exactly one each time: no hole, no repeat.
///
/// # Errors a stream yields
///
/// As for [`EventStream`](crate::EventStream): [`Error::UndecodablePayload`] (the stream goes
/// on), [`Error::BelowRetentionFloor`], [`Error::MissingCommitLog`] (a log row, or its event,
/// is gone) and permanent [`Error::Database`] failures (schema not migrated, permission
/// denied, pool closed), after which the stream ends. Transient failures (connection lost,
/// server restarting, pool timeout, serialization failure, I/O) are retried at the same
/// position with backoff, logged at WARN and counted in `ordo_stream_retries_total`; they are
/// never yielded.
pub type CommitStream<P> = BoxStream<'static, Result<CommitOrderedEnvelope<P>, Error>>;

const LOG_BATCH: usize = 512;

/// How long a reader waits between checks while positions the log went back below are
/// neither settled nor found given to other events (the fold appends them again).
const GONE_BACK_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);

pub(crate) struct CommitReader<P> {
    lane: Arc<LaneShared<P>>,
    commit: Arc<CommitShared>,
    head: watch::Receiver<u64>,
    stop: StopSignal,
    next: u64,
    /// See the insert lane's reader: the start is checked against the retention floor once.
    floor_checked: bool,
    /// The most rows a page read from the table holds (besides the lane's page size).
    limit: usize,
    /// Whether it has ended with the outbox's rewind error (once; then `None`).
    told_rewind: bool,
    /// See [`check_head`](Self::check_head): done once, before the first read.
    head_checked: bool,
    /// Set for a listener that takes positions promised before their append
    /// ([`promised`](super::promised)): a watch of the highest one.
    promised: Option<watch::Receiver<u64>>,
}

/// One log position as the reader found it: the entry, and its event or why it did not decode.
pub(crate) struct CommitItem<P> {
    pub(crate) entry: LogEntry,
    pub(crate) event: Decoded<P>,
}

type Item<P> = CommitItem<P>;

impl<P> CommitItem<P> {
    /// The public form of this item.
    pub(crate) fn into_public(self) -> Result<CommitOrderedEnvelope<P>> {
        match self.event {
            Ok(event) => Ok(envelope(self.entry, event)),
            Err(row) => Err(Error::UndecodablePayload {
                sequence: EventSequence::new(self.entry.sequence),
                source: Arc::clone(&row.error),
            }),
        }
    }
}

impl<P> CommitReader<P>
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    pub(crate) fn new(
        lane: Arc<LaneShared<P>>,
        commit: Arc<CommitShared>,
        stop: StopSignal,
        after: u64,
    ) -> Self {
        let head = commit.follow_head();
        Self {
            lane,
            commit,
            head,
            stop,
            next: after + 1,
            floor_checked: false,
            limit: usize::MAX,
            told_rewind: false,
            head_checked: false,
            promised: None,
        }
    }

    /// Takes this process's own transactions at the positions the sequencer here promised,
    /// before their append ([`promised`](super::promised)).
    pub(crate) fn taking_promises(mut self) -> Self {
        self.promised = Some(self.commit.promised.subscribe());
        self
    }

    /// Caps each page read from the table at `limit` rows (at least one) from now on.
    pub(crate) fn set_limit(&mut self, limit: usize) {
        self.limit = limit.max(1);
    }

    /// The next run of the log, waiting when caught up; `None` once the outbox stops.
    pub(crate) async fn next_batch(&mut self) -> Option<Result<Vec<Item<P>>>> {
        loop {
            // A rewind stops the outbox a moment after it is reported: not one position more.
            if self.stop.is_stopped() || self.commit.went_back.reported() {
                return self.ended();
            }
            if !self.floor_checked {
                if let Err(error) =
                    check_retention_floor(&self.lane.pool, Ordering::Commit, self.next).await
                {
                    return Some(Err(error));
                }
                self.floor_checked = true;
            }
            if !self.head_checked {
                if let Err(error) = self.check_head().await {
                    return Some(Err(error));
                }
                self.head_checked = true;
            }
            if self.commit.went_back.pending() {
                // The log went back below positions this process saw: nothing is served
                // until they are checked (the rewind ends this reader above), or appended
                // again to the same events.
                if let Err(error) = self.commit.went_back.check(&self.lane.pool).await {
                    return Some(Err(error));
                }
                if self.commit.went_back.pending() {
                    tokio::select! {
                        biased;
                        _ = self.stop.stopped() => return self.ended(),
                        _ = tokio::time::sleep(GONE_BACK_PAUSE) => {}
                    }
                }
                continue;
            }
            let head = *self.head.borrow_and_update();
            if self.next <= head {
                let cached = self.read_cached(head);
                if !cached.is_empty() {
                    self.commit.went_back.returned(self.next - 1);
                    return Some(Ok(cached));
                }
                let read = self.read_table(head).await;
                if let Ok(items) = &read {
                    // The cache then holds what this process returned, where it does not fold
                    // too: what a log that went back is checked against.
                    let entries: Vec<LogEntry> = items.iter().map(|item| item.entry).collect();
                    self.commit.remember(&entries);
                    self.commit.went_back.returned(self.next - 1);
                }
                return Some(read);
            }
            if let Some(promised) = self.promised.as_mut() {
                promised.borrow_and_update();
                let items = self.read_promised();
                if !items.is_empty() {
                    self.commit.went_back.returned(self.next - 1);
                    return Some(Ok(items));
                }
            }
            let promised = async {
                match self.promised.as_mut() {
                    Some(promised) => promised.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = self.stop.stopped() => return self.ended(),
                changed = self.head.changed() => if changed.is_err() { return None },
                open = promised => if !open { return None },
            }
        }
    }

    /// A reader that starts behind the head this process knows (a subscription or a relay
    /// resuming from its stored position, after a claim) reads the stored head first. After a
    /// failover the process's caches still hold the positions it saw on the old server, and
    /// the stored position (the promoted server's) may lie below them: reading them from the
    /// caches before anything in the process read the lower head would hand on the old
    /// server's events, lost or not, as the positions' (a relay would send them again, with
    /// the new server's history). Reading the head first makes the process check them
    /// ([`went_back`](super::went_back)) before anything is served.
    async fn check_head(&self) -> Result<()> {
        if self.next > self.commit.head() {
            return Ok(());
        }
        let stored = super::read_head(&self.lane.pool).await?;
        self.commit.publish_head(stored.get());
        Ok(())
    }

    /// The end of a stopped outbox's reader: the rewind error once if that stopped it, then
    /// nothing.
    fn ended(&mut self) -> Option<Result<Vec<Item<P>>>> {
        if self.told_rewind {
            return None;
        }
        self.told_rewind = true;
        self.lane.rewind.error().map(Err)
    }

    /// Serves from the log cache and the insert lane's cache, up to the first miss.
    fn read_cached(&mut self, head: u64) -> Vec<Item<P>> {
        let mut entries = Vec::new();
        if let Ok(log) = self.commit.log.read() {
            log.read(self.next, LOG_BATCH, &mut entries);
        }
        self.with_events(entries, head)
    }

    /// The items for `entries` (a run from the reader's next position) with their events from
    /// the insert lane's cache, up to the first that is not next, is past `through`, or whose
    /// event the cache does not hold.
    fn with_events(&mut self, entries: Vec<LogEntry>, through: u64) -> Vec<Item<P>> {
        let mut out = Vec::with_capacity(entries.len());
        let Ok(cache) = self.lane.cache.read() else {
            return out;
        };
        for entry in entries {
            if entry.commit_seq != self.next || entry.commit_seq > through {
                break;
            }
            let Some(slot) = cache.get(entry.sequence) else {
                break;
            };
            let Some(event) = slot.item.into_event() else {
                break;
            };
            out.push(CommitItem { entry, event });
            self.next += 1;
        }
        out
    }

    /// Serves promised positions above the head, with their events from the insert lane's
    /// cache, up to the first miss (a miss waits for the append).
    fn read_promised(&mut self) -> Vec<Item<P>> {
        let mut entries = Vec::new();
        self.commit
            .promised
            .read(self.next, LOG_BATCH, &mut entries);
        self.with_events(entries, u64::MAX)
    }

    async fn read_table(&mut self, head: u64) -> Result<Vec<Item<P>>> {
        match self.read_log(head).await {
            Err(Error::MissingCommitLog { missing }) => {
                check_retention_floor(&self.lane.pool, Ordering::Commit, missing.get()).await?;
                // Above the durable head, the row is not deleted but not yet re-appended: a
                // crash lost the sequencer's last (asynchronous) appends after we saw them.
                let durable = super::read_head(&self.lane.pool).await?;
                if missing > durable {
                    return Err(Error::CommitLogBehind { missing, durable });
                }
                // The re-append may have landed between the page and the head: look once more.
                self.read_log(head).await
            }
            other => other,
        }
    }

    async fn read_log(&mut self, head: u64) -> Result<Vec<Item<P>>> {
        // The log is dense: a page never needs a range wider than its size (see the insert
        // lane's reader for why the bound matters to the plan).
        let page = self.lane.page_size.min(self.limit);
        let upto = head.min(self.next - 1 + page as u64);
        let mut conn = self.lane.pool.acquire().await?;
        let rows = sqlx::query(PAGE)
            .bind(CommitSequence::new(self.next - 1))
            .bind(CommitSequence::new(upto))
            .bind(i64::try_from(page).unwrap_or(i64::MAX))
            .fetch_all(&mut *conn)
            .await?;
        // As for the insert lane's pages: a large payload read would pin its size in this
        // pooled connection's buffers for good.
        let read: usize = rows
            .iter()
            .map(|row| {
                row.try_get_raw("payload")
                    .map_or(0, |v| v.as_bytes().map_or(0, <[u8]>::len))
            })
            .sum();
        if read > crate::insert_lane::rows::SHRINK_AFTER_BYTES {
            conn.shrink_buffers();
        }
        drop(conn);
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let commit_seq = row.try_get::<CommitSequence, _>("commit_seq")?.get();
            if commit_seq != self.next {
                return Err(Error::MissingCommitLog {
                    missing: CommitSequence::new(self.next),
                });
            }
            let entry = LogEntry {
                commit_seq,
                sequence: row.try_get::<EventSequence, _>("sequence")?.get(),
                group_last: row.try_get("group_last")?,
            };
            let slot = decode_full::<P>(row)?;
            let Some(event) = slot.item.into_event() else {
                return Err(Error::MissingCommitLog {
                    missing: CommitSequence::new(commit_seq),
                });
            };
            out.push(CommitItem { entry, event });
            self.next += 1;
        }
        if out.is_empty() {
            return Err(Error::MissingCommitLog {
                missing: CommitSequence::new(self.next),
            });
        }
        Ok(out)
    }
}

fn envelope<P>(entry: LogEntry, event: Arc<Envelope<P>>) -> CommitOrderedEnvelope<P> {
    CommitOrderedEnvelope {
        commit_sequence: CommitSequence::new(entry.commit_seq),
        boundary: entry.group_last,
        event,
    }
}

impl<P> BatchSource for CommitReader<P>
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    type Item = CommitItem<P>;
    const LANE: &'static str = "commit";

    async fn next_batch(&mut self) -> Option<Result<Vec<CommitItem<P>>>> {
        CommitReader::next_batch(self).await
    }

    fn position(&self) -> u64 {
        self.next - 1
    }

    fn stop_signal(&self) -> StopSignal {
        self.stop.clone()
    }
}

pub(crate) fn stream<P>(reader: CommitReader<P>) -> CommitStream<P>
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    // One handle per stream, not a registry lookup per event.
    let latency = metrics::histogram!(m::DELIVERY_LATENCY, "lane" => "commit");
    retrying_stream(reader, move |item| {
        if let Ok(event) = &item.event {
            latency.record(m::since(event.recorded_at));
        }
        Some(item.into_public())
    })
}
