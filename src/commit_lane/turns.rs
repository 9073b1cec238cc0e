//! Whose turn it is to append a plan: this sequencer's, or a peer's it yields to.
//!
//! Every process may append any group, but racing for each append cost both: the loser's
//! statement waits on the winner's row lock, is refused, and reads what the winner wrote, and a
//! process that lost the race for its *own* writer's transaction delivered it a peer's append
//! plus two round trips late (two folding processes: p99 7.5–14 ms at 500 tx/s, against 3 ms
//! with one). So a sequencer that has lost the compare-and-set once *yields*: groups its own
//! process committed it appends at once (it learns of them first, from the writer itself);
//! groups committed elsewhere it leaves to their writers' processes and reads what they
//! appended (a read, polled with a growing pause). If no peer has covered them within
//! [`PEER_GRACE`] (the peer stopped, crashed, or runs no sequencer), it appends them itself and
//! stops yielding until it loses again. Correctness never depends on this: the compare-and-set
//! still decides every append.

use std::time::Duration;

use tokio::time::Instant;

use super::store::Planned;

/// How long a yielding sequencer leaves other processes' groups to them before appending them
/// itself. A live peer appends its writer's transaction within about a round trip of the
/// commit, and this process learns of that transaction later than the peer does (a wake-up and
/// a read), so a peer that has not covered it after this long is stopped or stalled. It bounds
/// the commit lane's extra delay when the appending process dies; it costs nothing while it
/// lives.
pub(crate) const PEER_GRACE: Duration = Duration::from_millis(25);
/// The first look at what a peer appended comes as soon as a plan of its groups forms: this
/// process learns of another's commit a wake-up and a read after that process did, by when the
/// peer has most often appended it (a first look 1 ms later added that millisecond to every
/// other process's commit lane). The next looks come after pauses of this long, doubling up to
/// [`PEER_POLL_MAX`].
const PEER_POLL_FIRST: Duration = Duration::from_millis(1);
const PEER_POLL_MAX: Duration = Duration::from_millis(8);

/// What the fold does next with a non-empty plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Append,
    /// Read what peers appended (yielding to them).
    AskPeer,
}

/// A plan of other processes' groups, waiting for a peer to append it.
struct Waiting {
    since: Instant,
    ask_at: Instant,
    pause: Duration,
}

#[derive(Default)]
pub(crate) struct Turns {
    /// Set after a lost compare-and-set: leave other processes' groups to them for a while.
    yielding: bool,
    waiting: Option<Waiting>,
}

impl Turns {
    /// When to act on the non-empty `plan`, and how: append once `due`, or, while yielding and
    /// the plan holds only other processes' groups, look at what peers appended, until
    /// [`PEER_GRACE`] has passed.
    pub(crate) fn next_step(&mut self, plan: &[Planned], due: Instant) -> (Instant, Step) {
        if !self.yielding || plan.iter().any(|group| group.own) {
            return (due, Step::Append);
        }
        let now = Instant::now();
        let wait = self.waiting.get_or_insert_with(|| Waiting {
            since: now,
            ask_at: now,
            pause: PEER_POLL_FIRST / 2,
        });
        let deadline = wait.since + PEER_GRACE;
        if now >= deadline {
            // No peer covered these groups in time: it stopped, or none folds them.
            tracing::debug!("no peer appended within the grace; this sequencer appends again");
            self.yielding = false;
            return (due, Step::Append);
        }
        (wait.ask_at.min(deadline), Step::AskPeer)
    }

    /// A look at the peers is being taken: the next one comes after a longer pause.
    pub(crate) fn asked(&mut self) {
        if let Some(wait) = self.waiting.as_mut() {
            wait.pause = (wait.pause * 2).min(PEER_POLL_MAX);
            wait.ask_at = Instant::now() + wait.pause;
        }
    }

    /// The plan was appended or emptied: the next one waits afresh.
    pub(crate) fn settled(&mut self) {
        self.waiting = None;
    }

    /// A peer won the compare-and-set: it folds too.
    pub(crate) fn lost(&mut self) {
        self.yielding = true;
    }
}
