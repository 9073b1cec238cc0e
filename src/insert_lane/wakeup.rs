//! Cross-process wake-ups, receiving side: a `LISTEN` connection whose notifications only
//! hint that something was committed. The table stays the only data channel: after a
//! reconnect the lane looks at the table again, so a lost notification costs latency, never an
//! event. The connection and its reconnects are `crate::listen`'s (one for every channel of the
//! outbox); this is what the lane does with what it hears. What is said on the channel, by
//! whom and in which words (the `NOTIFY` statement and every payload's format) is
//! [`protocol`]'s.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::LaneShared;
use crate::listen::{Listen, Notified};
use crate::task::Tasks;

mod protocol;

pub(crate) use protocol::{NOTIFY, log_payload, notify, presence_payload, wakeup_payload};
use protocol::{PRESENCE, Wake, parse};

/// Has the outbox's LISTEN connection hand `channel`'s wake-ups to the lane.
pub(crate) fn listen<P: Send + Sync + 'static>(
    listen: &Listen,
    tasks: &Tasks,
    channel: &str,
    shared: Arc<LaneShared<P>>,
) {
    listen.add(tasks, channel, "wake-up", Arc::new(Wakeups(shared)));
}

/// The insert lane's side of the wake-up connection.
struct Wakeups<P>(Arc<LaneShared<P>>);

impl<P: Send + Sync> Notified for Wakeups<P> {
    /// Whatever was notified while we were away is in the table: look now; and greet the
    /// other processes on the channel (the notifier says it), which answer.
    fn connected(&self) {
        self.0.audience.listening(true);
        self.0.request_resync();
    }

    fn disconnected(&self) {
        self.0.audience.listening(false);
    }

    fn notified(&self, payload: &str) {
        let shared = &self.0;
        let wake = parse(payload);
        // Our own commit or append, echoed back: this process has it already.
        if let Some(Wake {
            instance: Some(instance),
            ..
        }) = wake
            && instance == shared.instance
        {
            return;
        }
        // Anything else on the channel is another process, or SQL, that listens there.
        shared.audience.heard();
        match wake {
            Some(Wake {
                log_head: Some(head),
                ..
            }) => shared.peer_log.heard(head),
            Some(Wake {
                sequence: PRESENCE,
                greeting,
                ..
            }) => {
                if greeting {
                    shared.audience.asked.notify_one();
                }
            }
            Some(Wake { sequence, .. }) => shared.hint_foreign(sequence),
            None => shared.request_resync(),
        }
    }
}

/// How often an outbox says that it listens. Well inside [`HEARD_WITHIN`], so that one lost
/// presence does not silence the processes that write.
pub(crate) const PRESENCE_EVERY: Duration = Duration::from_secs(1);
/// A process that heard no other on the wake-up channel for this long holds its wake-ups back.
pub(crate) const HEARD_WITHIN: Duration = Duration::from_secs(3);
/// After its connection (re)connects, an outbox takes others to be there for this long, while
/// the answers to its greeting come in (they take a round trip; this is for a loaded server).
pub(crate) const ANSWERED_WITHIN: Duration = Duration::from_millis(500);

/// Who listens on the wake-up channel besides this outbox, as far as its own `LISTEN`
/// connection hears. Every outbox greets the channel when its connection (re)connects, answers
/// every greeting, and says it listens every [`PRESENCE_EVERY`]; anything else said on the
/// channel (a wake-up, a sequencer's announcement, a `NOTIFY` from SQL) counts as well. The
/// notifier sends wake-ups only while someone else is there, or while this outbox's own
/// connection is down and it cannot know: a process alone would only wake itself, at the cost
/// of a server transaction and a notification round trip every few commits (a third of what
/// ordo added to a lone writer's transactions, `docs/performance-history.md`, 2026-12-05, `bab0155`). When
/// someone is heard after a silence, the notifier sends the wake-up it held back at once, so a
/// process that starts listening misses nothing it did not read at its start.
#[derive(Default)]
pub(crate) struct Audience {
    connected: AtomicBool,
    /// Until when someone else is taken to be listening.
    until: Mutex<Option<Instant>>,
    /// The connection (re)connected: greet the others.
    pub(crate) hello: Notify,
    /// Someone greeted: answer with a presence.
    pub(crate) asked: Notify,
    /// Someone was heard after a silence: send what was held back.
    pub(crate) arrived: Notify,
    /// Whether anyone may be there changed (heard after a silence, or the connection went up or
    /// down): the sequencer looks again whether anyone waits for its appends.
    pub(crate) changed: Notify,
}

impl Audience {
    /// The connection is up, or lost.
    fn listening(&self, connected: bool) {
        if connected {
            self.extend(ANSWERED_WITHIN);
        }
        self.connected.store(connected, Ordering::Release);
        if connected {
            self.hello.notify_one();
        }
        self.changed.notify_one();
    }

    fn heard(&self) {
        if self.extend(HEARD_WITHIN) {
            self.arrived.notify_one();
            self.changed.notify_one();
        }
    }

    /// Takes someone to be there for `window` from now; whether nobody was before.
    fn extend(&self, window: Duration) -> bool {
        let Ok(mut until) = self.until.lock() else {
            return false;
        };
        let now = Instant::now();
        let silent = until.is_none_or(|until| until <= now);
        *until = Some(until.map_or(now + window, |until| until.max(now + window)));
        silent
    }

    /// Whether this outbox's LISTEN connection is up (it then says so every
    /// [`PRESENCE_EVERY`]).
    pub(crate) fn connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    /// Whether a wake-up may reach anyone: another listener spoke within [`HEARD_WITHIN`] (or
    /// this outbox connected within [`ANSWERED_WITHIN`]), or this outbox cannot tell (its own
    /// connection is down).
    pub(crate) fn anyone(&self) -> bool {
        !self.connected()
            || self
                .until
                .lock()
                .ok()
                .and_then(|until| *until)
                .is_some_and(|until| Instant::now() < until)
    }
}

/// What other processes' sequencers said on the wake-up channel: a peer appended up to a head,
/// or a peer leaves its appends to whoever folds. The commit lane's sequencer reads it (see
/// `commit_lane::turns`); the insert lane only carries it, on the connection it listens on
/// anyway.
#[derive(Default)]
pub(crate) struct PeerLog {
    head: AtomicU64,
    heard_at: Mutex<Option<Instant>>,
    /// Wakes the sequencer waiting for a peer's append.
    pub(crate) wake: Notify,
}

impl PeerLog {
    fn heard(&self, head: u64) {
        self.head.fetch_max(head, Ordering::AcqRel);
        if let Ok(mut at) = self.heard_at.lock() {
            *at = Some(Instant::now());
        }
        self.wake.notify_one();
    }

    /// The highest log head a peer announced.
    pub(crate) fn head(&self) -> u64 {
        self.head.load(Ordering::Acquire)
    }

    /// Whether a peer's sequencer spoke within `window`.
    pub(crate) fn heard_within(&self, window: Duration) -> bool {
        self.heard_at
            .lock()
            .ok()
            .and_then(|at| *at)
            .is_some_and(|at| at.elapsed() < window)
    }
}

#[cfg(test)]
mod tests {
    use super::{ANSWERED_WITHIN, Audience, HEARD_WITHIN};

    #[tokio::test(start_paused = true)]
    async fn wake_ups_go_out_while_someone_else_was_heard_or_while_deaf() {
        let audience = Audience::default();
        assert!(
            audience.anyone(),
            "not listening yet: it cannot know, so it sends"
        );
        audience.listening(true);
        assert!(
            audience.anyone(),
            "just connected: the answers are on their way"
        );
        tokio::time::advance(ANSWERED_WITHIN).await;
        assert!(!audience.anyone(), "connected, and nobody answered: alone");
        audience.heard();
        assert!(audience.anyone());
        tokio::time::advance(HEARD_WITHIN / 2).await;
        assert!(audience.anyone());
        tokio::time::advance(HEARD_WITHIN / 2).await;
        assert!(!audience.anyone(), "the other one went quiet");
        audience.listening(false);
        assert!(audience.anyone(), "deaf: it cannot know, so it sends");
    }
}
