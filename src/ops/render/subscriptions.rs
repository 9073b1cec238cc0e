//! The subscriptions, a keyed subscription's stalled keys and the dead letters as tables.

use super::{
    Column, Left, Right, age, last_error, lease_remaining, printable, run_by, seconds_since, table,
};
use crate::consumer::{DeadLetterCount, StalledKey, SubscriptionStatus};
use crate::subscription::DeadLetter;

/// One line per subscription, with who runs it as of `now` (the lease's owner and time left,
/// or nobody): a subscription that is `active` but run by nobody is visible as such.
pub(super) fn subscription_rows(
    out: &mut String,
    subscriptions: &[SubscriptionStatus],
    now: chrono::DateTime<chrono::Utc>,
) {
    let columns = [
        Column("SUBSCRIPTION", 24, Left),
        Column("KIND", 5, Left),
        Column("LANE", 6, Left),
        Column("POSITION", 10, Right),
        Column("LAG", 8, Right),
        Column("OLDEST", 10, Right),
        Column("STATUS", 7, Left),
        Column("ATTEMPTS", 8, Right),
        Column("STALLED", 7, Right),
        Column("DEAD", 5, Right),
        Column("RUN BY", 22, Left),
    ];
    let rows = subscriptions.iter().map(|sub| {
        // A relay's sink that is down holds every key; a keyed subscription's stalled key says
        // more than its last failure elsewhere.
        let error = match (&sub.sink_down, sub.stalled.first()) {
            (Some(down), _) => printable(&down.to_string()).into_owned(),
            (None, Some(stalled)) => format!(
                "key {:?} stalled at {}: {}",
                printable(&stalled.key),
                stalled.position,
                printable(&stalled.error)
            ),
            (None, None) => match (&sub.last_error, sub.dead_letters) {
                (None, Some(DeadLetterCount { count, oldest_at: Some(oldest) })) => format!(
                    "{count} dead letter(s), the oldest {} old: ordo dead-letters list --subscription {}",
                    age(seconds_since(oldest, now)),
                    printable(&sub.name)
                ),
                (error, _) => last_error(error.as_deref()),
            },
        };
        let kind = match sub.kind.as_deref() {
            Some("subscription") => "sub",
            Some("relay") => "relay",
            _ => "-",
        };
        let cells = [
            printable(&sub.name).into_owned(),
            kind.to_owned(),
            sub.lane.to_string(),
            sub.position.to_string(),
            sub.lag.to_string(),
            age(sub.oldest_unprocessed_seconds),
            sub.status.as_str().to_owned(),
            sub.attempts.to_string(),
            sub.stalled.len().to_string(),
            sub.dead_letters
                .map_or("-".to_owned(), |dead| dead.count.to_string()),
            run_by(sub.lease_owner, lease_remaining(sub, now)),
        ];
        (cells, error)
    });
    table(out, &columns, "LAST ERROR", rows);
}

/// The subscriptions as `ordo subscriptions` prints them: one line each, with who runs each
/// one now, safe for a terminal.
pub fn subscriptions_table(subscriptions: &[SubscriptionStatus]) -> String {
    let mut out = String::new();
    subscription_rows(&mut out, subscriptions, chrono::Utc::now());
    out
}

/// A keyed subscription's stalled keys as `ordo subscriptions stalled NAME` prints them: one
/// line per key, oldest event first, safe for a terminal.
pub fn stalled_keys_table(stalled: &[StalledKey]) -> String {
    let mut out = String::new();
    let columns = [
        Column("KEY", 24, Left),
        Column("POSITION", 10, Right),
        Column("ATTEMPTS", 8, Right),
        Column("RETRY", 9, Left),
    ];
    let rows = stalled.iter().map(|key| {
        let shown = if key.key.is_empty() {
            "(no key)".to_owned()
        } else {
            printable(&key.key).into_owned()
        };
        let retry = if key.retry_requested {
            "requested"
        } else {
            "-"
        };
        let cells = [
            shown,
            key.position.to_string(),
            key.attempts.to_string(),
            retry.to_owned(),
        ];
        (cells, printable(&key.error).into_owned())
    });
    table(&mut out, &columns, "ERROR", rows);
    out
}

/// The dead letters as `ordo dead-letters list` prints them: one line each, oldest first, safe
/// for a terminal. RETRY says `pending` and for how long when an operator asked for a retry
/// that no runner has made yet.
pub fn dead_letters_table(letters: &[DeadLetter]) -> String {
    dead_letter_rows(letters, chrono::Utc::now())
}

fn dead_letter_rows(letters: &[DeadLetter], now: chrono::DateTime<chrono::Utc>) -> String {
    let mut out = String::new();
    let columns = [
        Column("ID", 8, Right),
        Column("SUBSCRIPTION", 24, Left),
        Column("LANE", 6, Left),
        Column("POSITION", 10, Right),
        Column("SEQUENCE", 10, Right),
        Column("ATTEMPTS", 8, Right),
        Column("RETRY", 14, Left),
    ];
    let rows = letters.iter().map(|letter| {
        let retry = letter.retry_requested_at.map_or("-".to_owned(), |asked| {
            format!("pending {}", age(seconds_since(asked, now)))
        });
        let cells = [
            letter.id.to_string(),
            printable(&letter.subscription).into_owned(),
            letter.lane.to_string(),
            letter.position.to_string(),
            letter.sequence.to_string(),
            letter.attempts.to_string(),
            retry,
        ];
        (cells, printable(&letter.error).into_owned())
    });
    table(&mut out, &columns, "ERROR", rows);
    out
}
