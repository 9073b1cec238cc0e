//! Telling a sink that is down from messages that fail: an **outage** costs no attempt and
//! parks nothing; the relay backs off (capped, jittered) and resumes by itself.
//!
//! A flight is judged an outage when
//! - the sink failed as a whole (`send` returned `Err`, or its connection could not be
//!   rebuilt), or
//! - nothing of it was delivered, no message was refused permanently, and **no other flight
//!   delivered anything since it was sent**: every message failed transiently or got no
//!   outcome while the sink delivered nothing at all.
//!
//! Why "delivered since it was sent": a dead broker, a missing stream, a black-holed link and
//! an endpoint answering 503 to everything all look, message by message, like failures of
//! each message; what tells them from one bad message is whether anything else gets through
//! meanwhile. A batch in which something was delivered proves the sink works, so its failures
//! are its messages'. The price: a bad message that is the only traffic is taken for an
//! outage (retried with a capped backoff, never parked) until some other event is delivered
//! beside it or after it was sent; then it is blamed as usual.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use super::runner::Verdict;
use crate::consumer::SinkDown;

pub use crate::telemetry::metrics::RELAY_SINK_DOWN;

/// How often a sink that stays down is logged again.
const LOG_AGAIN_EVERY: Duration = Duration::from_secs(30);

/// What the relay knows of its sink's health.
#[derive(Default)]
pub(super) struct Health {
    /// When a flight last landed with a delivery.
    last_delivery: Option<Instant>,
    down: Option<Down>,
}

struct Down {
    since: DateTime<Utc>,
    reason: String,
    /// Outage flights in a row: the backoff's exponent.
    streak: u32,
    logged_at: Instant,
}

/// A flight's verdicts judged: an outage, with the text for the status and logs.
pub(super) enum Judged {
    Working,
    /// Back again after being down since then.
    Recovered(DateTime<Utc>),
    /// Down: the released events wait out the backoff of outage `streak`; `log` is the state
    /// to log and show, at the first outage flight and every 30 s after.
    Down {
        streak: u32,
        log: Option<SinkDown>,
    },
}

impl Health {
    /// Judges a flight sent at `sent_at`; in an outage, every verdict but a permanent failure
    /// becomes blameless.
    pub(super) fn judge(&mut self, sent_at: Instant, verdicts: &mut [Verdict]) -> Judged {
        let now = Instant::now();
        if verdicts
            .iter()
            .any(|verdict| matches!(verdict, Verdict::Delivered))
        {
            self.last_delivery = Some(now);
            return match self.down.take() {
                Some(down) => Judged::Recovered(down.since),
                None => Judged::Working,
            };
        }
        let Some(reason) = outage_reason(verdicts, self.works_since(sent_at)) else {
            return Judged::Working;
        };
        for verdict in verdicts.iter_mut() {
            if !matches!(verdict, Verdict::Failed(error) if error.is_permanent()) {
                *verdict = Verdict::Blameless(reason.clone());
            }
        }
        let down = self.down.get_or_insert_with(|| Down {
            since: Utc::now(),
            reason: reason.clone(),
            streak: 0,
            logged_at: now,
        });
        down.streak += 1;
        let first = down.streak == 1;
        let log = (first || now.duration_since(down.logged_at) >= LOG_AGAIN_EVERY).then(|| {
            down.logged_at = now;
            down.reason.clone_from(&reason);
            SinkDown::new(down.since, &down.reason)
        });
        Judged::Down {
            streak: down.streak,
            log,
        }
    }

    fn works_since(&self, sent_at: Instant) -> bool {
        self.last_delivery.is_some_and(|at| at > sent_at)
    }
}

/// Why a flight that delivered nothing is an outage, or `None` when its failures are its
/// messages' (see the module docs).
fn outage_reason(verdicts: &[Verdict], sink_works: bool) -> Option<String> {
    let sink_failed = verdicts.iter().find_map(|verdict| match verdict {
        Verdict::Blameless(why) => Some(why.clone()),
        _ => None,
    });
    if sink_failed.is_some() {
        return sink_failed;
    }
    let all_transient = verdicts.iter().all(|verdict| match verdict {
        Verdict::Failed(error) => !error.is_permanent(),
        Verdict::Unresolved(_) => true,
        Verdict::Delivered | Verdict::Blameless(_) => false,
    });
    if sink_works || !all_transient {
        return None;
    }
    verdicts.first().map(|verdict| match verdict {
        Verdict::Failed(error) => format!("every message of a batch failed: {}", error.message()),
        Verdict::Unresolved(why) | Verdict::Blameless(why) => why.clone(),
        Verdict::Delivered => String::new(),
    })
}
