//! A relay's sink outage stored for operators (`ordo.subscriptions.sink_down_since`,
//! `sink_down_reason`), so that `ordo status`, `ordo subscriptions` and `admin::status` show
//! "sink down since T: reason" and not only this process's gauge.
//!
//! The relay hands each change of state (down, its reason renewed, recovered) to a writer task
//! of its own and goes on sending: a write waits for nobody, and a database that is slow or
//! down delays only the shown state, never a flight. Only the latest state is written (a
//! `watch`: states that a newer one replaced before their write are skipped). Each write is
//! fenced by the lease like the relay's marks: a relay that lost its lease writes nothing,
//! and the claim of the row clears both columns (`subscription::sql::CLAIM`).

use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::watch;
use uuid::Uuid;

use crate::consumer::SinkDown;

/// The sink's state, fenced by the lease (no row: the lease is lost, and the claim that took
/// it cleared the state). `$3` NULL clears it.
const STORE: &str = r#"
UPDATE ordo.subscriptions
SET sink_down_since = $3, sink_down_reason = $4
WHERE name = $1 AND lease_owner = $2
"#;

/// A failed write is tried again after this (with the latest state by then).
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Tries of a write left once the relay's claim has ended (its writer has no newer state
/// coming): enough for a short blip, and a writer never outlives its relay for long.
const TRIES_AFTER_CLOSE: u32 = 3;

/// The sending half, held by the relay for one claim; dropping it lets the writer finish the
/// latest state and end.
pub(super) struct Shown {
    state: watch::Sender<Option<SinkDown>>,
}

impl Shown {
    /// Starts the writer for `owner`'s claim of relay `name`. The row's state starts cleared
    /// (the claim cleared it), so nothing is written until a change.
    pub(super) fn spawn(pool: &PgPool, name: &str, owner: Uuid) -> Self {
        let (state, states) = watch::channel(None);
        let writer = Writer {
            pool: pool.clone(),
            name: name.to_owned(),
            owner,
        };
        crate::task::spawn_detached("relay sink state", writer.run(states));
        Self { state }
    }

    /// Down as `down` says (a new outage or its renewed reason).
    pub(super) fn down(&self, down: SinkDown) {
        self.state.send_replace(Some(down));
    }

    /// The sink answers again.
    pub(super) fn recovered(&self) {
        self.state.send_if_modified(|state| state.take().is_some());
    }
}

struct Writer {
    pool: PgPool,
    name: String,
    owner: Uuid,
}

impl Writer {
    async fn run(self, mut states: watch::Receiver<Option<SinkDown>>) {
        // Every state change is seen, the last one even after the relay let go of its sender.
        while states.changed().await.is_ok() {
            let mut tries_left = TRIES_AFTER_CLOSE;
            let mut failed = false;
            loop {
                let state = states.borrow_and_update().clone();
                match self.store(state.as_ref()).await {
                    Ok(()) => break,
                    // Logged once per state, not once a second while the database is away.
                    Err(error) if !failed => {
                        failed = true;
                        tracing::warn!(%error, relay = %self.name, "storing the sink's state for `ordo status` failed; tried again every second");
                    }
                    Err(error) => {
                        tracing::debug!(%error, relay = %self.name, "storing the sink's state failed again");
                    }
                }
                let open = tokio::time::timeout(RETRY_AFTER, states.changed()).await;
                if matches!(open, Ok(Err(_))) {
                    // Closed: no newer state comes; a few more tries, each after the pause.
                    tries_left = tries_left.saturating_sub(1);
                    if tries_left == 0 {
                        return;
                    }
                    tokio::time::sleep(RETRY_AFTER).await;
                }
            }
        }
    }

    async fn store(&self, state: Option<&SinkDown>) -> Result<(), sqlx::Error> {
        sqlx::query(STORE)
            .bind(&self.name)
            .bind(self.owner)
            .bind(state.map(|down| down.since))
            .bind(state.map(|down| down.reason.as_str()))
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
