//! An event id belongs to the first event stored with it. A relay sends an event's id as the
//! message id, and receivers deduplicate by it (JetStream's duplicate window, an inbox, a
//! webhook endpoint's unique index), so a second event carrying an id already taken would
//! displace the first wherever it arrives first: a publisher inserting a copy of another
//! event's id, sent while the real event waited behind a parked one, had JetStream drop the
//! real event as a duplicate, and the relay counted it delivered.
//!
//! So before a batch flies, its ids are looked up in `ordo.events`: an event whose id a real
//! event at a lower insert sequence also holds is **refused**, never sent. It is done (the
//! relay's position passes it, as a placeholder's), logged at ERROR with both sequences, and
//! counted as `ordo_relay_events_total{result="refused"}`; `ordo relay attempts` says so. The
//! first event with the id goes out as usual, whichever lane position comes first.
//!
//! Why here and not a unique index: `ordo.events` is partitioned by sequence, and PostgreSQL
//! enforces uniqueness across range partitions only on keys that include the partition key.
//! A side table of ids kept by a trigger would make it unique, at a write per event on the
//! publish path: measured on this schema (2026-12-07, one session, A B B A), server time per
//! event +10 to +17 µs with `gen_random_uuid()` ids (+3.5 to +10 µs with time-ordered ones),
//! WAL per event 440 → 615 bytes (1,600 after a checkpoint with random ids), plus a delete per
//! event when retention drops a partition and a backfill of every stored id when migrating.
//! This check costs one read per batch instead (an index probe per id and partition), and
//! covers rows plain-SQL publishers insert with any id. What it cannot tell: an id a publisher
//! could predict (derived from a domain key) and stored *before* the real event is the first
//! one, and the real event is refused; no check can tell those apart.

use std::collections::HashMap;

use tokio::time::Instant;

use super::Sink;
use super::message::Message;
use super::runner::{BLAMELESS_RETRY, RelayRunner, Work};
use crate::consumer::lanes::Slot;
use crate::telemetry::metrics as m;

/// For each event of a batch (`$1` ids, `$2` their insert sequences) whose id a real event at a
/// lower sequence also holds: its sequence and the lowest such sequence. One index scan per
/// partition with the whole array (materialised, so no nested loop probes the array per row),
/// then the few rows found matched to the batch.
pub(crate) const REUSED: &str = r#"
WITH held AS MATERIALIZED (
    SELECT e.id, e.sequence FROM ordo.events AS e
    WHERE e.id = ANY ($1::uuid[]) AND e.payload IS NOT NULL
)
SELECT b.sequence, min(h.sequence) AS first
FROM unnest($1::uuid[], $2::bigint[]) AS b(id, sequence)
JOIN held AS h ON h.id = b.id AND h.sequence < b.sequence
GROUP BY b.sequence
"#;

impl<K: Sink> RelayRunner<K> {
    /// The batch without the events whose id an earlier event holds (see the module docs);
    /// those are done. `None` when nothing is left to send: every event was refused, or the
    /// lookup failed, and then the whole batch is released (no attempt counted) and tried
    /// again shortly: an event is never sent unchecked.
    pub(super) async fn refuse_reused_ids(
        &mut self,
        work: &mut Work,
        slots: Vec<Slot>,
        messages: Vec<Message>,
    ) -> Option<(Vec<Slot>, Vec<Message>)> {
        let ids: Vec<uuid::Uuid> = messages.iter().map(|message| message.id).collect();
        let sequences: Vec<i64> = messages
            .iter()
            .map(|message| i64::try_from(message.sequence.get()).unwrap_or(i64::MAX))
            .collect();
        let found: Result<Vec<(i64, i64)>, sqlx::Error> = sqlx::query_as(REUSED)
            .bind(&ids)
            .bind(&sequences)
            .fetch_all(&self.core.pool)
            .await;
        let reused: HashMap<i64, i64> = match found {
            Ok(rows) if rows.is_empty() => return Some((slots, messages)),
            Ok(rows) => rows.into_iter().collect(),
            Err(error) => {
                let why = format!("looking up the batch's event ids failed: {error}");
                tracing::warn!(relay = %self.config.name, %error, "looking up a batch's event ids before sending failed: the batch is tried again shortly");
                let at = Instant::now() + BLAMELESS_RETRY;
                for slot in slots {
                    let attempts = work
                        .schedule
                        .lanes
                        .entry(slot)
                        .map_or(0, |entry| entry.attempts);
                    work.schedule
                        .lanes
                        .back_off(slot, attempts, why.clone(), at);
                }
                return None;
            }
        };
        let mut kept = (Vec::with_capacity(slots.len()), Vec::new());
        for (slot, message) in slots.into_iter().zip(messages) {
            let sequence = i64::try_from(message.sequence.get()).unwrap_or(i64::MAX);
            let Some(first) = reused.get(&sequence) else {
                kept.0.push(slot);
                kept.1.push(message);
                continue;
            };
            tracing::error!(
                relay = %self.config.name,
                position = message.position,
                sequence,
                id = %message.id,
                first,
                "an event carries the id of an earlier event (the one at sequence {first}): refused, never sent, so that receivers deduplicating by id never drop the first for it (a copy inserted by a publisher, or a retry of a commit that took effect)"
            );
            work.isolation.remove(&message.position);
            work.schedule.lanes.complete(slot);
        }
        let refused = reused.len();
        metrics::counter!(m::RELAY_EVENTS, "relay" => self.config.name.clone(), "result" => "refused")
            .increment(refused as u64);
        (!kept.0.is_empty()).then_some(kept)
    }
}
