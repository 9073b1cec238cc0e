//! The end of `ordo status`: one line per thing that is stuck and waits for someone, whatever
//! it is (a lane held by a transaction is a `STALL` line of its own), or one line saying that
//! nothing is, and what that covers.

use super::inbox::stuck_mark;
use super::{age, printable, seconds_since};
use crate::consumer::{RunStatus, SubscriptionStatus};
use crate::ops::status::OutboxStatus;

/// What "nothing is stuck" covers, so that no reader takes it for more.
pub(super) const NOTHING_STUCK: &str = "nothing is stuck: no lane stall, no halted subscription or relay, no stalled key or parked event, no relay waiting on its sink, no inbox message failing or waiting on a gap";

impl OutboxStatus {
    /// What is stuck and waits for someone, one line each, as the end of `ordo status` says
    /// it (a lane held by a transaction, a halted subscription or relay, stalled keys or parked
    /// events, a sink down, an inbox mark held); empty when nothing is. `ordo status --check`
    /// fails when this is not empty.
    ///
    /// ```no_run
    /// # async fn example(pool: sqlx::PgPool) -> ordo::Result<()> {
    /// let status = ordo::admin::status(&pool).await?;
    /// for line in status.stuck() {
    ///     eprintln!("stuck: {line}");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn stuck(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .stalls
            .iter()
            .map(|stall| {
                let mut line = String::new();
                super::status::write_stall(&mut line, stall);
                line.trim_end().to_owned()
            })
            .collect();
        lines.extend(stuck_lines(self));
        lines
    }
}

/// One line per stuck thing that is not a lane stall: a halted subscription or relay, a
/// subscription's stalled keys or a relay's parked events, a relay's sink that is down, an
/// inbox mark held by a failing message or a gap. Each says where to look or what ends it.
pub(super) fn stuck_lines(status: &OutboxStatus) -> Vec<String> {
    let mut lines = Vec::new();
    for sub in &status.subscriptions {
        subscription_lines(&mut lines, sub, status.measured_at);
    }
    lines.extend(status.inbox.marks.iter().filter_map(stuck_mark));
    lines
}

fn subscription_lines(
    lines: &mut Vec<String>,
    sub: &SubscriptionStatus,
    now: chrono::DateTime<chrono::Utc>,
) {
    let relay = sub.kind.as_deref() == Some("relay");
    let (what, command) = if relay {
        ("relay", "ordo relay")
    } else {
        ("subscription", "ordo subscriptions")
    };
    let name = printable(&sub.name);
    if sub.status == RunStatus::Halted {
        lines.push(format!(
            "{what} \"{name}\" is halted at {} position {}: {}; `{command} resume {name}` runs it again once the cause is fixed",
            sub.lane,
            sub.position,
            printable(sub.last_error.as_deref().unwrap_or("no error recorded"))
        ));
    }
    if let Some(down) = &sub.sink_down {
        lines.push(format!(
            "{what} \"{name}\": its sink is down, for {} ({}); it backs off and resumes by itself once the sink answers",
            age(seconds_since(down.since, now)),
            printable(&down.reason)
        ));
    }
    if let Some(first) = sub.stalled.first() {
        let (held, list) = if relay {
            ("parked event(s) hold their keys", "parked")
        } else {
            ("stalled key(s) wait on their events", "stalled")
        };
        let key = if first.key.is_empty() {
            "(no key)".to_owned()
        } else {
            format!("key \"{}\"", printable(&first.key))
        };
        lines.push(format!(
            "{what} \"{name}\": {} {held} (the first: {key} at {} position {}, {} attempt(s): {}){}; `{command} {list} {name}` lists them",
            sub.stalled.len(),
            sub.lane,
            first.position,
            first.attempts,
            printable(&first.error),
            backlog_text(sub, now),
        ));
    } else if sub.backlog.is_some_and(|backlog| backlog.events > 0) {
        lines.push(format!(
            "{what} \"{name}\": no stalled event holds its keys' backlogs{}, which its runner takes back in order",
            backlog_text(sub, now),
        ));
    }
}

/// `, with N events of K keys (B bytes) in their backlogs for T`, when there are any.
fn backlog_text(sub: &SubscriptionStatus, now: chrono::DateTime<chrono::Utc>) -> String {
    match sub.backlog {
        Some(backlog) if backlog.events > 0 => format!(
            ", with {} event(s) of {} key(s) ({} bytes) in their backlogs{} (`ordo subscriptions backlog {}`)",
            backlog.events,
            backlog.keys,
            backlog.bytes,
            backlog
                .oldest_at
                .map(|at| format!(" for {}", age(seconds_since(at, now))))
                .unwrap_or_default(),
            printable(&sub.name),
        ),
        _ => String::new(),
    }
}
