//! How long this relay certainly holds its lease, by its own clock: the rule that keeps one
//! key's events from being in flight at two owners.
//!
//! The database stamps a lease as `now() + lease` when it runs the claim or renewal, and
//! another process may claim once the database's clock passes that. The statement runs after
//! the client sent it, so the instant *taken before sending* plus the lease is never later than
//! the stored expiry: until then nobody else can hold the lease, whatever the database or the
//! network did meanwhile (a renewal that stalled, failed, or answered late). A renewal that
//! fails extends nothing; one that answers late extends only from when it was sent.
//!
//! A flight (a batch's reset and send, bounded by one deadline) starts only if it ends, with a
//! [`margin`], before that instant; otherwise the relay renews first, and sends nothing while it
//! cannot. So the old owner's last request has ended before a new owner can claim. What this
//! cannot cover is a process stopped by the operating system mid-request (SIGSTOP, a frozen
//! VM): its open request stays open at the receiver whatever the client's timers say. The
//! receiver's deduplication by message id absorbs the copy it may then take.

use std::time::Duration;

use tokio::time::Instant;

/// What a flight must leave between its deadline and the end of the lease: for the receiver
/// to see the connection of a cut request close, for timers that fire late, and for a database
/// clock that runs a little faster than ours. A twentieth of the lease (1.5 s at the default
/// 30 s).
pub(crate) fn margin(lease: Duration) -> Duration {
    lease / 20
}

/// The instant until which this owner holds the lease, if it holds one.
#[derive(Debug, Default)]
pub(crate) struct Tenure {
    until: Option<Instant>,
    /// A flight waits for a renewal of its own (what is left did not cover it): not tried
    /// again before this, so a database that fails or answers late is not asked in a loop.
    next_try: Option<Instant>,
}

/// A renewal made for a flight that still did not cover it is tried again after this.
const RENEW_AGAIN: Duration = Duration::from_millis(100);

impl Tenure {
    /// The lease was granted (claimed or renewed) by a statement sent at `asked`.
    pub(crate) fn granted(&mut self, asked: Instant, lease: Duration) {
        let until = asked + lease;
        // A renewal answered out of order never shortens what an earlier one proved.
        self.until = Some(self.until.map_or(until, |held| held.max(until)));
    }

    /// Whether a flight may ask for a renewal of its own now.
    pub(crate) fn may_renew(&self, now: Instant) -> bool {
        self.next_try.is_none_or(|at| now >= at)
    }

    /// A renewal for a flight was tried at `now` and did not cover it.
    pub(crate) fn renewal_short(&mut self, now: Instant) {
        self.next_try = Some(now + RENEW_AGAIN);
    }

    /// When a flight waiting for a renewal of its own asks again (only while it is ahead).
    pub(crate) fn wake(&self, now: Instant) -> Option<Instant> {
        self.next_try.filter(|at| *at > now)
    }

    /// The lease is lost or in doubt: nothing may start until it is claimed again.
    pub(crate) fn lost(&mut self) {
        self.until = None;
    }

    /// Whether a flight starting at `now` with `deadline` ends, with the [`margin`], while
    /// the lease is certainly held.
    pub(crate) fn covers(&self, now: Instant, deadline: Duration, lease: Duration) -> bool {
        self.until
            .is_some_and(|until| now + deadline + margin(lease) <= until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flight_starts_only_if_it_ends_before_the_lease_with_the_margin() {
        let lease = Duration::from_secs(30);
        let deadline = Duration::from_secs(25);
        let asked = Instant::now();
        let mut tenure = Tenure::default();
        assert!(
            !tenure.covers(asked, deadline, lease),
            "no lease, no flight"
        );
        tenure.granted(asked, lease);
        assert!(tenure.covers(asked, deadline, lease));
        // 25 s + 1.5 s must fit in what is left: 3.5 s after the renewal was sent, not.
        let later = asked + Duration::from_millis(3_600);
        assert!(!tenure.covers(later, deadline, lease));
        // A late answer to an earlier renewal does not shorten a later one.
        tenure.granted(later, lease);
        tenure.granted(asked, lease);
        assert!(tenure.covers(later, deadline, lease));
        tenure.lost();
        assert!(!tenure.covers(later, deadline, lease));
    }
}
