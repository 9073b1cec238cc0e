//! Each webhook URL's health: whether a failure is the URL's outage or its message's.
//!
//! The rule is the relay's (see `relay/outage.rs`), applied per URL: a transient failure of a
//! request is the message's only if the same URL answered a 2xx after that request was sent,
//! which proves the endpoint works; otherwise the URL is down and the message is blameless.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::relay::SendError;

/// The pause after a URL's first failure in a row; it doubles per failure up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(200);
const MAX_PAUSE: Duration = Duration::from_secs(10);
/// URLs remembered at most (a route per recipient may name many): past it the map starts
/// again, which only forgets which URLs answered lately.
const MAX_URLS: usize = 10_000;

#[derive(Default, Clone)]
pub(super) struct Destinations(Arc<Mutex<HashMap<String, Health>>>);

#[derive(Default)]
struct Health {
    answered_at: Option<Instant>,
    failures: u32,
}

impl Destinations {
    /// The result of a request to `url` sent at `sent_at`, judged: a transient failure while
    /// the URL answered nothing since becomes [`SendError::Unavailable`].
    pub(super) fn judge(
        &self,
        url: &str,
        sent_at: Instant,
        posted: Result<(), SendError>,
    ) -> Result<(), SendError> {
        let Ok(mut urls) = self.0.lock() else {
            return posted;
        };
        if urls.len() >= MAX_URLS && !urls.contains_key(url) {
            urls.clear();
        }
        let health = urls.entry(url.to_owned()).or_default();
        match posted {
            Ok(()) => {
                health.answered_at = Some(Instant::now());
                health.failures = 0;
                Ok(())
            }
            Err(error) if error.is_permanent() => Err(error),
            Err(error) if health.answered_at.is_some_and(|at| at > sent_at) => Err(error),
            Err(error) => {
                health.failures = health.failures.saturating_add(1);
                let exponent = (health.failures - 1).min(16);
                let ceiling = FIRST_PAUSE.saturating_mul(1 << exponent).min(MAX_PAUSE);
                let pause = ceiling.mul_f64(fastrand::f64()).max(FIRST_PAUSE / 4);
                Err(SendError::Unavailable {
                    message: format!("the endpoint is down: {}", error.message()),
                    retry_after: error.retry_after().map_or(pause, |asked| asked.max(pause)),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::Destinations;
    use crate::relay::SendError;

    #[test]
    fn a_failure_is_the_urls_until_it_answers_then_the_messages() {
        let destinations = Destinations::default();
        let refused = || Err(SendError::transient("could not connect"));
        let sent = Instant::now();
        let down = destinations.judge("http://a/", sent, refused());
        assert!(down.is_err_and(|error| error.is_unavailable()));
        let other = destinations.judge("http://b/", Instant::now(), Ok(()));
        assert!(other.is_ok());
        let sent = Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(
            destinations
                .judge("http://a/", Instant::now(), Ok(()))
                .is_ok()
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
        // Sent before the URL's 2xx, failed after it: the message's failure.
        let blamed = destinations.judge("http://a/", sent, refused());
        assert!(blamed.is_err_and(|error| !error.is_unavailable() && !error.is_permanent()));
        let bad = destinations.judge(
            "http://a/",
            Instant::now(),
            Err(SendError::permanent("400")),
        );
        assert!(bad.is_err_and(|error| error.is_permanent()));
    }
}
