//! When the sequencer's next append starts, and how many groups it gathers: [`Pacer`], which
//! holds every input of that decision (the fold settings, how the last appends went, whether
//! anyone waits for the log) and every constant that shapes it. Pure, with no I/O, tested here
//! and in [`cadence`]. Whose turn the append is, this sequencer's or a peer's it yields to, is
//! decided after the pacer's answer, in [`turns`](crate::commit_lane::turns): the pacer says
//! when, turns says who.
//!
//! How each constant was chosen, with the measurements: `docs/performance-history.md`,
//! "Sequencer pacing: how its constants were chosen".

use std::time::Duration;

use tokio::time::Instant;

use crate::config::OutboxConfig;

mod cadence;

use cadence::Cadence;

/// While a listener takes early positions, a gathering ends once the plan holds this many groups
/// (or a full plan, if fewer): a long append takes the machine just when those listeners' next
/// groups come (appends of up to 1,024 groups raised their p99 from 3.6–5.2 ms to 4.5–8.3 ms
/// under eight writers, 2026-12-06, `812d1fb`). With no such listener, nobody's clock runs
/// through an append, and a gathering waits for a full plan.
pub(super) const GATHER_GROUPS: usize = 256;

/// When the sequencer's next append starts, and how many groups it gathers for it.
///
/// The sequencer asks it, each time it has a plan, when the plan's append may start
/// ([`Self::pace`]); tells it when an append ran ([`Self::appended`]) and when an empty plan met
/// its first group ([`Self::met`]); and asks it how much to read at a time
/// ([`Self::read_limit`]) and whether the plan is full ([`Self::is_full`]).
pub(super) struct Pacer {
    /// `fold_batch`: how many groups (one a transaction) fill the plan.
    full: usize,
    /// `fold_interval`: the least time between the starts of two appends.
    interval: Duration,
    /// `unwatched_append_spacing`: how far apart appends start while nobody waits for the log
    /// (zero: they never gather).
    unwatched: Duration,
    /// How the last appends went.
    cadence: Cadence,
    /// When the next append may start by the cadence: `fold_interval` after the last one
    /// started, spaced under a stream while no peer folds, and no sooner than the last one took
    /// after it ended. A transaction arriving after a quiet spell is appended at once.
    due: Instant,
}

/// When a plan's append may start ([`Pacer::pace`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Pace {
    pub(super) at: Instant,
    /// Later than the cadence alone would start it, because nobody waits for the log: whoever
    /// starts waiting ends the gathering, so the sequencer listens for them meanwhile.
    pub(super) gathering: bool,
}

impl Pacer {
    /// A pacer with `config`'s fold settings (`fold_batch`, `fold_interval`,
    /// `unwatched_append_spacing`).
    pub(super) fn new(config: &OutboxConfig) -> Self {
        Self {
            full: config.fold_batch,
            interval: config.fold_interval,
            unwatched: config.unwatched_append_spacing,
            cadence: Cadence::default(),
            due: Instant::now(),
        }
    }

    /// A fold starts (or starts again after a failure): no append is known before the next,
    /// which may start at once.
    pub(super) fn start_over(&mut self) {
        self.cadence = Cadence::default();
        self.due = Instant::now();
    }

    /// The most insert-lane positions one read takes: as many as fill the plan with groups, so
    /// that no read plans more groups than that (each group met takes a position of its own).
    pub(super) fn read_limit(&self) -> usize {
        self.full
    }

    /// Whether a plan of `groups` groups is full: while an append runs, the sequencer reads no
    /// further ahead once the next plan is.
    pub(super) fn is_full(&self, groups: usize) -> bool {
        groups >= self.full
    }

    /// How many groups a gathering waits for at most (within the unwatched spacing): a full
    /// plan, or [`GATHER_GROUPS`] if fewer while a listener takes early positions (`listened`).
    /// With no such listener, one append a second costs the server less than eight (one writer
    /// back to back makes about 2,000 transactions a second; 2026-12-06, `9c9f888`).
    fn gather_size(&self, listened: bool) -> usize {
        if listened {
            self.full.min(GATHER_GROUPS)
        } else {
            self.full
        }
    }

    /// When the append of a plan of `groups` groups may start: when due, or, while nobody waits
    /// for the log (`watched` is false) and the plan holds fewer groups than a gathering waits
    /// for, no sooner than the unwatched spacing after the last append started. A first group
    /// after a quiet spell longer than that is still appended at once. `listened`: a listener
    /// takes early positions. `watched` is asked only when the answer depends on it.
    ///
    /// With nobody waiting, the log is for readers yet to come, and each append costs the server
    /// a transaction that the writers' next commits wait behind now and then (one writer back to
    /// back: a transaction p99 of 0.78–1.06 ms with appends 1 s apart, as with the commit lane
    /// off, against 1.20–1.28 ms with 25 ms; 2026-12-06, `812d1fb`).
    pub(super) fn pace(
        &self,
        groups: usize,
        listened: bool,
        watched: impl FnOnce() -> bool,
    ) -> Pace {
        let at = if self.unwatched.is_zero() || groups >= self.gather_size(listened) || watched() {
            self.due
        } else {
            self.cadence
                .last_started()
                .map_or(self.due, |started| self.due.max(started + self.unwatched))
        };
        Pace {
            at,
            gathering: at > self.due,
        }
    }

    /// The plan, empty until now, met its first group `at`: it goes into the next append.
    pub(super) fn met(&mut self, at: Instant) {
        self.cadence.met(at);
    }

    /// An append of `groups` groups ran from `started` to `ended`; `peers`: other processes'
    /// sequencers were heard folding since (their commit lanes are not spaced for, see
    /// [`cadence::STREAM_SPACING`]). Sets when the next may start.
    pub(super) fn appended(
        &mut self,
        started: Instant,
        ended: Instant,
        groups: usize,
        peers: bool,
    ) {
        self.cadence.peers = peers;
        self.due = self.cadence.next_due(started, ended, groups, self.interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const UNWATCHED: Duration = Duration::from_millis(25);

    fn pacer_with(config: OutboxConfig) -> Pacer {
        let mut pacer = Pacer::new(&config);
        pacer.start_over();
        pacer
    }

    fn alone(pacer: &Pacer, groups: usize, listened: bool) -> Pace {
        pacer.pace(groups, listened, || false)
    }

    #[test]
    fn while_nobody_waits_appends_start_at_most_every_unwatched_spacing() {
        let mut pacer = pacer_with(OutboxConfig::default().unwatched_append_spacing(UNWATCHED));
        // No append before: at once.
        let first = pacer.due;
        assert_eq!(
            alone(&pacer, 1, false),
            Pace {
                at: first,
                gathering: false
            }
        );
        // A lone group: due when the append ended, unwatched not before the spacing.
        let started = Instant::now();
        let ended = started + MS;
        pacer.appended(started, ended, 1, false);
        assert_eq!(pacer.due, ended);
        assert_eq!(
            alone(&pacer, 1, false),
            Pace {
                at: started + UNWATCHED,
                gathering: true
            }
        );
        // Someone waits: the due time.
        assert_eq!(pacer.pace(1, false, || true).at, ended);
        // A group met after a quiet spell longer than the spacing: the due time has passed,
        // so it is appended as soon as it is met.
        let met = started + 40 * MS;
        assert!(alone(&pacer, 1, false).at < met);
        // A due later than the spacing (a slow append resting) stays as it is.
        let later = started + 100 * MS;
        let slow = later + 30 * MS;
        pacer.appended(later, slow, 5, false);
        assert_eq!(pacer.due, slow + cadence::REST_MAX);
        assert_eq!(alone(&pacer, 1, false).at, pacer.due);
        // Zero spacing: never gathers.
        let mut pacer =
            pacer_with(OutboxConfig::default().unwatched_append_spacing(Duration::ZERO));
        pacer.appended(started, ended, 1, false);
        assert_eq!(alone(&pacer, 1, false).at, ended);
    }

    #[test]
    fn a_gathering_ends_at_a_full_plan_or_at_gather_groups_with_an_early_listener() {
        let started = Instant::now();
        let ended = started + MS;
        let gathered = started + UNWATCHED;
        let config = OutboxConfig::default().unwatched_append_spacing(UNWATCHED);
        let mut pacer = pacer_with(config.clone().fold_batch(300));
        pacer.appended(started, ended, 1, false);
        assert_eq!(alone(&pacer, GATHER_GROUPS - 1, true).at, gathered);
        assert_eq!(alone(&pacer, GATHER_GROUPS, true).at, ended);
        // No early listener: a full plan.
        assert_eq!(alone(&pacer, GATHER_GROUPS, false).at, gathered);
        assert_eq!(alone(&pacer, 299, false).at, gathered);
        assert_eq!(alone(&pacer, 300, false).at, ended);
        assert!(!pacer.is_full(299) && pacer.is_full(300));
        assert_eq!(pacer.read_limit(), 300);
        // A full plan smaller than GATHER_GROUPS ends it first, listener or not.
        let mut pacer = pacer_with(config.fold_batch(10));
        pacer.appended(started, ended, 1, false);
        assert_eq!(alone(&pacer, 9, true).at, gathered);
        assert_eq!(alone(&pacer, 10, true).at, ended);
        assert_eq!(alone(&pacer, 10, false).at, ended);
        // Who waits is not asked once the plan alone decides.
        assert_eq!(pacer.pace(10, false, || unreachable!()).at, ended);
    }

    #[test]
    fn the_configured_interval_holds_for_every_append() {
        let interval = 20 * MS;
        let mut pacer = pacer_with(OutboxConfig::default().fold_interval(interval));
        let started = Instant::now();
        let ended = started + MS;
        pacer.appended(started, ended, 1, false);
        assert_eq!(pacer.due, started + interval);
        for _ in 0..cadence::STREAM_APPENDS {
            pacer.appended(started, ended, 50, false);
            assert_eq!(pacer.due, started + interval);
        }
    }
}
