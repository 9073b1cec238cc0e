//! The latest streams' side of the outbox's LISTEN connection (`crate::listen`, one for every
//! channel of the outbox): `ordo_latest` is added to it by the first latest stream. A
//! notification only says "type X has version N now"; the fetch task reads the row. Every time
//! the connection is (re)established, streams read their types again: what was notified while
//! it was down is lost, but it is in the table.

use std::sync::Arc;

use super::{CHANNEL, HubShared};
use crate::listen::{Listen, Notified};
use crate::task::Tasks;

/// Has the outbox's LISTEN connection hand [`CHANNEL`] to every latest stream of the outbox.
pub(crate) fn listen(listen: &Listen, tasks: &Tasks, shared: Arc<HubShared>) {
    listen.add(tasks, CHANNEL, "latest-value", Arc::new(Latest(shared)));
}

/// The latest streams' side of the connection.
struct Latest(Arc<HubShared>);

impl Notified for Latest {
    /// LISTEN is up: from here on every commit is notified, so what streams read now leaves
    /// no gap.
    fn connected(&self) {
        self.0.resync();
    }

    fn notified(&self, payload: &str) {
        match parse(payload) {
            Some((_, event_type)) => self.0.notified(event_type.to_owned()),
            None => {
                // Not ordo's shape (someone else's NOTIFY on our channel): read everything.
                tracing::debug!(
                    payload = %crate::telemetry::clipped(payload, 200),
                    "unexpected notification"
                );
                self.0.resync();
            }
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
