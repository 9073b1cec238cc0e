//! When the sequencer's next append may start: a pure rule of how the last ones went (their
//! size and length, whether peers fold too), with no I/O, tested here.

use std::time::Duration;

use tokio::time::Instant;

/// After an append that took `d`, the next one starts no sooner than `min(d, REST_MAX)` after
/// it ended: the sequencer's backend appends at most half the time. Under a stream of commits
/// that the database is slow to take, appends then grow instead of following each other
/// without pause (with eight writers on two cores, one backend appending back to back took a
/// share of the CPU the writers needed), while a commit after a quiet spell is appended at
/// once. The cap bounds what the rest adds to the commit lane's latency.
pub(super) const REST_MAX: Duration = Duration::from_millis(4);
/// Only an append of at least this many groups rests after it: a single transaction at a time
/// (one writer at 500 tx/s) is appended as it comes, a stream of several is coalesced.
pub(super) const REST_FROM_GROUPS: usize = 2;
/// Under a stream of commits, appends start at most this often (the longest spacing; a faster
/// stream gets a shorter one, see [`STREAM_GROUPS`]). An append costs about half a
/// millisecond of server time whatever its size (a plan of CTEs, the state row, a chunk row),
/// and appends that followed each other as fast as the rest allowed kept the sequencer's
/// backend busy beside eight writers on two cores: two thirds of ordo's extra server time per
/// event, publish at a median 0.75x of raw `INSERT`s against 0.79x with this spacing, and 6%
/// more WAL per event (`docs/performance-history.md`, 2026-12-01, `5dc35ab`). The spacing is also what a
/// commit can wait before its append starts (about 1.5 ms on the median under a stream), so it
/// stays well inside the commit lane's latency budget. A sequencer that hears peers folding (announcements
/// within [`PEERS_HEARD`](super::peers::PEERS_HEARD)) does not space its appends: there the commit lane of every other
/// process already waits a wake-up, a read and an announcement on top of the append, and the
/// spacing put 2 ms on its p99 with three processes (`docs/performance-history.md`,
/// 2026-12-01, `5dc35ab`).
pub(super) const STREAM_SPACING: Duration = Duration::from_millis(5);
/// Under a stream the spacing is what gathers about this many groups into one append at the
/// rate the last append's groups came, between [`SPACING_MIN`] and [`STREAM_SPACING`]: one
/// writer back to back (2,000 to 3,000 transactions a second) keeps the full spacing, whose
/// appends it needs to keep up with raw `INSERT`s, while eight writers (6,000 and more) fill an
/// append in a third of the time, and their commit lane waits that much less for it. With
/// the full spacing under eight writers the commit lane's p99 lag was 8 to 10 ms against the
/// peer's 5 to 6 ms; with 2 ms for every stream, one writer fell to 0.71x of raw
/// (`docs/performance-history.md`, 2026-12-05, `8580ef5`).
pub(super) const STREAM_GROUPS: u32 = 16;
/// The shortest spacing under a stream (see [`STREAM_GROUPS`]).
pub(super) const SPACING_MIN: Duration = Duration::from_millis(2);
/// A stream is [`STREAM_APPENDS`] appends in a row each of at least this many groups, or
/// [`STREAM_PRESSED_APPENDS`] appends under pressure (each one's first group came within
/// [`PRESSED_WITHIN`] times the last append's length after it ended, up to [`REST_MAX`]: the
/// sequencer's backend, appending one or two groups at a time, kept busy a third of the time or
/// more), or a mix: commits come faster than appends can take them one by one. One writer at
/// 500 tx/s appends one group at a time with the backend idle most of the time, and a backlog
/// after a pause (a start, a slow statement) drains in an append or two; neither is spaced. One
/// writer committing back to back (a transaction every 0.6 ms, an append of 0.3 to 0.4 ms after
/// each) is a stream: appended one group at a time, it published at 0.61x to 0.75x of raw
/// `INSERT` transactions, spaced at 0.83x to 1.00x (`docs/performance-history.md`, 2026-12-05, `bab0155`).
pub(super) const STREAM_FROM_GROUPS: usize = 4;
pub(super) const STREAM_APPENDS: u32 = 3;
/// Appends started under pressure are weaker evidence than appends of many groups (a few slow
/// appends in a row at 500 tx/s look the same), so a stream takes twice as many of them.
pub(super) const STREAM_PRESSED_APPENDS: u32 = 2 * STREAM_APPENDS;
/// How soon after an append its successor's first group must come for the successor to count
/// as pressed, in lengths of the last append. At 2 (a third of the time or more), one writer
/// back to back beside a busy neighbour is a stream: a transaction every 0.66 ms and an append
/// of 0.3 ms after each came *after* one append's length, so that writer was appended one
/// transaction at a time, the sequencer's backend took about 45% of the core the neighbour left,
/// and it published at 0.47x to 0.56x of raw `INSERT`s against 0.84x to 0.90x without the commit
/// lane (`docs/performance-history.md`, 2026-12-05, `7d87953`). A writer at 500 tx/s (an append every 2 ms
/// of 0.3 to 0.6 ms) stays outside.
pub(super) const PRESSED_WITHIN: u32 = 2;
/// What an append of many groups counts for towards [`STREAM_PRESSED_APPENDS`].
const MANY_GROUPS_COUNT: u32 = STREAM_PRESSED_APPENDS / STREAM_APPENDS;

/// When appends may start, from how the last ones went.
#[derive(Default)]
pub(super) struct Cadence {
    /// How much the appends in a row looked like a stream: [`MANY_GROUPS_COUNT`] for one of
    /// many groups, 1 for one started under pressure (see [`STREAM_FROM_GROUPS`]).
    pub(super) streak: u32,
    /// Peers fold too: no spacing (see [`STREAM_SPACING`]).
    pub(super) peers: bool,
    /// The spacing under a stream, following the rate groups come at (see [`STREAM_GROUPS`]);
    /// `None` until an append has one before it.
    spacing: Option<Duration>,
    /// When the last append started and ended.
    last: Option<(Instant, Instant)>,
    /// When the next append's first group was met.
    met: Option<Instant>,
}

impl Cadence {
    /// The plan, empty until now, got its first group: it goes into the next append.
    pub(super) fn met(&mut self, at: Instant) {
        self.met = Some(at);
    }

    /// When the append after one that started at `started`, ended at `ended` and took `groups`
    /// groups may start: `interval` after the last one started; under a stream of commits, with
    /// no peer folding, no sooner than the stream's spacing after it started (what gathers
    /// [`STREAM_GROUPS`], from [`SPACING_MIN`] to [`STREAM_SPACING`]); and after an append of
    /// several groups no sooner than it took (up to [`REST_MAX`], under a stream up to the
    /// spacing) after it ended.
    pub(super) fn next_due(
        &mut self,
        started: Instant,
        ended: Instant,
        groups: usize,
        interval: Duration,
    ) -> Instant {
        // Its first group came within PRESSED_WITHIN lengths of the last append after it
        // ended: appending one small group after another keeps the backend busy a third of the
        // time or more.
        let met = self.met.take().unwrap_or(started);
        let pressed = self.last.is_some_and(|(before, after)| {
            met < after
                + (after - before)
                    .saturating_mul(PRESSED_WITHIN)
                    .min(REST_MAX)
        });
        if let Some((before, _)) = self.last {
            // The groups of this append came since the last one started: the spacing that
            // would gather STREAM_GROUPS at that rate. It rises at once (fewer appends when
            // the commits thin out) and falls halfway (one full append is not yet a rate).
            let came_in = started.saturating_duration_since(before);
            let wanted = match u32::try_from(groups) {
                Ok(groups) if groups > 0 => came_in.saturating_mul(STREAM_GROUPS) / groups,
                _ => STREAM_SPACING,
            }
            .min(STREAM_SPACING);
            let last = self.spacing.unwrap_or(STREAM_SPACING);
            let spacing = if wanted >= last {
                wanted
            } else {
                (last + wanted) / 2
            };
            self.spacing = Some(spacing.max(SPACING_MIN));
        }
        self.last = Some((started, ended));
        self.streak = if groups >= STREAM_FROM_GROUPS {
            self.streak.saturating_add(MANY_GROUPS_COUNT)
        } else if pressed {
            self.streak.saturating_add(1)
        } else {
            0
        };
        let stream = self.streak >= STREAM_PRESSED_APPENDS && !self.peers;
        let stream_spacing = self.spacing.unwrap_or(STREAM_SPACING);
        let spacing = if stream {
            interval.max(stream_spacing)
        } else {
            interval
        };
        // Under a stream the rest is no longer than the spacing: an append every spacing,
        // the backend still appending at most about half the time.
        let rest_max = if stream {
            REST_MAX.min(stream_spacing)
        } else {
            REST_MAX
        };
        let rest = if groups >= REST_FROM_GROUPS {
            ended.saturating_duration_since(started).min(rest_max)
        } else {
            Duration::ZERO
        };
        (started + spacing).max(ended + rest)
    }

    /// When the next append may start while nobody waits for the log: `due` (what
    /// [`Self::next_due`] gave), and no sooner than `spacing` after the last append started. A
    /// first group after a quiet spell longer than that is still appended at once.
    ///
    /// With nobody waiting, the log is for readers yet to come, and each append costs the
    /// server a transaction: one writer back to back beside a busy neighbour published at 0.86x
    /// to 0.94x of raw `INSERT` transactions with 25 ms between appends, against 0.72x to 0.82x
    /// with the stream's spacing (the sequencer's server transactions per published one fell
    /// from 0.08 to 0.14 to about none, 2026-12-05, `b397cc4`); quiet, its transactions' p99 was 1.20 to
    /// 1.28 ms with 25 ms and 0.78 to 1.06 ms, as with the commit lane off, with 1 s (the default
    /// of
    /// [`OutboxConfig::unwatched_append_spacing`](crate::OutboxConfig::unwatched_append_spacing))
    /// and at most `GATHER_GROUPS` groups an append (2026-12-06, `812d1fb`, `docs/performance-history.md`;
    /// the cap holds while a listener takes early positions, see `Sequencer::gather_size`).
    pub(super) fn unwatched(&self, due: Instant, spacing: Duration) -> Instant {
        self.last
            .map_or(due, |(started, _)| due.max(started + spacing))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_lone_transaction_is_appended_as_soon_as_it_comes() {
        let mut cadence = Cadence::default();
        let started = Instant::now();
        let ended = started + MS;
        // Due as soon as the last append ended: at once.
        assert_eq!(cadence.next_due(started, ended, 1, Duration::ZERO), ended);
        assert_eq!(cadence.next_due(started, ended, 0, Duration::ZERO), ended);
    }

    #[test]
    fn a_few_groups_rest_as_long_as_their_append_took() {
        let mut cadence = Cadence::default();
        let started = Instant::now();
        let ended = started + MS;
        assert_eq!(
            cadence.next_due(started, ended, 2, Duration::ZERO),
            ended + MS
        );
        let slow = started + 10 * MS;
        assert_eq!(
            cadence.next_due(started, slow, 3, Duration::ZERO),
            slow + REST_MAX
        );
    }

    #[test]
    fn a_backlog_is_not_a_stream_but_appends_of_many_groups_in_a_row_are() {
        let mut cadence = Cadence::default();
        // Ten groups an append, one append every 5 ms: 2,000 groups a second, the rate of one
        // writer back to back, which keeps the full spacing.
        let groups = 10;
        let mut started = Instant::now();
        for _ in 1..STREAM_APPENDS {
            let ended = started + MS;
            assert_eq!(
                cadence.next_due(started, ended, groups, Duration::ZERO),
                ended + MS
            );
            started += STREAM_SPACING;
        }
        let spaced = started + STREAM_SPACING;
        assert_eq!(
            cadence.next_due(started, started + MS, groups, Duration::ZERO),
            spaced
        );
        started += STREAM_SPACING;
        assert_eq!(
            cadence.next_due(started, started + MS, STREAM_FROM_GROUPS, Duration::ZERO),
            started + STREAM_SPACING
        );
        // A slow append rests after it as before: the spacing bounds how often appends start.
        started += STREAM_SPACING;
        let slow = started + 8 * MS;
        assert_eq!(
            cadence.next_due(started, slow, groups, Duration::ZERO),
            slow + REST_MAX
        );
        // A small append ends the stream (once the backend has rested).
        let later = slow + REST_MAX;
        assert_eq!(
            cadence.next_due(later, later + MS, 3, Duration::ZERO),
            later + 2 * MS
        );
        let later = later + 10 * MS;
        assert_eq!(
            cadence.next_due(later, later + MS, 50, Duration::ZERO),
            later + 2 * MS
        );
    }

    /// Appends of 1 ms, each starting when due, with groups coming at `per_ms` a millisecond
    /// for `appends` appends: how long the last one left before the next.
    fn spacing_under(
        cadence: &mut Cadence,
        started: &mut Instant,
        per_ms: u32,
        appends: u32,
    ) -> Duration {
        let mut last: Option<Instant> = None;
        let mut spacing = Duration::ZERO;
        for _ in 0..appends {
            let came_in = last.map_or(STREAM_SPACING, |last| *started - last);
            let groups = (came_in.as_secs_f64() * 1_000.0 * f64::from(per_ms))
                .round()
                .max(1.0) as usize;
            let due = cadence.next_due(*started, *started + MS, groups, Duration::ZERO);
            spacing = due - *started;
            last = Some(*started);
            *started = due;
        }
        spacing
    }

    #[test]
    fn many_writers_fill_an_append_sooner_and_their_stream_is_spaced_less() {
        let mut cadence = Cadence::default();
        let mut started = Instant::now();
        // One writer back to back, 2,500 transactions a second: the full spacing.
        assert_eq!(
            spacing_under(&mut cadence, &mut started, 3, 20),
            STREAM_SPACING
        );
        // Eight writers, 7,000 a second: what gathers STREAM_GROUPS, about 2.3 ms, and the
        // rest (1 ms here) no longer than it.
        let spacing = spacing_under(&mut cadence, &mut started, 7, 20);
        assert!(
            (Duration::from_micros(2_200)..=Duration::from_micros(2_400)).contains(&spacing),
            "{spacing:?}"
        );
        // Faster still: never below SPACING_MIN.
        assert_eq!(
            spacing_under(&mut cadence, &mut started, 40, 20),
            SPACING_MIN
        );
        // The rate falls back: so does the spacing, back to the full one in a few appends.
        assert_eq!(
            spacing_under(&mut cadence, &mut started, 2, 8),
            STREAM_SPACING
        );
        // A rest longer than the spacing is cut to it: a slow append of many groups under a
        // fast stream starts the next one the spacing after it ended.
        let _ = spacing_under(&mut cadence, &mut started, 40, 20);
        let slow = started + 6 * MS;
        let due = cadence.next_due(started, slow, 100, Duration::ZERO);
        assert!(due <= slow + STREAM_SPACING / 2, "{:?}", due - slow);
    }

    #[test]
    fn one_group_after_another_with_the_backend_busy_a_third_of_the_time_is_a_stream() {
        let mut cadence = Cadence::default();
        let append = Duration::from_micros(400);
        let every = Duration::from_micros(600);
        let mut started = Instant::now();
        // The first append has none before it; then each starts within the last one's rest.
        for _ in 0..STREAM_PRESSED_APPENDS {
            let ended = started + append;
            assert_eq!(cadence.next_due(started, ended, 1, Duration::ZERO), ended);
            started += every;
        }
        let ended = started + append;
        assert_eq!(
            cadence.next_due(started, ended, 1, Duration::ZERO),
            started + STREAM_SPACING
        );
        // Spaced, the appends carry many groups: the stream goes on.
        started += STREAM_SPACING;
        assert_eq!(
            cadence.next_due(started, started + append, 8, Duration::ZERO),
            started + STREAM_SPACING
        );
        // Under load, appends of two groups: each rests as long as it took, and the next
        // groups come during the rest, so every append has waited for its due time.
        let mut cadence = Cadence::default();
        let mut started = Instant::now();
        let slow = Duration::from_micros(900);
        for _ in 0..STREAM_PRESSED_APPENDS {
            cadence.met(started - Duration::from_micros(300));
            let ended = started + slow;
            let due = cadence.next_due(started, ended, 2, Duration::ZERO);
            assert_eq!(due, ended + slow);
            started = due;
        }
        cadence.met(started - Duration::from_micros(300));
        assert_eq!(
            cadence.next_due(started, started + slow, 2, Duration::ZERO),
            started + STREAM_SPACING
        );
        // One writer beside a busy neighbour: an append of 0.3 ms after each transaction,
        // one every 0.66 ms. Each next group comes after one append's length but within two:
        // the backend appends 45% of the time, a stream.
        let mut cadence = Cadence::default();
        let mut started = Instant::now();
        let short = Duration::from_micros(300);
        for _ in 0..STREAM_PRESSED_APPENDS {
            let ended = started + short;
            assert_eq!(cadence.next_due(started, ended, 1, Duration::ZERO), ended);
            started += Duration::from_micros(660);
        }
        assert_eq!(
            cadence.next_due(started, started + short, 1, Duration::ZERO),
            started + STREAM_SPACING
        );
        // A writer at 500 tx/s: each append starts long after the last one's rest, even with
        // appends slowed to 0.6 ms.
        for append in [append, Duration::from_micros(600)] {
            let mut cadence = Cadence::default();
            let mut started = Instant::now();
            for _ in 0..=STREAM_PRESSED_APPENDS {
                let ended = started + append;
                assert_eq!(cadence.next_due(started, ended, 1, Duration::ZERO), ended);
                started += 2 * MS;
            }
        }
    }

    #[test]
    fn with_peers_folding_a_stream_is_not_spaced() {
        let mut cadence = Cadence {
            peers: true,
            ..Cadence::default()
        };
        // Ten groups in every 5 ms: a stream, alone.
        let mut started = Instant::now();
        for _ in 0..=STREAM_APPENDS {
            let ended = started + MS;
            assert_eq!(
                cadence.next_due(started, ended, 10, Duration::ZERO),
                ended + MS
            );
            started += STREAM_SPACING;
        }
        // Alone again, the stream is spaced.
        cadence.peers = false;
        assert_eq!(
            cadence.next_due(started, started + MS, 10, Duration::ZERO),
            started + STREAM_SPACING
        );
    }

    #[test]
    fn while_nobody_waits_appends_start_at_most_every_unwatched_spacing() {
        const UNWATCHED: Duration = Duration::from_millis(25);
        let mut cadence = Cadence::default();
        let started = Instant::now();
        // No append before: at once.
        assert_eq!(cadence.unwatched(started, UNWATCHED), started);
        // A lone group: due when the append ended, unwatched not before the spacing.
        let ended = started + MS;
        let due = cadence.next_due(started, ended, 1, Duration::ZERO);
        assert_eq!(due, ended);
        assert_eq!(cadence.unwatched(due, UNWATCHED), started + UNWATCHED);
        // A group met after a quiet spell longer than the spacing: the due time has passed,
        // so it is appended as soon as it is met.
        let met = started + 40 * MS;
        assert!(cadence.unwatched(due, UNWATCHED) < met);
        // A due later than the spacing (a slow append resting) stays as it is.
        let later = started + 100 * MS;
        let slow = later + 30 * MS;
        let due = cadence.next_due(later, slow, 5, Duration::ZERO);
        assert_eq!(due, slow + REST_MAX);
        assert_eq!(cadence.unwatched(due, UNWATCHED), due);
    }

    #[test]
    fn the_configured_interval_holds_for_every_append() {
        let mut cadence = Cadence::default();
        let started = Instant::now();
        let ended = started + MS;
        let interval = 20 * MS;
        assert_eq!(
            cadence.next_due(started, ended, 1, interval),
            started + interval
        );
        for _ in 0..STREAM_APPENDS {
            assert_eq!(
                cadence.next_due(started, ended, 50, interval),
                started + interval
            );
        }
    }
}
