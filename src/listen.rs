//! The `LISTEN` connections' one loop: connect on a pool of its own, `LISTEN` on a channel,
//! tell the owner to look at its table again, hand it every notification until the connection
//! fails, and reconnect after a capped backoff, until the outbox stops.
//!
//! A notification only hints; the table stays the only data channel. So every (re)connect is
//! followed by a look at the table ([`Notified::connected`]): what was notified while the
//! connection was down is lost, but it is in the table. The connection is held for the
//! outbox's lifetime, so it is not taken from the application's pool (where it would leave one
//! connection fewer for everything else, and none at all in a pool of one): it has a pool of
//! its own, of one connection, with the application pool's options.

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};

use crate::task::StopSignal;

const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What a `LISTEN` connection's owner does with it.
pub(crate) trait Notified {
    /// The connection is (again) listening: from here on every commit is notified, so what
    /// the owner reads now leaves no gap.
    fn connected(&self);

    /// One notification's payload.
    fn notified(&self, payload: &str);
}

/// Listens on `channel` for `owner` until `stop`, on a pool of its own opened with `options`;
/// `what` names the connection in the logs (`wake-up`, `latest-value`).
pub(crate) async fn run(
    options: PgConnectOptions,
    channel: &str,
    what: &'static str,
    owner: &impl Notified,
    mut stop: StopSignal,
) {
    let own = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with(options);
    let mut backoff = FIRST_BACKOFF;
    loop {
        let connected = tokio::select! {
            biased;
            _ = stop.stopped() => return,
            listener = connect(&own, channel) => listener,
        };
        match connected {
            Ok(mut listener) => {
                backoff = FIRST_BACKOFF;
                owner.connected();
                tokio::select! {
                    biased;
                    _ = stop.stopped() => return,
                    reason = receive(&mut listener, owner) => {
                        tracing::warn!(%reason, "{what} LISTEN connection lost; reconnecting");
                    }
                }
            }
            Err(error) => {
                tracing::warn!(%error, ?backoff, "could not LISTEN for {what} notifications; retrying");
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

/// Hands notifications to `owner` until the connection fails; returns why.
async fn receive(listener: &mut PgListener, owner: &impl Notified) -> String {
    loop {
        match listener.try_recv().await {
            Ok(Some(notification)) => owner.notified(notification.payload()),
            Ok(None) => return "connection closed".to_owned(),
            Err(error) => return error.to_string(),
        }
    }
}
