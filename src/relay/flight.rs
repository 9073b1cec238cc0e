//! A batch in flight: a task that owns one sink (a *carrier*) while it sends. A relay with
//! several carriers has as many batches in flight, so a slow receiver holds one carrier while
//! the others go on with the keys it does not hold.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;

use super::runner::Verdict;
use super::{BatchResult, Message, SendError, Sink};
use crate::subscription::keyed::lanes::Slot;

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
}

/// Sends `messages` with `carrier` under `deadline`: its connection rebuilt first if broken
/// (bounded by the deadline too). The carrier always comes back, broken when the deadline
/// expired, the batch failed as a whole or the sink panicked.
pub(super) async fn fly<K: Sink>(
    mut carrier: Carrier<K>,
    slots: Vec<Slot>,
    messages: Vec<Message>,
    deadline: Duration,
    relay: String,
) -> Landed<K> {
    let count = messages.len();
    let sink = &mut carrier.sink;
    let sent: Result<BatchResult, String> = async {
        if carrier.broken {
            let reset = tokio::time::timeout(deadline, sink.reset()).await;
            match reset {
                Ok(Ok(())) => {}
                Ok(Err(error)) => return Err(format!("rebuilding the connection failed: {error}")),
                Err(_) => return Err(format!("rebuilding the connection took longer than the batch deadline ({deadline:?})")),
            }
        }
        let send = AssertUnwindSafe(sink.send(&messages)).catch_unwind();
        match tokio::time::timeout(deadline, send).await {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(_)) => Err("the sink panicked".to_owned()),
            Err(_) => Err(format!("the batch deadline ({deadline:?}) expired")),
        }
    }
    .await;
    let (verdicts, broken) = verdicts(sent, count);
    if let Some(why) = &broken {
        tracing::warn!(%relay, sink = %carrier.sink.describe(), reason = %why, "batch released without blame; the connection is rebuilt before the next send");
    }
    carrier.broken = broken.is_some();
    Landed {
        carrier,
        slots,
        messages,
        verdicts,
    }
}

/// One verdict per message: the sink's own, or blameless for all when the batch could not be
/// judged message by message (and why: the carrier is broken).
fn verdicts(sent: Result<BatchResult, String>, count: usize) -> (Vec<Verdict>, Option<String>) {
    let why = match sent {
        Ok(Ok(results)) if results.len() == count => {
            let verdicts = results
                .into_iter()
                .map(|result| match result {
                    Ok(()) => Verdict::Delivered,
                    Err(error) => Verdict::Failed(error),
                })
                .collect();
            return (verdicts, None);
        }
        Ok(Ok(results)) => format!(
            "the sink answered {} results for {count} messages",
            results.len()
        ),
        Ok(Err(error)) => SendError::to_string(&error),
        Err(why) => why,
    };
    let verdicts = (0..count)
        .map(|_| Verdict::Blameless(why.clone()))
        .collect();
    (verdicts, Some(why))
}
