//! What operators read: [`OutboxStatus`], the subscriptions, dead letters and a retention
//! report as tables, and any text made safe for a terminal.

use std::fmt::Write;

use super::retention::RetentionReport;
use super::status::{LagClock, OutboxStatus, Stall};
use crate::consumer::{DeadLetterCount, StalledKey, SubscriptionStatus};
use crate::inbox::{FailedMessage, Watermark};
use crate::position::Ordering;
use crate::subscription::DeadLetter;
pub use crate::telemetry::printable;

fn age(seconds: Option<f64>) -> String {
    match seconds {
        None => "-".to_owned(),
        Some(s) if s < 1.0 => format!("{:.0}ms", s * 1e3),
        Some(s) if s < 120.0 => format!("{s:.1}s"),
        Some(s) if s < 7_200.0 => format!("{:.1}m", s / 60.0),
        Some(s) => format!("{:.1}h", s / 3_600.0),
    }
}

/// A readable report of `status`, as `ordo status` prints it.
pub fn status_table(status: &OutboxStatus) -> String {
    let mut out = String::new();
    let clock = match status.lag_clock {
        LagClock::CommitTimestamp => "commit time (track_commit_timestamp = on)",
        LagClock::RecordedAt => "recorded_at (turn on track_commit_timestamp for commit-time lag)",
    };
    let _ = writeln!(
        out,
        "ordo status at {}",
        status.measured_at.format("%Y-%m-%d %H:%M:%S%.3f UTC")
    );
    let _ = writeln!(out, "lag measured from {clock}");
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<14} {:>12} {:>12} {:>10}",
        "LANE", "POSITION", "LAG EVENTS", "LAG AGE"
    );
    let _ = writeln!(
        out,
        "{:<14} {:>12} {:>12} {:>10}   (head {}, highest committed {})",
        Ordering::Insert.as_str(),
        status.insert_frontier,
        status.insert_lane.events,
        age(status.insert_lane.seconds),
        status.sequence_head,
        status.committed_head
    );
    let _ = writeln!(
        out,
        "{:<14} {:>12} {:>12} {:>10}   (logged through sequence {}, last append {} ago)",
        Ordering::Commit.as_str(),
        status.commit_head,
        status.commit_lane.events,
        age(status.commit_lane.seconds),
        status.logged_through_sequence,
        age(status.sequencer_idle_seconds)
    );
    let _ = writeln!(out);
    write_subscriptions(&mut out, &status.subscriptions, status.measured_at);
    if let Some(oldest) = status.dead_letters.oldest_at {
        let _ = writeln!(
            out,
            "\ndead letters: {}, the oldest written {} ago ({}); `ordo dead-letters` lists them",
            status.dead_letters.count,
            age(seconds_since(oldest, status.measured_at)),
            oldest.format("%Y-%m-%d %H:%M:%S UTC")
        );
    }
    if let Some(first) = status.rows_above_head.first() {
        let _ = writeln!(
            out,
            "\nrows above the sequence head {}: {} (first {first}); no publish wrote them: delete them, or setval ordo.events_sequence past them",
            status.sequence_head,
            status.rows_above_head.len()
        );
    }
    for warning in &status.warnings {
        let _ = writeln!(out, "\nwarning: {warning}");
    }
    let _ = writeln!(out);
    if status.stalls.is_empty() {
        let _ = writeln!(out, "no stalls");
    }
    for stall in &status.stalls {
        write_stall(&mut out, stall);
    }
    out
}

/// The subscriptions section of [`status_table`].
fn write_subscriptions(
    out: &mut String,
    subscriptions: &[SubscriptionStatus],
    measured_at: chrono::DateTime<chrono::Utc>,
) {
    if subscriptions.is_empty() {
        let _ = writeln!(out, "no subscriptions");
        return;
    }
    subscription_rows(out, subscriptions, measured_at);
}

/// One line per subscription, with who runs it as of `now` (the lease's owner and time left,
/// or nobody): a subscription that is `active` but run by nobody is visible as such.
fn subscription_rows(
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

fn write_stall(out: &mut String, stall: &Stall) {
    let _ = writeln!(
        out,
        "STALL on the {} lane for {}: {}",
        stall.lane,
        age(stall.seconds),
        printable(&stall.reason)
    );
    let backends = stall
        .holder
        .iter()
        .map(|b| ("holder", b))
        .chain(stall.suspects.iter().map(|b| ("suspect", b)));
    for (role, backend) in backends {
        // A monitoring role without pg_read_all_stats sees no state, start or query of other
        // roles' sessions: say so rather than print blanks.
        let state = if backend.state.is_empty() {
            "hidden"
        } else {
            backend.state.as_str()
        };
        let _ = writeln!(
            out,
            "  {role}: pid {} application \"{}\" state {} transaction age {}  query: {}",
            backend.pid,
            printable(&backend.application_name),
            printable(state),
            age(backend.transaction_seconds),
            printable(&backend.query)
        );
    }
    for prepared in &stall.prepared {
        let _ = writeln!(
            out,
            "  prepared transaction: gid \"{}\" owner {} xid {} prepared {} ago  (COMMIT PREPARED or ROLLBACK PREPARED it)",
            printable(&prepared.gid),
            printable(&prepared.owner),
            prepared.transaction_id,
            age(prepared.prepared_seconds)
        );
    }
    if stall
        .holder
        .iter()
        .chain(&stall.suspects)
        .any(|b| b.state.is_empty())
    {
        let _ = writeln!(
            out,
            "  (states and queries of other roles' sessions are hidden from this role: GRANT pg_read_all_stats TO it to see them)"
        );
    }
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
/// for a terminal.
pub fn dead_letters_table(letters: &[DeadLetter]) -> String {
    let mut out = String::new();
    let columns = [
        Column("ID", 8, Right),
        Column("SUBSCRIPTION", 24, Left),
        Column("LANE", 6, Left),
        Column("POSITION", 10, Right),
        Column("SEQUENCE", 10, Right),
        Column("ATTEMPTS", 8, Right),
    ];
    let rows = letters.iter().map(|letter| {
        let cells = [
            letter.id.to_string(),
            printable(&letter.subscription).into_owned(),
            letter.lane.to_string(),
            letter.position.to_string(),
            letter.sequence.to_string(),
            letter.attempts.to_string(),
        ];
        (cells, printable(&letter.error).into_owned())
    });
    table(&mut out, &columns, "ERROR", rows);
    out
}

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
/// source), safe for a terminal; a mark waiting on a gap says which position, since when, and
/// what ends it.
pub fn watermarks_table(marks: &[Watermark]) -> String {
    let mut out = String::new();
    let columns = [
        Column("CONSUMER", 24, Left),
        Column("SOURCE", 24, Left),
        Column("POSITION", 12, Right),
        Column("ATTEMPTS", 8, Right),
    ];
    let rows = marks.iter().map(|mark| {
        let note = match &mark.gap {
            Some(gap) => format!(
                "waiting on a gap since {}: position {} has not arrived, {} was refused; if it never will, ordo inbox set-watermark",
                gap.since.format("%Y-%m-%d %H:%M:%S UTC"),
                gap.expected,
                gap.received
            ),
            None => last_error(mark.last_error.as_deref()),
        };
        let cells = [
            printable(&mark.consumer).into_owned(),
            printable(&mark.source).into_owned(),
            mark.position.to_string(),
            mark.attempts.to_string(),
        ];
        (cells, note)
    });
    table(&mut out, &columns, "LAST ERROR", rows);
    out
}

/// A retention report as `ordo retention` prints it: the positions that bound it, each
/// partition with its verdict, and what was created or folded. `applied`: the report is of a
/// run ([`run_retention`](crate::admin::run_retention)), not a plan.
pub fn retention_table(report: &RetentionReport, applied: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "partition size {}; lowest stored sequence {}; needed from sequence {} by {}",
        report.partition_size,
        report.events_floor,
        report.needed_from,
        printable(&report.needed_by)
    );
    let _ = writeln!(
        out,
        "head {}; {} partition(s) ahead of it; range partitions end before {}; {} event(s) in the default partition",
        report.head, report.partitions_ahead, report.covered_until, report.default_rows
    );
    if let Some(warning) = &report.warning {
        let _ = writeln!(out, "WARNING: {warning}");
    }
    let columns = [
        Column("PARTITION", 28, Left),
        Column("FROM", 14, Right),
        Column("TO", 14, Right),
    ];
    let rows = report.partitions.iter().map(|partition| {
        let verdict = match (partition.drop, applied) {
            (true, true) if report.dropped.contains(&partition.name) => "dropped".to_owned(),
            (true, true) => "kept: no longer droppable when its turn came".to_owned(),
            (true, false) => "would drop (past retention)".to_owned(),
            (false, _) => format!("kept: {}", printable(&partition.reason)),
        };
        let from = partition
            .from
            .map_or("MINVALUE".to_owned(), |f| f.to_string());
        (
            [partition.name.clone(), from, partition.to.to_string()],
            verdict,
        )
    });
    table(&mut out, &columns, "VERDICT", rows);
    for folded in &report.folded {
        let _ = writeln!(out, "folded the default partition into {folded}");
    }
    for created in &report.created {
        let _ = writeln!(out, "created {created}");
    }
    if !applied {
        let _ = writeln!(out, "(a plan: run with --apply to create, fold and drop)");
    }
    out
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
