//! Cross-process wake-ups, receiving side: a `LISTEN` connection whose notifications only
//! hint that something was committed. The table stays the only data channel: after a
//! reconnect the lane looks at the table again, so a lost notification costs latency, never an
//! event.
//!
//! The `LISTEN` connection is held for the outbox's lifetime, so it is not taken from the
//! application's pool (where it would leave one connection fewer for everything else, and none
//! at all in a pool of one): it has a pool of its own, of one connection, with the same options.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgListener, PgPoolOptions};

use super::LaneShared;
use crate::task::StopSignal;

const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

pub(crate) async fn run<P>(
    pool: PgPool,
    channel: String,
    shared: Arc<LaneShared<P>>,
    mut stop: StopSignal,
) {
    let own = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with(pool.connect_options().as_ref().clone());
    drop(pool);
    let mut backoff = FIRST_BACKOFF;
    loop {
        let connected = tokio::select! {
            biased;
            _ = stop.stopped() => return,
            listener = connect(&own, &channel) => listener,
        };
        match connected {
            Ok(mut listener) => {
                backoff = FIRST_BACKOFF;
                // Whatever was notified while we were away is in the table: look now.
                shared.request_resync();
                tokio::select! {
                    biased;
                    _ = stop.stopped() => return,
                    reason = receive(&mut listener, &shared) => {
                        tracing::warn!(%reason, "wake-up connection lost; reconnecting");
                    }
                }
            }
            Err(error) => {
                tracing::warn!(%error, ?backoff, "could not LISTEN for wake-ups; retrying");
            }
        }
        tokio::select! {
            biased;
            _ = stop.stopped() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

async fn connect(pool: &PgPool, channel: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    // We reconnect ourselves, so that every reconnect is followed by a look at the table.
    listener.ignore_pool_close_event(true);
    listener.listen(channel).await?;
    Ok(listener)
}

/// Forwards notifications until the connection fails; returns why.
async fn receive<P>(listener: &mut PgListener, shared: &LaneShared<P>) -> String {
    loop {
        match listener.try_recv().await {
            Ok(Some(notification)) => match parse(notification.payload()) {
                // Our own commit, echoed back: the lane has it from the writer already.
                Some((_, Some(instance))) if instance == shared.instance => {}
                Some((sequence, _)) => shared.hint_foreign(sequence),
                None => shared.request_resync(),
            },
            Ok(None) => return "connection closed".to_owned(),
            Err(error) => return error.to_string(),
        }
    }
}

/// A wake-up's payload: the highest sequence the sender committed, then (since 0.1) the
/// sending outbox's instance in hex. A payload without it (an older sender) counts as foreign.
fn parse(payload: &str) -> Option<(u64, Option<u64>)> {
    let mut parts = payload.split(' ');
    let sequence = parts.next()?.parse().ok()?;
    let instance = parts.next().and_then(|i| u64::from_str_radix(i, 16).ok());
    Some((sequence, instance))
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn a_payload_names_the_sequence_and_maybe_the_sender() {
        assert_eq!(parse("42 00000000000000ff"), Some((42, Some(255))));
        assert_eq!(parse("42"), Some((42, None)));
        assert_eq!(parse("42 not-hex"), Some((42, None)));
        assert_eq!(parse("x"), None);
    }
}
