//! An event id belongs to the first event stored with it. A relay sends an event's id as the
//! message id, and receivers deduplicate by it (JetStream's duplicate window, an inbox, a
//! webhook endpoint's unique index), so a second event carrying an id already taken would
//! displace the first wherever it arrives first: a publisher inserting a copy of another
//! event's id, sent while the real event waited behind a parked one, had JetStream drop the
//! real event as a duplicate, and the relay counted it delivered.
//!
//! So as the relay reads its lane, before an event is admitted, its id is looked up in
//! `ordo.events` (`consumer::reused_ids`, one query per read): an event whose id a real event
//! at a lower insert sequence also holds is **refused**, never sent. It is done (the relay's
//! position passes it, as a skipped type's), in no route chain (the next message of its route
//! names the one before it, so a watermark inbox does not wait for it), logged at ERROR with
//! both sequences, and counted as `ordo_relay_events_total{result="refused"}`; `ordo relay
//! attempts` says so. The first event with the id goes out as usual, whichever lane position
//! comes first. A failed look-up is a failed read: nothing of it is sent unchecked.
//!
//! Why here and not a unique index: `ordo.events` is partitioned by sequence, and PostgreSQL
//! enforces uniqueness across range partitions only on keys that include the partition key.
//! A side table of ids kept by a trigger would make it unique, at a write per event on the
//! publish path: measured on this schema (2026-12-07, one session, A B B A), server time per
//! event +10 to +17 µs with `gen_random_uuid()` ids (+3.5 to +10 µs with time-ordered ones),
//! WAL per event 440 → 615 bytes (1,600 after a checkpoint with random ids), plus a delete per
//! event when retention drops a partition and a backfill of every stored id when migrating.
//! This check costs one read per read of the lane instead (an index probe per id and
//! partition), and
//! covers rows plain-SQL publishers insert with any id. What it cannot tell: an id a publisher
//! could predict (derived from a domain key) and stored *before* the real event is the first
//! one, and the real event is refused; no check can tell those apart.

use super::Sink;
use super::runner::RelayRunner;
use crate::consumer::source::Item;
use crate::telemetry::metrics as m;

impl<K: Sink> RelayRunner<K> {
    /// Logs and counts an event its source refused (see the module docs).
    pub(super) fn refused(&self, item: &Item<super::RawPayload>, first: u64) {
        let id = item.event.as_ref().map(|event| event.id).ok();
        tracing::error!(
            relay = %self.config.name,
            position = item.position.get(),
            sequence = item.sequence.get(),
            id = ?id,
            first,
            "an event carries the id of an earlier event (the one at sequence {first}): refused, never sent, so that receivers deduplicating by id never drop the first for it (a copy inserted by a publisher, or a retry of a commit that took effect)"
        );
        metrics::counter!(m::RELAY_EVENTS, "relay" => self.config.name.clone(), "result" => "refused")
            .increment(1);
    }
}
