//! The `latest.listen` task: one `LISTEN ordo_latest` connection per outbox, for every latest
//! stream of it. A notification only says "type X has version N now"; the fetch task reads
//! the row. Every time the connection is (re)established, streams read their types again:
//! what was notified while it was down is lost, but it is in the table.
//!
//! As for the insert lane's wake-ups, the connection is held for the outbox's lifetime, so it
//! has a pool of its own (one connection, the same options, `application_name` `ordo.latest`)
//! rather than taking one from the application's pool.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgListener, PgPoolOptions};

use super::{CHANNEL, HubShared};
use crate::task::StopSignal;

/// The `application_name` of the LISTEN connection, for `pg_stat_activity`.
pub(crate) const APPLICATION_NAME: &str = "ordo.latest";

const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

pub(crate) async fn run(pool: PgPool, shared: Arc<HubShared>, mut stop: StopSignal) {
    let options = pool
        .connect_options()
        .as_ref()
        .clone()
        .application_name(APPLICATION_NAME);
    let own = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with(options);
    drop(pool);
    let mut backoff = FIRST_BACKOFF;
    loop {
        let connected = tokio::select! {
            biased;
            _ = stop.stopped() => return,
            listener = connect(&own) => listener,
        };
        match connected {
            Ok(mut listener) => {
                backoff = FIRST_BACKOFF;
                // LISTEN is up: from here on every commit is notified, so what streams read
                // now leaves no gap.
                shared.resync();
                tokio::select! {
                    biased;
                    _ = stop.stopped() => return,
                    reason = receive(&mut listener, &shared) => {
                        tracing::warn!(%reason, "latest-value LISTEN connection lost; reconnecting");
                    }
                }
            }
            Err(error) => {
                tracing::warn!(%error, ?backoff, "could not LISTEN for latest values; retrying");
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

async fn connect(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    // We reconnect ourselves, so that every reconnect is followed by a read of the table.
    listener.ignore_pool_close_event(true);
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

/// Hands notifications to the fetch task until the connection fails; returns why.
async fn receive(listener: &mut PgListener, shared: &HubShared) -> String {
    loop {
        match listener.try_recv().await {
            Ok(Some(notification)) => match parse(notification.payload()) {
                Some((_, event_type)) => shared.notified(event_type.to_owned()),
                None => {
                    // Not ordo's shape (someone else's NOTIFY on our channel): read everything.
                    tracing::debug!(payload = notification.payload(), "unexpected notification");
                    shared.resync();
                }
            },
            Ok(None) => return "connection closed".to_owned(),
            Err(error) => return error.to_string(),
        }
    }
}

/// A notification's payload: the version, a space, the type (which may hold spaces).
fn parse(payload: &str) -> Option<(u64, &str)> {
    let (version, event_type) = payload.split_once(' ')?;
    let version = version.parse().ok()?;
    (!event_type.is_empty()).then_some((version, event_type))
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn a_payload_is_a_version_then_the_type() {
        assert_eq!(parse("7 fx.rate"), Some((7, "fx.rate")));
        assert_eq!(parse("7 feature flags"), Some((7, "feature flags")));
        assert_eq!(parse("7"), None);
        assert_eq!(parse("7 "), None);
        assert_eq!(parse("x fx.rate"), None);
    }
}
