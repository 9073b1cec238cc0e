//! [`OutboxStatus`] for Prometheus: the text exposition format, gauges only, as
//! `ordo status --prometheus` prints it.

use std::fmt::Write;

use super::status::OutboxStatus;
use crate::consumer::{RunStatus, SubscriptionStatus};
use crate::inbox::{FailedCount, MarkStatus, MarkWait};
use crate::position::Ordering;
use crate::telemetry::needs_escape;

/// A gauge: its name, its help text, and its samples (a label set, `{lane="insert"}` or empty,
/// and a value each).
type Gauge = (&'static str, &'static str, Vec<(String, f64)>);

/// `status` in Prometheus text exposition format (gauges), as `ordo status --prometheus`
/// prints it.
pub fn prometheus_text(status: &OutboxStatus) -> String {
    let mut out = String::new();
    let gauges = positions(status)
        .into_iter()
        .chain(lanes(status))
        .chain(subscriptions(status))
        .chain(dead_letters(status))
        .chain(inbox(status))
        .chain([stalls(status)])
        .chain(schema(status));
    for (name, help, samples) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    }
    out
}

fn positions(status: &OutboxStatus) -> [Gauge; 5] {
    let plain = |value: u64| vec![(String::new(), value as f64)];
    [
        (
            "ordo_sequence_head",
            "Highest sequence drawn, committed or not.",
            plain(status.sequence_head.get()),
        ),
        (
            "ordo_committed_head",
            "Highest committed sequence.",
            plain(status.committed_head.get()),
        ),
        (
            "ordo_insert_frontier",
            "Every sequence at or below it is resolved.",
            plain(status.insert_frontier.get()),
        ),
        (
            "ordo_commit_head",
            "Rows in the commit log.",
            plain(status.commit_head.get()),
        ),
        (
            "ordo_logged_through_sequence",
            "Every real event at or below it is logged.",
            plain(status.logged_through_sequence.get()),
        ),
    ]
}

fn schema(status: &OutboxStatus) -> [Gauge; 2] {
    [
        (
            "ordo_default_partition_events",
            "Events in the default partition: the partitions made ahead ran out.",
            vec![(String::new(), status.default_partition_events as f64)],
        ),
        (
            "ordo_unknown_migrations",
            "Migrations in ordo._sqlx_migrations this ordo does not know (a newer ordo migrated).",
            vec![(String::new(), status.unknown_migrations.len() as f64)],
        ),
    ]
}

fn lanes(status: &OutboxStatus) -> [Gauge; 2] {
    let lanes = [
        (Ordering::Insert, &status.insert_lane),
        (Ordering::Commit, &status.commit_lane),
    ];
    let samples = |events: bool| {
        lanes
            .iter()
            .filter_map(|(lane, lag)| {
                let value = if events {
                    Some(lag.events as f64)
                } else {
                    lag.seconds
                };
                value.map(|v| (format!("{{lane=\"{lane}\"}}"), v))
            })
            .collect()
    };
    [
        (
            "ordo_lane_lag_events",
            "Committed events a lane has not passed yet.",
            samples(true),
        ),
        (
            "ordo_lane_lag_seconds",
            "Age of the oldest event a lane has not passed yet.",
            samples(false),
        ),
    ]
}

fn subscriptions(status: &OutboxStatus) -> [Gauge; 12] {
    let samples = |value: &dyn Fn(&SubscriptionStatus) -> Option<f64>| {
        status
            .subscriptions
            .iter()
            .filter_map(|s| {
                let labels = format!(
                    "{{subscription=\"{}\",lane=\"{}\"}}",
                    escape(&s.name),
                    s.lane
                );
                value(s).map(|v| (labels, v))
            })
            .collect()
    };
    [
        (
            "ordo_subscription_position",
            "A subscription's checkpoint.",
            samples(&|s| Some(s.position.get() as f64)),
        ),
        (
            "ordo_subscription_lag",
            "Positions between a subscription's checkpoint and its lane's head.",
            samples(&|s| Some(s.lag as f64)),
        ),
        (
            "ordo_subscription_oldest_unprocessed_seconds",
            "Age of the first event a subscription has not handled.",
            samples(&|s| s.oldest_unprocessed_seconds),
        ),
        (
            "ordo_subscription_halted",
            "1 when a subscription is halted.",
            samples(&|s| Some(f64::from(u8::from(s.status == RunStatus::Halted)))),
        ),
        (
            "ordo_subscription_stalled_keys",
            "A keyed subscription's keys waiting on a stalled event.",
            samples(&|s| Some(s.stalled.len() as f64)),
        ),
        (
            "ordo_subscription_sink_down",
            "1 when a relay's owner finds its sink down (an outage), else 0.",
            samples(&|s| Some(f64::from(u8::from(s.sink_down.is_some())))),
        ),
        (
            "ordo_subscription_sink_down_seconds",
            "Seconds since a relay's owner found its sink down; absent while it answers.",
            samples(&|s| s.sink_down.as_ref().map(|down| age(status, down.since))),
        ),
        (
            "ordo_subscription_dead_letters",
            "Dead letters of a subscription: events it gave up on, waiting for an operator.",
            samples(&|s| s.dead_letters.map(|dead| dead.count as f64)),
        ),
        (
            "ordo_subscription_oldest_dead_letter_seconds",
            "Age of a subscription's oldest dead letter; absent when it has none.",
            samples(&|s| {
                s.dead_letters
                    .and_then(|dead| dead.oldest_at)
                    .map(|oldest| age(status, oldest))
            }),
        ),
        (
            "ordo_subscription_backlog_events",
            "Events in a keyed subscription's or relay's stuck keys' backlogs, out of its window.",
            samples(&|s| s.backlog.map(|backlog| backlog.events as f64)),
        ),
        (
            "ordo_subscription_backlog_bytes",
            "What the events in a subscription's stuck keys' backlogs weigh, as stored.",
            samples(&|s| s.backlog.map(|backlog| backlog.bytes as f64)),
        ),
        (
            "ordo_subscription_backlog_oldest_seconds",
            "Age of the oldest event in a subscription's backlogs; absent when they are empty.",
            samples(&|s| {
                s.backlog
                    .and_then(|backlog| backlog.oldest_at)
                    .map(|oldest| age(status, oldest))
            }),
        ),
    ]
}

/// Every dead letter, of every subscription (a deleted one's too).
fn dead_letters(status: &OutboxStatus) -> [Gauge; 2] {
    let oldest = status.dead_letters.oldest_at;
    [
        (
            "ordo_dead_letters",
            "Dead letters of every subscription, deleted ones' included.",
            vec![(String::new(), status.dead_letters.count as f64)],
        ),
        (
            "ordo_oldest_dead_letter_seconds",
            "Age of the oldest dead letter; absent when there is none.",
            oldest
                .map(|oldest| (String::new(), age(status, oldest)))
                .into_iter()
                .collect(),
        ),
    ]
}

/// The receiving side: each consumer's failed messages, each watermark's position, and what
/// holds it.
fn inbox(status: &OutboxStatus) -> [Gauge; 5] {
    let consumer = |name: &str| format!("{{consumer=\"{}\"}}", escape(name));
    let failed = |value: &dyn Fn(&FailedCount) -> f64| {
        status
            .inbox
            .failed
            .iter()
            .map(|failed| (consumer(&failed.consumer), value(failed)))
            .collect()
    };
    let marks = |value: &dyn Fn(&MarkStatus) -> Option<f64>| {
        status
            .inbox
            .marks
            .iter()
            .filter_map(|mark| {
                let labels = format!(
                    "{{consumer=\"{}\",source=\"{}\",route=\"{}\"}}",
                    escape(&mark.consumer),
                    escape(&mark.source),
                    escape(&mark.route)
                );
                value(mark).map(|v| (labels, v))
            })
            .collect()
    };
    [
        (
            "ordo_inbox_failed_messages",
            "Failed messages of an inbox consumer, waiting for an operator (ordo inbox failed).",
            failed(&|failed| failed.count as f64),
        ),
        (
            "ordo_inbox_oldest_failed_seconds",
            "Age of an inbox consumer's oldest failed message.",
            failed(&|failed| age(status, failed.oldest_at)),
        ),
        (
            "ordo_inbox_watermark_position",
            "The highest position a watermark consumer handled from a source's route.",
            marks(&|mark| Some(mark.position as f64)),
        ),
        (
            "ordo_inbox_watermark_failing_attempts",
            "Failed attempts of the position a watermark waits on (0 when none fails).",
            marks(&|mark| match &mark.waits_on {
                Some(MarkWait::Failing { attempts, .. }) => Some(f64::from(*attempts)),
                _ => Some(0.0),
            }),
        ),
        (
            "ordo_inbox_gap_seconds",
            "How long a watermark consumer has waited on a position that has not arrived; absent when it waits on none (or for less than 5 s).",
            marks(&|mark| match &mark.waits_on {
                Some(MarkWait::Gap { seconds, .. }) => Some(*seconds),
                _ => None,
            }),
        ),
    ]
}

/// Seconds from `then` to the status's reading, never negative.
fn age(status: &OutboxStatus, then: chrono::DateTime<chrono::Utc>) -> f64 {
    ((status.measured_at - then).num_milliseconds() as f64 / 1e3).max(0.0)
}

fn stalls(status: &OutboxStatus) -> Gauge {
    let samples = status
        .stalls
        .iter()
        .map(|s| {
            let holder = s
                .holder
                .as_ref()
                .map_or(String::new(), |b| b.pid.to_string());
            (
                format!("{{lane=\"{}\",holder_pid=\"{holder}\"}}", s.lane),
                s.seconds.unwrap_or(0.0),
            )
        })
        .collect();
    (
        "ordo_stall_seconds",
        "How long a lane has been held back, by lane and holder.",
        samples,
    )
}

/// A label value as the exposition format writes it.
fn escape(label: &str) -> String {
    let mut out = String::with_capacity(label.len());
    for c in label.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            // The exposition format has no escape for these; a terminal reading the output
            // must not act on them either.
            c if needs_escape(c) => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}
