//! An inbox's failed messages and the watermark consumers' marks as tables.

use super::{Column, Left, Right, last_error, printable, table};
use crate::inbox::{FailedMessage, Watermark};

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
/// source, route; `-` for a source's one route), safe for a terminal; a mark waiting on a gap says which position, since when, and
/// what ends it.
pub fn watermarks_table(marks: &[Watermark]) -> String {
    let mut out = String::new();
    let columns = [
        Column("CONSUMER", 24, Left),
        Column("SOURCE", 24, Left),
        Column("ROUTE", 24, Left),
        Column("POSITION", 12, Right),
        Column("ATTEMPTS", 8, Right),
    ];
    let rows = marks.iter().map(|mark| {
        let note = match (&mark.gap, &mark.rewind) {
            (Some(gap), _) => format!(
                "waiting on a gap since {}: position {} has not arrived, {} was refused; if it never will, ordo inbox set-watermark",
                gap.since.format("%Y-%m-%d %H:%M:%S UTC"),
                gap.expected,
                gap.received
            ),
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
            if mark.route.is_empty() {
                "-".to_owned()
            } else {
                printable(&mark.route).into_owned()
            },
            mark.position.to_string(),
            mark.attempts.to_string(),
        ];
        (cells, note)
    });
    table(&mut out, &columns, "LAST ERROR", rows);
    out
}
