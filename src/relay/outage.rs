//! Telling a sink that is down from messages that fail: an **outage** costs no attempt and
//! parks nothing; the relay backs off (capped, jittered) and resumes by itself.
//!
//! Blame is taken from what the sink said, never from the traffic around a message. A flight
//! that delivered nothing is an outage when
//! - the sink failed as a whole (`send` returned `Err`, or its connection could not be
//!   rebuilt);
//! - every message it did not refuse permanently is [`SendError::Unavailable`]: what the sink
//!   says about itself (a connection refused, no stream bound, a missing exchange); or
//! - a failure could be the sink's as well as the message's (a transient failure, a message
//!   without an outcome) and the sink did not answer its probe (`Sink::probe`, asked by
//!   `flight.rs`).
//!
//! Otherwise its failures are its messages': each counts an attempt and backs off, and parks
//! after the maximum, **even when nothing else is in flight**. A flight with a delivery is
//! never an outage.
//!
//! Why not "no other delivery since it was sent", the rule before 2026-12-07: a bad message
//! that was the relay's only traffic (a webhook's `500`, a JetStream refusal) was taken for an
//! outage, re-sent for ever and never parked, and the relay showed the sink down while it
//! answered everything else. Whether other messages get through says nothing about a message
//! that travels alone; what the sink answered about it does, and where it answered nothing
//! (a timeout), a question asked of the sink itself does.
//!
//! [`SendError::Unavailable`]: super::SendError::Unavailable

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
    /// Judges a landed flight from its verdicts and, when the sink was asked, its `probe`;
    /// in an outage, every verdict but a permanent failure becomes blameless.
    pub(super) fn judge(
        &mut self,
        verdicts: &mut [Verdict],
        probe: Option<&Result<(), String>>,
    ) -> Judged {
        let now = Instant::now();
        let Some(reason) = outage_reason(verdicts, probe) else {
            // A delivery, or an answered probe, shows the sink working; a flight of permanent
            // refusals alone (made before anything was sent, maybe) shows nothing either way.
            let answered = matches!(probe, Some(Ok(())))
                || verdicts
                    .iter()
                    .any(|verdict| matches!(verdict, Verdict::Delivered));
            return match self.down.take_if(|_| answered) {
                Some(down) => Judged::Recovered(down.since),
                None => Judged::Working,
            };
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
}

/// Whether a flight's failures could be the sink's as well as its messages', so that the sink
/// is probed before they are counted: nothing delivered, the sink did not fail as a whole, and
/// a message failed transiently or got no outcome.
pub(super) fn in_doubt(verdicts: &[Verdict]) -> bool {
    let mut doubtful = false;
    for verdict in verdicts {
        match verdict {
            Verdict::Delivered | Verdict::Blameless(_) => return false,
            Verdict::Failed(error) if error.is_permanent() || error.is_unavailable() => {}
            Verdict::Failed(_) | Verdict::Unresolved(_) => doubtful = true,
        }
    }
    doubtful
}

/// Why a flight is an outage, or `None` when its failures are its messages' (see the module
/// docs).
fn outage_reason(verdicts: &[Verdict], probe: Option<&Result<(), String>>) -> Option<String> {
    if verdicts
        .iter()
        .any(|verdict| matches!(verdict, Verdict::Delivered))
    {
        return None;
    }
    let mut unavailable = None;
    let mut doubtful = None;
    for verdict in verdicts {
        match verdict {
            Verdict::Delivered => {}
            Verdict::Blameless(why) => return Some(why.clone()),
            Verdict::Failed(error) if error.is_unavailable() => {
                unavailable.get_or_insert_with(|| error.message().to_owned());
            }
            Verdict::Failed(error) if error.is_permanent() => {}
            Verdict::Failed(error) => {
                doubtful.get_or_insert_with(|| error.message().to_owned());
            }
            Verdict::Unresolved(why) => {
                doubtful.get_or_insert_with(|| why.clone());
            }
        }
    }
    match (doubtful, probe) {
        (None, _) => unavailable.map(|why| format!("every message of a batch failed: {why}")),
        (Some(failed), Some(Err(why))) => Some(format!(
            "every message of a batch failed ({failed}), and the sink failed its probe: {why}"
        )),
        (Some(_), _) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{Health, Judged, in_doubt};
    use crate::relay::SendError;
    use crate::relay::runner::Verdict;

    fn failed(error: SendError) -> Verdict {
        Verdict::Failed(error)
    }

    #[test]
    fn a_lone_failure_is_the_messages_once_the_sink_answers_its_probe() {
        let mut health = Health::default();
        let mut verdicts = vec![failed(SendError::transient("the endpoint answered 500"))];
        assert!(in_doubt(&verdicts));
        let judged = health.judge(&mut verdicts, Some(&Ok(())));
        assert!(matches!(judged, Judged::Working));
        assert!(matches!(&verdicts[0], Verdict::Failed(error) if !error.is_unavailable()));
    }

    #[test]
    fn a_probe_unanswered_makes_an_outage_and_an_answer_ends_it() {
        let mut health = Health::default();
        let mut verdicts = vec![
            failed(SendError::transient("no ack")),
            Verdict::Unresolved("the batch deadline expired".to_owned()),
        ];
        let judged = health.judge(&mut verdicts, Some(&Err("no answer".to_owned())));
        assert!(matches!(
            judged,
            Judged::Down {
                streak: 1,
                log: Some(_)
            }
        ));
        assert!(verdicts.iter().all(
            |verdict| matches!(verdict, Verdict::Blameless(why) if why.contains("no answer"))
        ));
        let mut verdicts = vec![failed(SendError::transient("nacked"))];
        assert!(matches!(
            health.judge(&mut verdicts, Some(&Ok(()))),
            Judged::Recovered(_)
        ));
    }

    #[test]
    fn what_the_sink_says_about_itself_needs_no_probe() {
        let unavailable = || SendError::Unavailable {
            message: "no responders".to_owned(),
            retry_after: std::time::Duration::from_secs(1),
        };
        let mut verdicts = vec![failed(unavailable()), failed(SendError::permanent("bad"))];
        assert!(!in_doubt(&verdicts));
        let judged = Health::default().judge(&mut verdicts, None);
        assert!(matches!(judged, Judged::Down { .. }));
        assert!(matches!(&verdicts[1], Verdict::Failed(error) if error.is_permanent()));
        // A delivery anywhere in the flight: never an outage, whatever else failed.
        let mut verdicts = vec![Verdict::Blameless("lost".to_owned()), Verdict::Delivered];
        assert!(!in_doubt(&verdicts));
        let judged = Health::default().judge(&mut verdicts, None);
        assert!(matches!(judged, Judged::Working));
        // Permanent refusals alone say nothing of the sink: no probe, no outage.
        let mut verdicts = vec![failed(SendError::permanent("a line break in the key"))];
        assert!(!in_doubt(&verdicts));
        assert!(matches!(
            Health::default().judge(&mut verdicts, None),
            Judged::Working
        ));
    }
}
