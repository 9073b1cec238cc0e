//! Watching a running relay: its state changes, its progress lines, and the parked event that
//! holds its position.

use std::time::Duration;

use ordo::admin::printable;
use ordo::{StalledKey, SubscriptionHandle, SubscriptionState, SubscriptionStatus};
use tokio::time::Instant;

/// Logs the relay's state as it changes (running, standing by, paused, parked events) and its
/// progress every `every`, until SIGINT or SIGTERM.
pub(super) async fn watch(relay: &SubscriptionHandle, name: &str, every: Duration) {
    let stop = crate::interrupted();
    tokio::pin!(stop);
    let mut shown = relay.status();
    let mut delivered_from = shown.position.get();
    let mut progress_at = Instant::now() + every;
    let mut held = Held::default();
    loop {
        let wait = if every.is_zero() {
            Duration::from_secs(3_600)
        } else {
            progress_at.saturating_duration_since(Instant::now())
        };
        let changes = |now: &SubscriptionStatus| {
            now.state != shown.state || now.stalled.len() != shown.stalled.len()
        };
        let (status, changed) = tokio::select! {
            () = &mut stop => return,
            seen = relay.wait_for(wait, changes) => seen,
        };
        if changed {
            state_changed(name, &shown, &status);
        } else if !every.is_zero() {
            let position = status.position.get();
            let delivered = position.saturating_sub(delivered_from);
            let (lag, parked) = (status.lag, status.stalled.len());
            let head = status.stalled.first();
            if let Some(head) = head.filter(|_| status.state == SubscriptionState::Running) {
                // A known cause: said once per change, then every `HELD_EVERY`, not each period.
                held.report(name, head, lag, parked);
            } else if delivered == 0 && lag > 0 && status.state == SubscriptionState::Running {
                tracing::warn!(
                    relay = %name, position, lag, parked,
                    "nothing delivered in the last {every:?} although events wait"
                );
            } else {
                tracing::info!(
                    relay = %name, state = ?status.state, position, delivered, lag, parked,
                    "progress over the last {every:?}"
                );
            }
            delivered_from = position;
            progress_at = Instant::now() + every;
        }
        shown = status;
    }
}

/// A parked head is logged again after this long while it holds the relay.
const HELD_EVERY: Duration = Duration::from_secs(60);

/// The parked event that holds the relay's watermark, as last logged.
#[derive(Default)]
struct Held {
    logged: Option<(u64, Instant)>,
}

impl Held {
    /// Logs `head` as what holds the relay: when it changed, and then every [`HELD_EVERY`].
    fn report(&mut self, name: &str, head: &StalledKey, lag: u64, parked: usize) {
        let position = head.position.get();
        let due = match self.logged {
            Some((logged, at)) => logged != position || at.elapsed() >= HELD_EVERY,
            None => true,
        };
        if !due {
            return;
        }
        self.logged = Some((position, Instant::now()));
        let since = head.since.map_or_else(
            || "before this process took the lease".to_owned(),
            |at| at.to_rfc3339(),
        );
        tracing::warn!(
            relay = %name,
            key = %printable(&format!("{:?}", head.key)),
            position,
            since = %since,
            attempts = head.attempts,
            error = %printable(&head.error),
            lag,
            parked,
            "a parked event holds its key (its later events wait in the key's backlog; every other key goes on): `ordo relay attempts {name} {position}` says why, `ordo relay requeue {name} KEY` sends it and then the backlog, in order"
        );
    }
}

fn state_changed(name: &str, before: &SubscriptionStatus, now: &SubscriptionStatus) {
    let position = now.position.get();
    if now.state != before.state {
        match now.state {
            SubscriptionState::Running => tracing::info!(
                relay = %name, position, "delivering: this process holds the relay's lease"
            ),
            SubscriptionState::Standby => tracing::info!(
                relay = %name, "standing by: another process holds the relay's lease"
            ),
            SubscriptionState::Paused => tracing::warn!(
                relay = %name, "paused by an operator (`ordo relay resume {name}`)"
            ),
            SubscriptionState::Halted => tracing::error!(
                relay = %name, position, error = now.last_error.as_deref().unwrap_or("-"),
                "halted: below the retention floor, `ordo relay replay {name} --from FLOOR` then `ordo relay resume {name}`"
            ),
            state => tracing::info!(relay = %name, ?state, position, "state changed"),
        }
    }
    if now.stalled.len() != before.stalled.len() {
        tracing::warn!(
            relay = %name,
            parked = now.stalled.len(),
            "parked events hold their keys: `ordo relay parked {name}` lists them"
        );
    }
}
