//! A consumer's stuck keys' backlogs as `ordo subscriptions backlog NAME` prints them, with
//! what operators did to them.

use std::fmt::Write;

use super::{Column, Left, Right, printable, table};
use crate::consumer::{BacklogAction, KeyBacklog};

/// One line per key (its events, bytes, since when), then one per operator's skip or purge,
/// safe for a terminal.
pub fn backlog_table(keys: &[KeyBacklog], actions: &[BacklogAction]) -> String {
    let mut out = String::new();
    let columns = [
        Column("KEY", 24, Left),
        Column("EVENTS", 8, Right),
        Column("BYTES", 10, Right),
    ];
    let rows = keys.iter().map(|key| {
        let shown = if key.key.is_empty() {
            "(no key)".to_owned()
        } else {
            printable(&key.key).into_owned()
        };
        let since = key
            .oldest_at
            .map_or_else(|| "-".to_owned(), |at| at.to_rfc3339());
        (
            [shown, key.events.to_string(), key.bytes.to_string()],
            since,
        )
    });
    table(&mut out, &columns, "OLDEST", rows);
    for action in actions {
        let _ = writeln!(
            out,
            "{} {} key \"{}\": {} event(s), {} bytes, positions {:?}, by {}",
            action.done_at.to_rfc3339(),
            action.action,
            printable(&action.key),
            action.positions.len(),
            action.bytes,
            action.positions,
            printable(&action.done_by),
        );
    }
    out
}
