//! The positions the sequencer hands this process's listeners before an append
//! ([`promised`](crate::commit_lane::promised)): how far the plan's positions are known.

use serde::de::DeserializeOwned;

use super::Sequencer;
use crate::commit_lane::LogEntry;
use crate::commit_lane::store::{Planned, Restart};

/// How far the plan's positions are known: its first `groups` groups are promised, and `next`
/// is the last position they take (`None` once a group of unknown size is met: no later group
/// is known before an append).
#[derive(Clone, Copy, Default)]
pub(super) struct Chain {
    groups: usize,
    next: Option<u64>,
}

impl Chain {
    /// How many of the plan's groups are promised.
    pub(super) fn groups(&self) -> usize {
        self.groups
    }

    /// An append takes the plan's first `in_flight` groups: the promised part of the plan now
    /// counts from the groups read during the append; if the append's groups were not all
    /// promised, none read meanwhile can be before it.
    pub(super) fn appending(&mut self, in_flight: usize) {
        if self.groups < in_flight {
            self.next = None;
        }
        self.groups = self.groups.saturating_sub(in_flight);
    }
}

impl<P> Sequencer<P>
where
    P: DeserializeOwned + Send + Sync + 'static,
{
    /// Computes the positions of the plan's groups past those already promised, while each
    /// group's members are known, and hands them to this process's listeners
    /// ([`promised`](crate::commit_lane::promised)): the append, this sequencer's or a peer's,
    /// gives them the same positions.
    ///
    /// Promises are made whether or not a listener takes them now (one may open before the
    /// append lands); each costs a map entry until the append settles it.
    pub(super) fn promise(&mut self, plan: &[Planned]) {
        if !self.promises {
            return;
        }
        let Some(mut next) = self.chain.next else {
            return;
        };
        let mut entries = Vec::new();
        for group in plan.iter().skip(self.chain.groups) {
            let Some(members) = &group.members else {
                self.chain.next = None;
                break;
            };
            for (index, &sequence) in members.iter().enumerate() {
                next += 1;
                entries.push(LogEntry {
                    commit_seq: next,
                    sequence,
                    group_last: index + 1 == members.len(),
                });
            }
            self.chain.groups += 1;
        }
        if self.chain.next.is_some() {
            self.chain.next = Some(next);
        }
        if !entries.is_empty() {
            self.commit.promise(&entries);
        }
    }

    /// Starts the plan's positions again at the head (after an append, a peer's, or a restart
    /// changed the plan), and promises what is known of it.
    pub(super) fn promise_again(&mut self, state: &Restart, plan: &[Planned]) {
        self.chain = Chain {
            groups: 0,
            next: Some(state.head),
        };
        self.promise(plan);
    }
}
