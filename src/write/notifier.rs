//! Cross-process wake-ups, sending side.
//!
//! A `NOTIFY` inside every writing transaction would take PostgreSQL's cluster-wide notify lock
//! at each commit and serialise all committers. Instead, writers only bump a watch after their
//! commit; this task sends one `pg_notify` right away when the process has been quiet, then at
//! most one per `debounce`, each carrying the highest sequence committed so far.
//!
//! Only while someone else listens ([`Audience`]): a process alone holds its wake-ups back, and
//! sends the latest one as soon as another process is heard. While it is alone, commits store
//! their sequence in the watch without waking this task (`CommitSink::note_committed`). This task also says, on the same
//! channel, that this outbox listens: a greeting when its `LISTEN` connection (re)connects, an
//! answer to every other outbox's greeting, and a presence every [`PRESENCE_EVERY`] while the
//! connection is up.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use crate::insert_lane::wakeup::{
    Audience, PRESENCE_EVERY, notify, presence_payload, wakeup_payload,
};
use crate::position::EventSequence;
use crate::task::StopSignal;
use crate::telemetry::metrics as m;

pub(crate) async fn run(
    pool: PgPool,
    channel: String,
    debounce: Duration,
    (instance, audience): (u64, Arc<Audience>),
    mut committed: watch::Receiver<EventSequence>,
    mut stop: StopSignal,
) {
    let presence = presence_payload(instance, false);
    let greeting = presence_payload(instance, true);
    let mut presence_due = tokio::time::interval(PRESENCE_EVERY);
    presence_due.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // Sent, or held back while nobody else listened.
    let mut settled = *committed.borrow_and_update();
    let mut sent = settled;
    loop {
        tokio::select! {
            // The rare branches first: under a stream of commits the watch is ready at every
            // look, and would otherwise keep this outbox from ever answering or saying it
            // listens.
            biased;
            _ = stop.stopped() => return,
            _ = audience.hello.notified() => {
                say(&pool, &channel, &greeting).await;
                continue;
            }
            _ = audience.asked.notified() => {
                say(&pool, &channel, &presence).await;
                continue;
            }
            _ = presence_due.tick() => {
                if audience.connected() {
                    say(&pool, &channel, &presence).await;
                }
                continue;
            }
            // Someone else appeared: whatever was held back is for them.
            _ = audience.arrived.notified() => settled = sent,
            changed = committed.changed() => if changed.is_err() { return },
        }
        let latest = *committed.borrow_and_update();
        if latest <= settled {
            continue;
        }
        if !audience.anyone() {
            settled = latest;
            metrics::counter!(m::WAKEUPS, "result" => "held").increment(1);
            continue;
        }
        if !say(&pool, &channel, &wakeup_payload(latest, instance)).await {
            continue;
        }
        (settled, sent) = (latest, latest);
        metrics::counter!(m::WAKEUPS, "result" => "sent").increment(1);
        tokio::select! {
            biased;
            _ = stop.stopped() => return,
            _ = tokio::time::sleep(debounce) => {}
        }
    }
}

/// Sends `payload` on `channel`; whether it went.
async fn say(pool: &PgPool, channel: &str, payload: &str) -> bool {
    match notify(pool, channel, payload).await {
        Ok(()) => true,
        // Listeners also resync on a timer: a lost wake-up costs latency, not events.
        Err(error) => {
            tracing::warn!(%error, "sending a wake-up failed");
            false
        }
    }
}
