//! [`Outcomes`]: what a sink knows of each message of its batch, kept however `send` ends.

use super::SendError;
#[cfg(doc)]
use super::Sink;

/// What [`Sink::send`] knows of each message of its batch, filled in by the sink as it learns
/// it: one slot per message, in the batch's order, each empty until the sink
/// [reports](Outcomes::report) the message delivered or failed.
///
/// The relay reads it **after `send` ended, however it ended**: returned, cancelled by the
/// batch deadline, or unwound by a panic. So an outcome reported is never lost with the rest
/// of the batch: a delivered message stays delivered, a failed one counts its attempt, and
/// only the messages still empty are released (see the trait's contract).
///
/// ```
/// use ordo::relay::{Message, Outcomes, SendError};
///
/// let batch = [Message::new(&b"{}"[..]), Message::new(&b"{}"[..])];
/// let mut outcomes = Outcomes::new(batch.len());
/// outcomes.delivered(0);
/// assert!(outcomes.get(0).is_some_and(Result::is_ok));
/// assert!(outcomes.get(1).is_none(), "not known yet");
/// outcomes.failed(1, SendError::transient("the endpoint answered 503"));
/// assert!(!outcomes.all_delivered());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcomes {
    slots: Vec<Option<Result<(), SendError>>>,
}

impl Outcomes {
    /// Empty outcomes for a batch of `len` messages.
    pub fn new(len: usize) -> Self {
        Self {
            slots: vec![None; len],
        }
    }

    /// Message `index` of the batch was delivered: the receiver took responsibility for it.
    pub fn delivered(&mut self, index: usize) {
        self.report(index, Ok(()));
    }

    /// Message `index` of the batch failed with `error` (blamed on that message alone).
    pub fn failed(&mut self, index: usize, error: SendError) {
        self.report(index, Err(error));
    }

    /// Message `index`'s outcome. A later report replaces an earlier one; an index past the
    /// batch is ignored (and logged): it names no message.
    pub fn report(&mut self, index: usize, outcome: Result<(), SendError>) {
        match self.slots.get_mut(index) {
            Some(slot) => *slot = Some(outcome),
            None => tracing::warn!(
                index,
                batch = self.slots.len(),
                "a sink reported an outcome for a message its batch does not hold"
            ),
        }
    }

    /// Message `index`'s outcome, if reported.
    pub fn get(&self, index: usize) -> Option<&Result<(), SendError>> {
        self.slots.get(index).and_then(Option::as_ref)
    }

    /// Whether message `index` has an outcome.
    pub fn is_known(&self, index: usize) -> bool {
        self.get(index).is_some()
    }

    /// The number of messages (reported or not).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Whether every message was reported delivered.
    pub fn all_delivered(&self) -> bool {
        self.slots.iter().all(|slot| matches!(slot, Some(Ok(()))))
    }

    /// Each message's outcome, in the batch's order (`None`: not reported).
    pub fn iter(&self) -> impl Iterator<Item = Option<&Result<(), SendError>>> {
        self.slots.iter().map(Option::as_ref)
    }

    /// The outcomes, one per message, in the batch's order.
    pub fn into_vec(self) -> Vec<Option<Result<(), SendError>>> {
        self.slots
    }
}
