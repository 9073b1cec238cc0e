//! An outbox's one `LISTEN` connection, for every channel it listens on: the insert lane's
//! wake-ups from the outbox's start (when [`cross_process_wakeups`] is on), `ordo_latest` from
//! the first latest-value stream. It connects on a pool of its own, `LISTEN`s on each channel,
//! tells each owner to look at its table again, hands every notification to the owners of its
//! channel until the connection fails, and reconnects after a capped backoff, until the outbox
//! stops.
//!
//! A notification only hints; the tables stay the only data channel. So every (re)connect is
//! followed by a look at the table ([`Notified::connected`]): what was notified while the
//! connection was down is lost, but it is in the table. A channel added later (the first
//! latest stream) reconnects with every channel, which is a reconnect like any other: each
//! owner looks at its table again, and nothing notified in between is missed.
//!
//! The connection is held for the outbox's lifetime, so it is not taken from the application's
//! pool (where it would leave one connection fewer for everything else, and none at all in a
//! pool of one): it has a pool of its own, of one connection, with the application pool's
//! options and the `application_name` [`APPLICATION_NAME`]. One connection for every channel
//! costs a wake-up nothing measurable: `benches/tools/examples/listen_sharing.rs` compares the two setups
//! under a storm of latest-value notifications (`docs/performance-history.md`).
//!
//! [`cross_process_wakeups`]: crate::OutboxConfig::cross_process_wakeups

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::Notify;

use crate::task::{StopSignal, Tasks};

const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The `application_name` of the LISTEN connection, for `pg_stat_activity`.
pub(crate) const APPLICATION_NAME: &str = "ordo.listen";

/// What a channel's owner does with the connection.
pub(crate) trait Notified: Send + Sync {
    /// The connection is (again) listening: from here on every commit is notified, so what
    /// the owner reads now leaves no gap.
    fn connected(&self);

    /// One notification's payload.
    fn notified(&self, payload: &str);

    /// The connection was lost, or could not be made: nothing is heard until
    /// [`connected`](Self::connected) again.
    fn disconnected(&self) {}
}

/// A channel and who listens on it; `what` names it in the logs (`wake-up`, `latest-value`).
#[derive(Clone)]
struct Owner {
    channel: String,
    what: &'static str,
    owner: Arc<dyn Notified>,
}

/// The outbox's LISTEN connection, started by its first channel.
pub(crate) struct Listen {
    shared: Arc<Shared>,
}

struct Shared {
    options: PgConnectOptions,
    owners: Mutex<Vec<Owner>>,
    /// A channel was added: listen again, with every channel.
    added: Notify,
}

impl Listen {
    /// The service for an outbox on `pool`; nothing connects until the first [`add`](Self::add).
    pub(crate) fn new(pool: &PgPool) -> Self {
        let options = pool
            .connect_options()
            .as_ref()
            .clone()
            .application_name(APPLICATION_NAME);
        Self {
            shared: Arc::new(Shared {
                options,
                owners: Mutex::new(Vec::new()),
                added: Notify::new(),
            }),
        }
    }

    /// Has `owner` hear `channel` from now on: starts the connection under `tasks` with the
    /// first channel, or has it listen again with this one too.
    pub(crate) fn add(
        &self,
        tasks: &Tasks,
        channel: &str,
        what: &'static str,
        owner: Arc<dyn Notified>,
    ) {
        let first = {
            let mut owners = self
                .shared
                .owners
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            owners.push(Owner {
                channel: channel.to_owned(),
                what,
                owner,
            });
            owners.len() == 1
        };
        if first {
            tasks.spawn("listen", run(Arc::clone(&self.shared), tasks.signal()));
        } else {
            // A permit if the task is not waiting now: it listens again when it next looks.
            self.shared.added.notify_one();
        }
    }
}

/// Why a connection stopped receiving.
enum Ended {
    Added,
    Lost(String),
}

async fn run(shared: Arc<Shared>, mut stop: StopSignal) {
    let own = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with(shared.options.clone());
    let mut backoff = FIRST_BACKOFF;
    loop {
        let owners = shared
            .owners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let connected = tokio::select! {
            biased;
            _ = stop.stopped() => return,
            listener = connect(&own, &owners) => listener,
        };
        match connected {
            Ok(mut listener) => {
                backoff = FIRST_BACKOFF;
                for owner in &owners {
                    owner.owner.connected();
                }
                let ended = tokio::select! {
                    biased;
                    _ = stop.stopped() => return,
                    _ = shared.added.notified() => Ended::Added,
                    reason = receive(&mut listener, &owners) => Ended::Lost(reason),
                };
                match ended {
                    Ended::Added => {
                        tracing::debug!("a LISTEN channel was added; listening again");
                        continue;
                    }
                    Ended::Lost(reason) => {
                        for owner in &owners {
                            owner.owner.disconnected();
                        }
                        let what = names(&owners);
                        tracing::warn!(%reason, "{what} LISTEN connection lost; reconnecting");
                    }
                }
            }
            Err(error) => {
                for owner in &owners {
                    owner.owner.disconnected();
                }
                let what = names(&owners);
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

/// The owners' names for a log line: `wake-up`, `wake-up and latest-value`.
fn names(owners: &[Owner]) -> String {
    let names: Vec<&str> = owners.iter().map(|owner| owner.what).collect();
    names.join(" and ")
}

async fn connect(pool: &PgPool, owners: &[Owner]) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    // We reconnect ourselves, so that every reconnect is followed by a look at the table.
    listener.ignore_pool_close_event(true);
    for owner in owners {
        listener.listen(&owner.channel).await?;
    }
    Ok(listener)
}

/// Hands notifications to their channel's owners until the connection fails; returns why.
async fn receive(listener: &mut PgListener, owners: &[Owner]) -> String {
    loop {
        match listener.try_recv().await {
            Ok(Some(notification)) => {
                let heard = owners
                    .iter()
                    .filter(|owner| owner.channel == notification.channel());
                for owner in heard {
                    owner.owner.notified(notification.payload());
                }
            }
            Ok(None) => return "connection closed".to_owned(),
            Err(error) => return error.to_string(),
        }
    }
}
