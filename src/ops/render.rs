//! What operators read: [`OutboxStatus`], the subscriptions, dead letters and a retention
//! report as tables, and any text made safe for a terminal.
//!
//! One file per topic: the status report in `status.rs` (its closing lines, what is stuck, in
//! `stuck.rs`), the subscriptions, stalled keys and dead letters in `subscriptions.rs`, the
//! inbox in `inbox.rs`, retention in `retention.rs`, the secret keys in `secrets.rs`; the table
//! layout they share is here.

use std::fmt::Write;

#[cfg(doc)]
use super::status::OutboxStatus;
use crate::consumer::SubscriptionStatus;
pub use crate::telemetry::{needs_escape, printable};

mod backlog;
mod inbox;
mod retention;
mod secrets;
mod status;
mod stuck;
mod subscriptions;

pub use backlog::backlog_table;
pub use inbox::{inbox_failed_table, watermarks_table};
pub use retention::retention_table;
pub use secrets::secret_keys_table;
pub use status::status_table;
pub use subscriptions::{dead_letters_table, stalled_keys_table, subscriptions_table};

fn age(seconds: Option<f64>) -> String {
    match seconds {
        None => "-".to_owned(),
        Some(s) if s < 1.0 => format!("{:.0}ms", s * 1e3),
        Some(s) if s < 120.0 => format!("{s:.1}s"),
        Some(s) if s < 7_200.0 => format!("{:.1}m", s / 60.0),
        Some(s) => format!("{:.1}h", s / 3_600.0),
    }
}

/// A column of a table: its heading, its width, and which side its cells keep to.
struct Column(&'static str, usize, Align);

/// Numbers keep to the right, words to the left.
#[derive(Clone, Copy)]
enum Align {
    Left,
    Right,
}
use Align::{Left, Right};

/// Writes a table: a heading line, then a line per row, each cell padded to its column, and
/// last the row's free-width cell (an error, a verdict) under `last`.
fn table<const N: usize>(
    out: &mut String,
    columns: &[Column; N],
    last: &str,
    rows: impl IntoIterator<Item = ([String; N], String)>,
) {
    line(
        out,
        columns,
        &columns.each_ref().map(|c| c.0.to_owned()),
        last,
    );
    for (cells, free) in rows {
        line(out, columns, &cells, &free);
    }
}

fn line<const N: usize>(out: &mut String, columns: &[Column; N], cells: &[String; N], last: &str) {
    for (Column(_, width, align), cell) in columns.iter().zip(cells) {
        let _ = match align {
            Left => write!(out, "{cell:<width$} "),
            Right => write!(out, "{cell:>width$} "),
        };
    }
    let _ = writeln!(out, " {last}");
}

/// Seconds from `then` to `now`, never negative (the clocks may be a database's and this
/// machine's).
fn seconds_since(
    then: chrono::DateTime<chrono::Utc>,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<f64> {
    Some(((now - then).num_milliseconds() as f64 / 1e3).max(0.0))
}

/// A handler's last error for a table cell: `-` when there is none.
fn last_error(error: Option<&str>) -> String {
    printable(error.unwrap_or("-")).into_owned()
}

/// Seconds left on a subscription's lease at `measured_at` (negative once expired).
fn lease_remaining(
    sub: &SubscriptionStatus,
    measured_at: chrono::DateTime<chrono::Utc>,
) -> Option<f64> {
    sub.lease_expires_at
        .map(|at| (at - measured_at).num_milliseconds() as f64 / 1e3)
}

/// Who holds a subscription's lease, for the tables: the runner's id (first 8 hex digits) and
/// the time left, or that nobody runs it.
pub(crate) fn run_by(owner: Option<uuid::Uuid>, remaining: Option<f64>) -> String {
    match (owner, remaining) {
        (Some(owner), Some(left)) if left > 0.0 => {
            format!("{} ({left:.0}s left)", &owner.simple().to_string()[..8])
        }
        (Some(_), Some(left)) => format!("nobody (expired {:.0}s)", -left),
        _ => "nobody".to_owned(),
    }
}
