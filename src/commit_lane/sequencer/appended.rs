//! What the sequencer records after an append: the new cursor, the groups that reach above it,
//! and the rows that break the schema contract.

use serde::de::DeserializeOwned;

use super::Sequencer;
use super::peers::PEERS_HEARD;
use crate::commit_lane::LogEntry;
use crate::commit_lane::store::{AppendedEntry, Planned, Restart};
use crate::telemetry::metrics as m;

impl<P> Sequencer<P>
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    /// Takes in the append of `in_flight` (the insert lane up to `covered`) that went through:
    /// the cursor and the skip set move ([`record_appended`]), the entries are published, what
    /// `plan` holds (read during the append) is promised from the new head, and peers are told
    /// while any are heard.
    pub(super) fn took(
        &mut self,
        state: &mut Restart,
        in_flight: &[Planned],
        appended: Vec<AppendedEntry>,
        covered: u64,
        plan: &[Planned],
    ) {
        metrics::counter!(m::FOLD_APPENDS, "result" => "appended").increment(1);
        metrics::counter!(m::FOLD_EVENTS).increment(appended.len() as u64);
        metrics::counter!(m::FOLD_GROUPS).increment(in_flight.len() as u64);
        metrics::gauge!(m::FOLD_LAG).set(self.lane.frontier().saturating_sub(covered) as f64);
        record_appended(state, in_flight, &appended, covered);
        let entries: Vec<LogEntry> = appended.into_iter().map(|a| a.entry).collect();
        let head = entries.last().map_or(state.head, |e| e.commit_seq);
        self.publish(state, head, &entries);
        self.promise_again(state, plan);
        if self.lane.peer_log.heard_within(PEERS_HEARD) {
            self.tell_peers(state);
        }
    }
}

/// Bookkeeping after a successful append: the new cursor, and which appended groups reach
/// above it (their later members will be met and must be skipped). A planned group with no
/// entry was refused by the statement as foreign (see [`APPEND`](crate::commit_lane::sql::APPEND)).
fn record_appended(state: &mut Restart, plan: &[Planned], entries: &[AppendedEntry], covered: u64) {
    state.cursor = covered;
    let mut tops = vec![None::<u64>; plan.len()];
    for appended in entries {
        if let Some(top) = appended.ord.checked_sub(1).and_then(|i| tops.get_mut(i)) {
            *top = Some(top.map_or(appended.entry.sequence, |t| t.max(appended.entry.sequence)));
        }
    }
    for (group, top) in plan.iter().zip(tops) {
        match top {
            Some(top) => {
                state.logged.insert(group.xid, top);
            }
            None => {
                foreign_row(group.low, group.xid);
                state.logged.insert(group.xid, group.low);
            }
        }
    }
    state.logged.retain(|_, top| *top > covered);
}

/// A row that breaks the schema contract: its `commit_xid` names a transaction whose group is
/// already in the log. It is not appended (the commit lane does not carry it); the operator is
/// told which row it is.
pub(super) fn foreign_row(sequence: u64, xid: i64) {
    metrics::counter!(m::CONTRACT_VIOLATIONS, "kind" => "foreign_commit_xid").increment(1);
    tracing::error!(
        sequence,
        commit_xid = xid,
        "ordo.events row at sequence {sequence} carries commit_xid {xid}, a transaction already \
         complete in the commit log: the commit lane leaves it out. Rows must take commit_xid \
         from its column default (see the writer role in docs/operations.md)"
    );
}
