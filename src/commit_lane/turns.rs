//! Whose turn it is to append a plan: this sequencer's, or a peer's it yields to.
//!
//! Every process may append any group, but racing for each append cost both: the loser's
//! statement waits on the winner's row lock, is refused, and reads what the winner wrote, and a
//! process that lost the race for its *own* writer's transaction delivered it a peer's append
//! plus two round trips late (two folding processes: p99 7.5–14 ms at 500 tx/s, against 3 ms
//! with one). So a sequencer that has lost the compare-and-set once *yields*: it leaves every
//! group to the peer that won and reads what that peer appended (a read, polled with a growing
//! pause), which makes the winner a soft leader. Its own process's groups it leaves for at most
//! [`OWN_GRACE`]; other processes' groups for at most [`PEER_GRACE`] (those the leader learns
//! of no later than this process does). If no peer has covered them by then (the peer stopped,
//! crashed, stalled, or runs no sequencer), it appends them itself and stops yielding until it
//! loses again. A yielding sequencer whose leader appends mostly *its* transactions (the
//! leader's own process writes little: at least [`TAKE_BACK_SHARE`] of the last
//! [`TAKE_BACK_WINDOW`] groups the leader appended were this process's) stops yielding too: it
//! learns of those transactions first, so it should lead, and the race it starts hands the lead
//! to it. Without that, a process whose writers publish everything could stay a follower for
//! good after one lost race (a slow start, a pause), and its own commit lane paid a wake-up, a
//! read and an announcement on every event (p50 0.5 ms became 3.5 ms at 500 tx/s).
//! Correctness never depends on this: the compare-and-set still decides every append.

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
/// How long a yielding sequencer leaves its own process's groups to the leader. The leader
/// learns of them a wake-up and a read after this process did, and appends them with the next
/// append it makes; a leader that has not covered them after this long is stopped or stalled,
/// and this process appends them itself (racing it again, which decides anew who leads).
pub(crate) const OWN_GRACE: Duration = Duration::from_millis(10);
/// A yielding sequencer takes the lead back when at least this share (in quarters) of the
/// last [`TAKE_BACK_WINDOW`] groups its leader appended were its own process's transactions.
pub(crate) const TAKE_BACK_SHARE: u32 = 3;
/// How many groups appended by the leader are weighed before deciding to take the lead back.
pub(crate) const TAKE_BACK_WINDOW: u32 = 32;
/// The first look at what a peer appended comes as soon as a plan forms (and again as soon as
/// one of this process's own groups joins it): this process learns of another's commit a
/// wake-up and a read after that process did, by when the peer has most often appended it (a
/// first look 1 ms later added that millisecond to every other process's commit lane). The
/// next looks come after pauses of this long, doubling up to [`PEER_POLL_MAX`].
const PEER_POLL_FIRST: Duration = Duration::from_millis(1);
const PEER_POLL_MAX: Duration = Duration::from_millis(8);

/// What the fold does next with a non-empty plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Append,
    /// Read what peers appended (yielding to them).
    AskPeer,
}

/// A plan waiting for a peer to append it.
struct Waiting {
    /// Since when the plan has waited, and since when it has held a group of this process's.
    since: Instant,
    own_since: Option<Instant>,
    ask_at: Instant,
    pause: Duration,
}

#[derive(Default)]
pub(crate) struct Turns {
    /// Set after a lost compare-and-set: leave groups to the peer that won, for a while.
    yielding: bool,
    waiting: Option<Waiting>,
    /// Groups the leader appended since yielding began (or since the last weighing), and how
    /// many of them were this process's.
    covered: u32,
    covered_own: u32,
}

impl Turns {
    /// When to act on the non-empty `plan`, and how: append once `due`, or, while yielding,
    /// look at what peers appended until the plan's grace has passed ([`OWN_GRACE`] once it
    /// holds a group of this process's, [`PEER_GRACE`] otherwise).
    pub(crate) fn next_step(&mut self, plan: &[Planned], due: Instant) -> (Instant, Step) {
        if !self.yielding {
            return (due, Step::Append);
        }
        let now = Instant::now();
        let wait = self.waiting.get_or_insert_with(|| Waiting {
            since: now,
            own_since: None,
            ask_at: now,
            pause: PEER_POLL_FIRST / 2,
        });
        if wait.own_since.is_none() && plan.iter().any(|group| group.own) {
            // One of ours joined: the leader may have appended it already.
            wait.own_since = Some(now);
            wait.ask_at = now;
            wait.pause = PEER_POLL_FIRST / 2;
        }
        let deadline = match wait.own_since {
            Some(own) => (own + OWN_GRACE).min(wait.since + PEER_GRACE),
            None => wait.since + PEER_GRACE,
        };
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

    /// A peer said it appended past what this process knows: look now.
    pub(crate) fn ask_now(&mut self) {
        if let Some(wait) = self.waiting.as_mut() {
            wait.ask_at = Instant::now();
        }
    }

    /// A peer appended part of the plan: what is left waits afresh from now (the peer lives),
    /// and the pause between looks goes on growing.
    pub(crate) fn peer_moved(&mut self, plan: &[Planned]) {
        if let Some(wait) = self.waiting.as_mut() {
            let now = Instant::now();
            wait.since = now;
            wait.own_since = plan.iter().any(|group| group.own).then_some(now);
        }
    }

    /// The plan was appended or emptied: the next one waits afresh.
    pub(crate) fn settled(&mut self) {
        self.waiting = None;
    }

    /// A peer won the compare-and-set: it folds too.
    pub(crate) fn lost(&mut self) {
        self.yielding = true;
        self.covered = 0;
        self.covered_own = 0;
    }

    /// While yielding, the leader appended `groups` groups, `own` of them this process's.
    /// Every [`TAKE_BACK_WINDOW`] groups, if at least [`TAKE_BACK_SHARE`] quarters were ours,
    /// this sequencer stops yielding: the leader folds mostly for this process's writers.
    pub(crate) fn peer_covered(&mut self, groups: u32, own: u32) {
        if !self.yielding {
            return;
        }
        self.covered = self.covered.saturating_add(groups);
        self.covered_own = self.covered_own.saturating_add(own);
        if self.covered < TAKE_BACK_WINDOW {
            return;
        }
        if self.covered_own.saturating_mul(4) >= self.covered.saturating_mul(TAKE_BACK_SHARE) {
            tracing::debug!(
                groups = self.covered,
                own = self.covered_own,
                "the leader appends mostly this process's transactions; this sequencer leads again"
            );
            self.yielding = false;
            self.waiting = None;
        }
        self.covered = 0;
        self.covered_own = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(xid: i64, own: bool) -> Planned {
        Planned {
            xid,
            low: 1,
            own,
            members: None,
        }
    }

    #[test]
    fn a_sequencer_that_never_lost_appends_when_due() {
        let mut turns = Turns::default();
        let due = Instant::now() + Duration::from_millis(3);
        assert_eq!(
            turns.next_step(&[group(1, false)], due),
            (due, Step::Append)
        );
        assert_eq!(turns.next_step(&[group(1, true)], due), (due, Step::Append));
    }

    #[test]
    fn after_a_loss_even_its_own_groups_are_left_to_the_leader_until_the_own_grace() {
        let mut turns = Turns::default();
        turns.lost();
        let due = Instant::now();
        let plan = [group(1, false), group(2, true)];
        let (at, step) = turns.next_step(&plan, due);
        assert_eq!(
            step,
            Step::AskPeer,
            "a yielding sequencer asks the leader first"
        );
        assert!(at <= Instant::now(), "the first look is at once");
        turns.asked();
        let (later, step) = turns.next_step(&plan, due);
        assert_eq!(step, Step::AskPeer);
        assert!(later > at, "the next look waits");
        std::thread::sleep(OWN_GRACE + Duration::from_millis(1));
        assert_eq!(
            turns.next_step(&plan, due),
            (due, Step::Append),
            "past the grace, the leader is taken for stopped"
        );
        // It appends from now on, until it loses again.
        turns.settled();
        assert_eq!(
            turns.next_step(&[group(3, false)], due),
            (due, Step::Append)
        );
    }

    #[test]
    fn other_processes_groups_wait_for_the_longer_grace() {
        let mut turns = Turns::default();
        turns.lost();
        let before = Instant::now();
        let (at, step) = turns.next_step(&[group(1, false)], before);
        assert_eq!(step, Step::AskPeer);
        assert!(at <= before + PEER_GRACE);
        // One of ours joins: looked for at once, and bounded by the shorter grace.
        turns.asked();
        let (at, step) = turns.next_step(&[group(1, false), group(2, true)], before);
        assert_eq!(step, Step::AskPeer);
        assert!(
            at <= Instant::now(),
            "a group of ours joining is looked for at once"
        );
    }

    #[test]
    fn a_follower_whose_leader_appends_mostly_its_transactions_leads_again() {
        let mut turns = Turns::default();
        turns.lost();
        let due = Instant::now();
        let plan = [group(1, true)];
        assert_eq!(turns.next_step(&plan, due).1, Step::AskPeer);
        // The leader appends for everyone: a third of the groups are ours. Keep yielding.
        for _ in 0..4 {
            turns.peer_covered(TAKE_BACK_WINDOW / 2, TAKE_BACK_WINDOW / 6);
            turns.peer_covered(TAKE_BACK_WINDOW / 2, TAKE_BACK_WINDOW / 6);
            assert_eq!(turns.next_step(&plan, due).1, Step::AskPeer);
        }
        // The leader appends mostly ours: this process learns of them first, so it leads.
        turns.peer_covered(TAKE_BACK_WINDOW - 1, TAKE_BACK_WINDOW - 2);
        assert_eq!(turns.next_step(&plan, due).1, Step::AskPeer);
        turns.peer_covered(1, 1);
        assert_eq!(turns.next_step(&plan, due), (due, Step::Append));
        // Leading, the tally is not kept; a lost race starts a fresh one.
        turns.peer_covered(TAKE_BACK_WINDOW, 0);
        turns.lost();
        turns.peer_covered(TAKE_BACK_WINDOW - 1, TAKE_BACK_WINDOW - 1);
        assert_eq!(turns.next_step(&plan, due).1, Step::AskPeer);
    }

    #[test]
    fn a_leader_that_moves_restarts_the_grace() {
        let mut turns = Turns::default();
        turns.lost();
        let due = Instant::now();
        let plan = [group(2, true)];
        turns.next_step(&plan, due);
        std::thread::sleep(OWN_GRACE + Duration::from_millis(1));
        // The leader appended part of the plan just now: it lives, what is left waits afresh.
        turns.peer_moved(&plan);
        assert_eq!(turns.next_step(&plan, due).1, Step::AskPeer);
        // A peer's announcement: the next look is now.
        turns.asked();
        turns.ask_now();
        assert!(turns.next_step(&plan, due).0 <= Instant::now());
    }
}
