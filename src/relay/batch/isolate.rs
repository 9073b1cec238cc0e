//! A message left without an outcome: sent again in smaller and smaller batches, and blamed
//! once alone, so that none is re-sent for ever.

use crate::consumer::lanes::Slot;
use crate::relay::SendError;
use crate::relay::runner::{Verdict, Work};

/// A message left without an outcome in a flight of `flight` messages ([`Verdict::Unresolved`]):
/// sent alone, it is blamed (an attempt counts: nothing but this message was in the way);
/// otherwise it is released, and its next batch holds at most half as many messages as this
/// one did (or as its cap allowed). So a message that never answers is alone after at most
/// ⌈log₂ batch_size⌉ sends, and blamed at the next: never re-sent for ever. The cap stays
/// until it is delivered or parked.
pub(super) fn isolate(work: &mut Work, slot: Slot, verdict: Verdict, flight: usize) -> Verdict {
    let Verdict::Unresolved(why) = verdict else {
        return verdict;
    };
    let Some(position) = work.schedule.lanes.entry(slot).map(|entry| entry.position) else {
        return Verdict::Blameless(why);
    };
    if flight <= 1 {
        work.isolation.insert(position, 1);
        return Verdict::Failed(SendError::transient(format!(
            "{why}, with this event sent alone"
        )));
    }
    let cap = work
        .isolation
        .get(&position)
        .map_or(flight, |&cap| cap.min(flight));
    work.isolation.insert(position, (cap / 2).max(1));
    Verdict::Blameless(why)
}
