//! The rule the [`Pacer`](super::Pacer) follows after each append: how soon the next one may
//! start, from how the last ones went (their size and length, whether peers fold too). Pure,
//! with no I/O, tested here. The measurements behind each constant are in
//! `docs/performance-history.md`, "Sequencer pacing: how its constants were chosen".

use std::time::Duration;

use tokio::time::Instant;

/// After an append that took `d`, the next one starts no sooner than `min(d, REST_MAX)` after
/// it ended: the sequencer's backend appends at most half the time. Under a stream of
/// commits that the database is slow to take, appends then grow instead of following each other
/// without pause (back to back, the backend took CPU that eight writers on two cores needed),
/// while a commit after a quiet spell is appended at once. The cap bounds what the rest adds to
/// the commit lane's latency.
pub(super) const REST_MAX: Duration = Duration::from_millis(4);
/// Only an append of at least this many groups rests after it: a single transaction at a time
/// (one writer at 500 tx/s) is appended as it comes, a stream of several is coalesced.
pub(super) const REST_FROM_GROUPS: usize = 2;
/// Under a stream of commits, appends start at most this often (the longest spacing; a faster
/// stream gets a shorter one, see [`STREAM_GROUPS`]). An append costs about half a millisecond
/// of server time whatever its size, so fewer of them leave the server to the writers (appends
/// back to back were two thirds of ordo's extra server time per event, 2026-12-01, `5dc35ab`).
/// The spacing is also what a commit can wait before its append starts, so it stays well inside
/// the commit lane's latency budget. With peers folding ([`Cadence::peers`]) appends are not
/// spaced: there every other process's commit lane already waits a wake-up, a read and an
/// announcement on top of the append, and the spacing put 2 ms on its p99 with three processes.
pub(super) const STREAM_SPACING: Duration = Duration::from_millis(5);
/// Under a stream the spacing is what gathers about this many groups into one append at the
/// rate the last append's groups came, between [`SPACING_MIN`] and [`STREAM_SPACING`]: one
/// writer back to back keeps the full spacing, whose appends it needs to keep up with raw
/// `INSERT`s, while eight writers fill an append sooner, and their commit lane waits that much
/// less for it (the full spacing for every stream: their p99 8 to 10 ms; 2 ms for every stream:
/// one writer at 0.71x of raw, 2026-12-05, `8580ef5`).
pub(super) const STREAM_GROUPS: u32 = 16;
/// The shortest spacing under a stream (see [`STREAM_GROUPS`]).
pub(super) const SPACING_MIN: Duration = Duration::from_millis(2);
/// A stream is [`STREAM_APPENDS`] appends in a row each of at least this many groups, or
/// [`STREAM_PRESSED_APPENDS`] appends under pressure (each one's first group came within
/// [`PRESSED_WITHIN`] times the last append's length after it ended, up to [`REST_MAX`]: the
/// sequencer's backend, appending one or two groups at a time, kept busy a third of the time or
/// more), or a mix: commits come faster than appends can take them one by one. One writer at
/// 500 tx/s (the backend idle most of the time) and a backlog after a pause (drained in an append
/// or two) are not spaced; one writer committing back to back is a stream (spaced, it published
/// at 0.83x to 1.00x of raw `INSERT`s, against 0.61x to 0.75x; 2026-12-05, `bab0155`).
pub(super) const STREAM_FROM_GROUPS: usize = 4;
pub(super) const STREAM_APPENDS: u32 = 3;
/// Appends started under pressure are weaker evidence than appends of many groups (a few slow
/// appends in a row at 500 tx/s look the same), so a stream takes twice as many of them.
pub(super) const STREAM_PRESSED_APPENDS: u32 = 2 * STREAM_APPENDS;
/// How soon after an append its successor's first group must come for the successor to count
/// as pressed, in lengths of the last append. At 2 (the backend busy a third of the time or
/// more), one writer back to back beside a busy neighbour is a stream (its next transaction
/// came after one append's length: at 1 it was appended one at a time, the sequencer's backend
/// taking 45% of the core the neighbour left, 2026-12-05, `7d87953`), while a writer at
/// 500 tx/s (an append of 0.3 to 0.6 ms every 2 ms) stays outside.
pub(super) const PRESSED_WITHIN: u32 = 2;
/// What an append of many groups counts for towards [`STREAM_PRESSED_APPENDS`].
const MANY_GROUPS_COUNT: u32 = STREAM_PRESSED_APPENDS / STREAM_APPENDS;

/// How the last appends went, and so when the next one may start.
#[derive(Default)]
pub(super) struct Cadence {
    /// How much the appends in a row looked like a stream: [`MANY_GROUPS_COUNT`] for one of
    /// many groups, 1 for one started under pressure (see [`STREAM_FROM_GROUPS`]).
    streak: u32,
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

    /// When the last append started, if there was one.
    pub(super) fn last_started(&self) -> Option<Instant> {
        self.last.map(|(started, _)| started)
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
}
