//! An inbox's failed messages and the watermark consumers' marks as tables, and the inbox's
//! section of `ordo status`.

use std::fmt::Write;

use super::{Column, Left, Right, age, last_error, printable, seconds_since, table};
use crate::inbox::{FailedCount, FailedMessage, InboxStatus, MarkStatus, MarkWait, Watermark};

/// An inbox's failed messages as `ordo inbox failed` prints them: one line each, oldest
/// failure first, safe for a terminal (ids, errors and names are sender text).
pub fn inbox_failed_table(failed: &[FailedMessage]) -> String {
    let mut out = String::new();
    let columns = [
        Column("CONSUMER", 24, Left),
        Column("ID", 38, Left),
        Column("ATTEMPTS", 8, Right),
        Column("FAILED AT", 19, Left),
    ];
    let rows = failed.iter().map(|message| {
        let cells = [
            printable(&message.consumer).into_owned(),
            printable(&message.id).into_owned(),
            message.attempts.to_string(),
            message.failed_at.format("%Y-%m-%d %H:%M:%S").to_string(),
        ];
        (cells, last_error(message.error.as_deref()))
    });
    table(&mut out, &columns, "ERROR", rows);
    out
}

/// Watermark consumers' marks as `ordo inbox watermarks` prints them: one line per (consumer,
/// source, route; `-` for a source's one route), safe for a terminal. A mark held by a
/// failing position names it as failing; one waiting on a gap (older than
/// [`GAP_SHOWN_AFTER`](crate::inbox::GAP_SHOWN_AFTER): a younger one is a catch-up in
/// progress) says which position, since when, and what ends it.
pub fn watermarks_table(marks: &[Watermark]) -> String {
    let mut out = String::new();
    let columns = [
        Column("CONSUMER", 24, Left),
        Column("SOURCE", 24, Left),
        Column("ROUTE", 24, Left),
        Column("POSITION", 12, Right),
        Column("ATTEMPTS", 8, Right),
    ];
    let now = chrono::Utc::now();
    let rows = marks.iter().map(|mark| {
        let note = match (mark.waits_on(now), &mark.rewind) {
            (Some(MarkWait::Gap { expected, received, .. }), _) => format!(
                "waiting on a gap since {}: position {expected} has not arrived, {received} was refused; if it never will, ordo inbox set-watermark",
                mark.gap.as_ref().map_or_else(String::new, |gap| gap.since.format("%Y-%m-%d %H:%M:%S UTC").to_string()),
            ),
            (Some(wait), _) => wait_text(&wait),
            (None, Some(rewind)) if mark.last_error.is_none() => format!(
                "rewound at {}: positions {} to {} were given again by the sender (its database went back: a failover, a restore, a crash)",
                rewind.at.format("%Y-%m-%d %H:%M:%S UTC"),
                rewind.from,
                rewind.through
            ),
            _ => last_error(mark.last_error.as_deref()),
        };
        let cells = [
            printable(&mark.consumer).into_owned(),
            printable(&mark.source).into_owned(),
            route(&mark.route),
            mark.position.to_string(),
            mark.attempts.to_string(),
        ];
        (cells, note)
    });
    table(&mut out, &columns, "LAST ERROR", rows);
    out
}

/// A mark held by a failing position: which, how often it failed, why, and what waits.
fn failing_note(position: u64, attempts: u32, error: Option<&str>, refused: Option<u64>) -> String {
    let behind = refused.map_or_else(String::new, |refused| {
        format!("; {refused} was refused, waiting behind it")
    });
    format!(
        "position {position} is failing ({attempts} attempt(s): {}), tried again on each redelivery{behind}",
        last_error(error)
    )
}

/// The inbox's section of `ordo status`: each consumer's failed messages, then the marks.
/// Nothing where no inbox receives.
pub(super) fn inbox_section(
    out: &mut String,
    inbox: &InboxStatus,
    measured_at: chrono::DateTime<chrono::Utc>,
) {
    if inbox.failed.is_empty() && inbox.marks.is_empty() {
        return;
    }
    let _ = writeln!(out);
    for failed in &inbox.failed {
        let _ = writeln!(out, "{}", failed_line(failed, measured_at));
    }
    if inbox.marks.is_empty() {
        return;
    }
    let columns = [
        Column("INBOX CONSUMER", 24, Left),
        Column("SOURCE", 16, Left),
        Column("ROUTE", 16, Left),
        Column("POSITION", 10, Right),
        Column("IDLE", 8, Right),
    ];
    let rows = inbox.marks.iter().map(|mark| {
        let cells = [
            printable(&mark.consumer).into_owned(),
            printable(&mark.source).into_owned(),
            route(&mark.route),
            mark.position.to_string(),
            age(Some(mark.idle_seconds)),
        ];
        let waits = mark
            .waits_on
            .as_ref()
            .map_or_else(|| "-".to_owned(), wait_text);
        (cells, waits)
    });
    table(out, &columns, "WAITS ON", rows);
}

/// A consumer's failed messages, in a line of `ordo status`.
pub(super) fn failed_line(
    failed: &FailedCount,
    measured_at: chrono::DateTime<chrono::Utc>,
) -> String {
    format!(
        "inbox consumer \"{}\": {} failed message(s), the oldest failed {} ago; `ordo inbox failed --consumer {}` lists them, `ordo inbox replay` runs them again",
        printable(&failed.consumer),
        failed.count,
        age(seconds_since(failed.oldest_at, measured_at)),
        printable(&failed.consumer)
    )
}

/// What holds a mark, in words: a failing position, or a gap with what ends it.
fn wait_text(wait: &MarkWait) -> String {
    match wait {
        MarkWait::Failing {
            position,
            attempts,
            error,
            refused,
        } => failing_note(*position, *attempts, error.as_deref(), *refused),
        MarkWait::Gap {
            expected,
            received,
            seconds,
        } => format!(
            "position {expected} has not arrived for {} ({received} was refused): lost upstream, or still on its way",
            age(Some(*seconds))
        ),
    }
}

/// A mark held by something, as one line of the stuck summary of `ordo status`; `None` for a
/// mark nothing holds.
pub(super) fn stuck_mark(mark: &MarkStatus) -> Option<String> {
    let wait = mark.waits_on.as_ref()?;
    let which = format!(
        "inbox consumer \"{}\" from \"{}\"{}",
        printable(&mark.consumer),
        printable(&mark.source),
        if mark.route.is_empty() {
            String::new()
        } else {
            format!(" route \"{}\"", printable(&mark.route))
        }
    );
    let advice = match wait {
        MarkWait::Gap { expected, .. } => format!(
            "; if it never will, `ordo inbox set-watermark {} {} {expected}{}` goes on without it",
            printable(&mark.consumer),
            printable(&mark.source),
            if mark.route.is_empty() {
                String::new()
            } else {
                format!(" --route {}", printable(&mark.route))
            }
        ),
        _ => String::new(),
    };
    Some(format!("{which}: {}{advice}", wait_text(wait)))
}

fn route(route: &str) -> String {
    if route.is_empty() {
        "-".to_owned()
    } else {
        printable(route).into_owned()
    }
}
