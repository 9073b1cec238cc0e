//! A batch in flight: a task that owns one sink (a *carrier*) while it sends. A relay with
//! several carriers has as many batches in flight, so a slow receiver holds one carrier while
//! the others go on with the keys it does not hold.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;

use super::runner::Verdict;
use super::{Message, Outcomes, Sink};
use crate::consumer::lanes::Slot;

/// A sink, and whether its connection must be rebuilt before its next send.
pub(super) struct Carrier<K> {
    pub(super) sink: K,
    pub(super) broken: bool,
}

/// A batch back from its flight.
pub(super) struct Landed<K> {
    pub(super) carrier: Carrier<K>,
    pub(super) slots: Vec<Slot>,
    pub(super) messages: Vec<Message>,
    /// One per message.
    pub(super) verdicts: Vec<Verdict>,
    /// Why it ended early (the deadline, the sink's failure, a panic), if it did.
    pub(super) cut_short: Option<String>,
    /// What the sink answered when probed after a flight whose failures could be its own
    /// (`outage.rs`); `None` when it was not asked.
    pub(super) probe: Option<Result<(), String>>,
}

/// How a batch's `send` ended.
enum Ended {
    /// `send` returned `Ok`.
    Returned,
    /// The sink as a whole failed: `send` returned `Err`, or its connection could not be
    /// rebuilt. Nobody's fault but the sink's.
    SinkFailed(String),
    /// `send` did not finish: the deadline expired or it panicked.
    Unfinished(String),
}

/// Sends `messages` with `carrier` under `deadline`, which ends at `until`: its connection
/// rebuilt first if broken, then the send, then, when nothing was delivered and a failure may
/// be the sink's, the sink's probe (`outage.rs`), all within the same deadline (no request of a
/// flight outlasts it, so the runner can tell when its last one ended: `tenure.rs`). The
/// carrier always comes back, broken when the deadline expired, the batch failed as a whole or
/// the sink panicked. The outcomes the sink reported before any of these stand.
pub(super) async fn fly<K: Sink>(
    mut carrier: Carrier<K>,
    slots: Vec<Slot>,
    messages: Vec<Message>,
    deadline: Duration,
    until: Instant,
) -> Landed<K> {
    let mut outcomes = Outcomes::new(messages.len());
    let ended = send_within(&mut carrier, &messages, &mut outcomes, deadline, until).await;
    let cut_short = match &ended {
        Ended::Returned => None,
        Ended::SinkFailed(why) | Ended::Unfinished(why) => Some(why.clone()),
    };
    // The runner logs it, once it has judged whether the sink is down (logged once then).
    carrier.broken = cut_short.is_some();
    let verdicts = verdicts(ended, outcomes);
    let probe = if super::outage::in_doubt(&verdicts) {
        Some(probe(&mut carrier.sink, until).await)
    } else {
        None
    };
    Landed {
        carrier,
        slots,
        messages,
        verdicts,
        cut_short,
        probe,
    }
}

/// Asks the sink whether it can take messages, waiting no later than `until` (the flight's
/// deadline; a probe that answers at once is heard even after it): silence, or a panic, is a
/// no.
async fn probe<K: Sink>(sink: &mut K, until: Instant) -> Result<(), String> {
    let asked = AssertUnwindSafe(sink.probe()).catch_unwind();
    match tokio::time::timeout_at(until, asked).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(error))) => Err(error.message().to_owned()),
        Ok(Err(panic)) => Err(format!(
            "its probe panicked: {}",
            crate::task::panic_message(&*panic)
        )),
        Err(_) => Err("it did not answer its probe within the batch deadline".to_owned()),
    }
}

async fn send_within<K: Sink>(
    carrier: &mut Carrier<K>,
    messages: &[Message],
    outcomes: &mut Outcomes,
    deadline: Duration,
    until: Instant,
) -> Ended {
    let sink = &mut carrier.sink;
    if carrier.broken {
        match tokio::time::timeout_at(until, sink.reset()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                return Ended::SinkFailed(format!("rebuilding the connection failed: {error}"));
            }
            Err(_) => {
                return Ended::SinkFailed(format!(
                    "rebuilding the connection took longer than the batch deadline ({deadline:?})"
                ));
            }
        }
    }
    let send = AssertUnwindSafe(sink.send(messages, outcomes)).catch_unwind();
    match tokio::time::timeout_at(until, send).await {
        Ok(Ok(Ok(()))) => Ended::Returned,
        Ok(Ok(Err(error))) => Ended::SinkFailed(error.to_string()),
        Ok(Err(panic)) => Ended::Unfinished(format!(
            "the sink panicked: {}",
            crate::task::panic_message(&*panic)
        )),
        Err(_) => Ended::Unfinished(format!("the batch deadline ({deadline:?}) expired")),
    }
}

/// One verdict per message: the outcome the sink reported, or for a message without one,
/// blameless when the sink failed as a whole, unresolved otherwise (the runner halves its
/// next batch, or blames it when it was sent alone).
fn verdicts(ended: Ended, outcomes: Outcomes) -> Vec<Verdict> {
    let unknown = match ended {
        Ended::Returned => {
            Verdict::Unresolved("the sink returned without an outcome for it".to_owned())
        }
        Ended::SinkFailed(why) => Verdict::Blameless(why),
        Ended::Unfinished(why) => Verdict::Unresolved(why),
    };
    outcomes
        .into_vec()
        .into_iter()
        .map(|outcome| match outcome {
            Some(Ok(())) => Verdict::Delivered,
            Some(Err(error)) => Verdict::Failed(error),
            None => unknown.clone(),
        })
        .collect()
}
