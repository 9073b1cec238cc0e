//! [`Delivery`]: an event as a subscription's handler receives it, with where it stands.

use std::ops::Deref;
use std::sync::Arc;

use crate::envelope::Envelope;
use crate::position::CommitSequence;
use crate::position::Position;

/// One event handed to a [`Subscriber`](crate::Subscriber), with its place on the
/// subscription's lane and the attempt this call is.
///
/// It dereferences to the [`Envelope`], so `delivery.payload` and `delivery.id` read as they
/// would on the event itself; [`event`](Self::event) is the shared `Arc` to keep past the call.
///
/// Build one by hand to unit-test a handler without a database:
///
/// ```
/// use ordo::{CommitSequence, Delivery, Envelope, Position};
///
/// # #[derive(Debug)] struct Deposited { cents: i64 }
/// let delivery = Delivery::new(Envelope::new(Deposited { cents: 250 }))
///     .with_position(Position::Commit(CommitSequence::new(9)))
///     .with_ends_group(false)
///     .with_attempt(2);
/// assert_eq!(delivery.payload.cents, 250);
/// assert_eq!(delivery.commit_sequence(), Some(CommitSequence::new(9)));
/// assert!(!delivery.ends_group());
/// assert_eq!(delivery.attempt(), 2);
/// ```
#[derive(Debug)]
pub struct Delivery<P> {
    event: Arc<Envelope<P>>,
    position: Position,
    ends_group: bool,
    attempt: u32,
}

impl<P> Clone for Delivery<P> {
    fn clone(&self) -> Self {
        Self {
            event: Arc::clone(&self.event),
            position: self.position,
            ends_group: self.ends_group,
            attempt: self.attempt,
        }
    }
}

impl<P> Delivery<P> {
    /// A first attempt at `event` on the insert lane, at the event's own sequence, ending its
    /// group (as every insert-lane event does). Adjust with the `with_*` methods.
    pub fn new(event: impl Into<Arc<Envelope<P>>>) -> Self {
        let event = event.into();
        Self {
            position: Position::Insert(event.sequence),
            event,
            ends_group: true,
            attempt: 1,
        }
    }

    /// The same delivery at `position` on the subscription's lane.
    pub fn with_position(mut self, position: Position) -> Self {
        self.position = position;
        self
    }

    /// The same delivery, the last event of its source transaction (`true`) or not.
    pub fn with_ends_group(mut self, ends_group: bool) -> Self {
        self.ends_group = ends_group;
        self
    }

    /// The same delivery as attempt `attempt` (1 is the first try).
    pub fn with_attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    /// The event, as the lanes share it: clone the `Arc` to keep it past the call.
    pub fn event(&self) -> &Arc<Envelope<P>> {
        &self.event
    }

    /// The event's position on the subscription's lane: its [`EventSequence`] on the insert
    /// lane, its [`CommitSequence`] on the commit lane. Once this call commits, the
    /// subscription's stored position is this.
    ///
    /// [`EventSequence`]: crate::EventSequence
    pub fn position(&self) -> Position {
        self.position
    }

    /// The event's place in the commit log, on a commit-lane subscription; `None` on the
    /// insert lane.
    pub fn commit_sequence(&self) -> Option<CommitSequence> {
        match self.position {
            Position::Commit(sequence) => Some(sequence),
            Position::Insert(_) => None,
        }
    }

    /// True on the last event of its source transaction in the commit log. Always true on the
    /// insert lane, which does not group.
    pub fn ends_group(&self) -> bool {
        self.ends_group
    }

    /// Which try this is at handling the event: 1 the first time, counted across restarts and
    /// takeovers (failed attempts are stored with the subscription). After an operator's retry
    /// of a dead letter, the dead letter's attempts plus one.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

impl<P> Deref for Delivery<P> {
    type Target = Envelope<P>;

    fn deref(&self) -> &Envelope<P> {
        &self.event
    }
}
