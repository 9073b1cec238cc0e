//! What is said on the wake-up channel, and how: the one statement every sender uses, each
//! payload's format (a writer's wake-up, an outbox's presence or greeting, a sequencer's
//! announcement) and how a listener reads them back. The writer's notifier, the commit lane's
//! sequencer and the insert lane's listener all speak it, so it sits here, where the insert
//! lane's listener reads it and both senders may import it.

use sqlx::PgPool;

use crate::position::EventSequence;

/// A cross-process wake-up (or an outbox saying that it listens), in a transaction of its own.
/// It flushes no WAL: 200 of them in a row made one WAL sync (`pg_stat_wal.wal_sync`), so a
/// commit setting such as `synchronous_commit = off` would buy nothing.
pub(crate) const NOTIFY: &str = "SELECT pg_notify($1, $2)";

/// Sends [`NOTIFY`] on `channel` with `payload`.
pub(crate) async fn notify(pool: &PgPool, channel: &str, payload: &str) -> Result<(), sqlx::Error> {
    sqlx::query(NOTIFY)
        .bind(channel)
        .bind(payload)
        .execute(pool)
        .await?;
    Ok(())
}

/// The payload of a wake-up: the highest sequence this process has committed, and the sending
/// outbox's instance (so that it can tell its own echoed back).
pub(crate) fn wakeup_payload(committed: EventSequence, instance: u64) -> String {
    format!("{committed} {instance:016x}")
}

/// The sequence a presence payload carries ([`presence_payload`]): no event has it (sequences
/// start at 1), so a process of an older version takes it as a wake-up for nothing new.
pub(super) const PRESENCE: u64 = 0;
/// The last word of a greeting: a presence that asks the others to answer with theirs.
const GREETING: &str = "hello";

/// The payload by which an outbox says that it listens on the wake-up channel:
/// `"0 {instance}"`, or as a greeting, which every other outbox answers, `"0 {instance} hello"`.
pub(crate) fn presence_payload(instance: u64, greeting: bool) -> String {
    if greeting {
        format!("{PRESENCE} {instance:016x} {GREETING}")
    } else {
        format!("{PRESENCE} {instance:016x}")
    }
}

/// The payload of a sequencer's wake-up: what [`parse`] reads as a [`Wake`] with a `log_head`,
/// and a sender of an older version as a commit hint at `covered`.
pub(crate) fn log_payload(covered: u64, instance: u64, head: u64) -> String {
    format!("{covered} {instance:016x} {head}")
}

/// A wake-up, as its payload reads.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Wake {
    /// The highest sequence the sender committed (for a sequencer's wake-up: the insert
    /// sequence its log covers, which a sender of an older version takes as a commit hint).
    pub(super) sequence: u64,
    /// The sending outbox's instance, in hex (since 0.1); a payload without it (an older
    /// sender) counts as foreign.
    pub(super) instance: Option<u64>,
    /// Present on a sequencer's wake-up (see [`PeerLog`](super::PeerLog)): the commit-log head
    /// it appended, or, from a sequencer that leaves its appends to a peer, the head it knows.
    pub(super) log_head: Option<u64>,
    /// A presence that asks for an answer ([`presence_payload`]).
    pub(super) greeting: bool,
}

pub(super) fn parse(payload: &str) -> Option<Wake> {
    let mut parts = payload.split(' ');
    let sequence = parts.next()?.parse().ok()?;
    let instance = parts.next().and_then(|i| u64::from_str_radix(i, 16).ok());
    let third = parts.next();
    let log_head = third.and_then(|h| h.parse().ok());
    Some(Wake {
        sequence,
        instance,
        log_head,
        greeting: sequence == PRESENCE && third == Some(GREETING),
    })
}

#[cfg(test)]
mod tests {
    use super::{Wake, log_payload, parse, presence_payload};

    fn wake(sequence: u64, instance: Option<u64>, log_head: Option<u64>) -> Option<Wake> {
        Some(Wake {
            sequence,
            instance,
            log_head,
            greeting: false,
        })
    }

    #[test]
    fn a_payload_names_the_sequence_and_maybe_the_sender_and_a_log_head() {
        assert_eq!(parse("42 00000000000000ff"), wake(42, Some(255), None));
        assert_eq!(parse("42"), wake(42, None, None));
        assert_eq!(parse("42 not-hex"), wake(42, None, None));
        assert_eq!(parse("x"), None);
        assert_eq!(
            parse(&log_payload(42, 255, 7)),
            wake(42, Some(255), Some(7))
        );
    }

    #[test]
    fn a_presence_reads_as_a_wake_up_for_nothing_new_and_only_a_greeting_asks() {
        assert_eq!(
            parse(&presence_payload(255, false)),
            wake(0, Some(255), None)
        );
        let greeting = parse(&presence_payload(255, true));
        assert_eq!(
            greeting,
            Some(Wake {
                greeting: true,
                ..Wake {
                    sequence: 0,
                    instance: Some(255),
                    log_head: None,
                    greeting: false
                }
            })
        );
        // A wake-up of an event is never a greeting, whatever follows it.
        assert!(parse("42 00000000000000ff hello").is_some_and(|wake| !wake.greeting));
    }
}
