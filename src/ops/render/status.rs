//! The status report of `ordo status`: the lanes, the subscriptions, the inbox, dead letters,
//! warnings, and what is stuck.

use std::fmt::Write;

use super::inbox::inbox_section;
use super::stuck::{NOTHING_STUCK, stuck_lines};
use super::subscriptions::subscription_rows;
use super::{age, printable, seconds_since};
use crate::consumer::SubscriptionStatus;
use crate::ops::status::{LagClock, OutboxStatus, Stall};
use crate::position::Ordering;

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
    inbox_section(&mut out, &status.inbox, status.measured_at);
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
    let stuck = stuck_lines(status);
    if status.stalls.is_empty() && stuck.is_empty() {
        let _ = writeln!(out, "{NOTHING_STUCK}");
    }
    for stall in &status.stalls {
        write_stall(&mut out, stall);
    }
    for line in stuck {
        let _ = writeln!(out, "STUCK {line}");
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

pub(super) fn write_stall(out: &mut String, stall: &Stall) {
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
