//! Cross-process wake-ups, receiving side: a `LISTEN` connection whose notifications only
//! hint that something was committed. The table stays the only data channel: after a
//! reconnect the lane looks at the table again, so a lost notification costs latency, never an
//! event. The connection and its reconnects are `crate::listen`'s (one for every channel of the
//! outbox); this is what the lane does with what it hears.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::LaneShared;
use crate::listen::{Listen, Notified};
use crate::task::Tasks;

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
    /// Whatever was notified while we were away is in the table: look now.
    fn connected(&self) {
        self.0.request_resync();
    }

    fn notified(&self, payload: &str) {
        let shared = &self.0;
        match parse(payload) {
            // Our own commit or append, echoed back: this process has it already.
            Some(Wake {
                instance: Some(instance),
                ..
            }) if instance == shared.instance => {}
            Some(Wake {
                log_head: Some(head),
                ..
            }) => shared.peer_log.heard(head),
            Some(Wake { sequence, .. }) => shared.hint_foreign(sequence),
            None => shared.request_resync(),
        }
    }
}

/// A wake-up, as its payload reads.
#[derive(Debug, PartialEq, Eq)]
struct Wake {
    /// The highest sequence the sender committed (for a sequencer's wake-up: the insert
    /// sequence its log covers, which a sender of an older version takes as a commit hint).
    sequence: u64,
    /// The sending outbox's instance, in hex (since 0.1); a payload without it (an older
    /// sender) counts as foreign.
    instance: Option<u64>,
    /// Present on a sequencer's wake-up (see [`PeerLog`]): the commit-log head it appended,
    /// or, from a sequencer that leaves its appends to a peer, the head it knows.
    log_head: Option<u64>,
}

fn parse(payload: &str) -> Option<Wake> {
    let mut parts = payload.split(' ');
    let sequence = parts.next()?.parse().ok()?;
    let instance = parts.next().and_then(|i| u64::from_str_radix(i, 16).ok());
    let log_head = parts.next().and_then(|h| h.parse().ok());
    Some(Wake {
        sequence,
        instance,
        log_head,
    })
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

/// The payload of a sequencer's wake-up: what [`parse`] reads as a [`Wake`] with a `log_head`,
/// and a sender of an older version as a commit hint at `covered`.
pub(crate) fn log_payload(covered: u64, instance: u64, head: u64) -> String {
    format!("{covered} {instance:016x} {head}")
}

#[cfg(test)]
mod tests {
    use super::{Wake, log_payload, parse};

    #[test]
    fn a_payload_names_the_sequence_and_maybe_the_sender_and_a_log_head() {
        let wake = |sequence, instance, log_head| {
            Some(Wake {
                sequence,
                instance,
                log_head,
            })
        };
        assert_eq!(parse("42 00000000000000ff"), wake(42, Some(255), None));
        assert_eq!(parse("42"), wake(42, None, None));
        assert_eq!(parse("42 not-hex"), wake(42, None, None));
        assert_eq!(parse("x"), None);
        assert_eq!(
            parse(&log_payload(42, 255, 7)),
            wake(42, Some(255), Some(7))
        );
    }
}
