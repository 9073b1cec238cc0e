//! Each webhook URL's health: whether a failed request is the URL's outage or its message's
//! failure (the rules are `blame.rs`'s), with one probe shared by the failures it settles.
//!
//! A URL that could not be reached is down: [`SendError::Unavailable`], no attempt, the URL's
//! own backoff. An answer about a request is the message's, and shows the URL alive. An
//! unclear failure is the message's when the URL showed itself alive after the request was
//! sent (a 2xx, an answer, a probe answered); otherwise the URL is probed, once for every
//! failure of requests sent before that probe started, and a probe that fails makes them the
//! URL's outage.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use tokio::time::Instant;

use super::blame::Failed;
use crate::relay::SendError;

/// The pause after a URL's first failure in a row; it doubles per failure up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(200);
const MAX_PAUSE: Duration = Duration::from_secs(10);
/// URLs remembered at most (a route per recipient may name many): past it the map starts
/// again, which only forgets which URLs answered lately.
const MAX_URLS: usize = 10_000;

#[derive(Default, Clone)]
pub(super) struct Destinations(Arc<DashMap<String, Health>>);

#[derive(Default)]
struct Health {
    /// When the URL last showed itself alive: a 2xx, an answer, a probe answered.
    alive_at: Option<Instant>,
    /// Outage failures in a row: the pause's exponent.
    failures: u32,
    /// The latest probe: concurrent failures wait for the one probe in progress and share it.
    probed: Arc<tokio::sync::Mutex<Option<Probed>>>,
}

#[derive(Clone)]
struct Probed {
    started: Instant,
    answer: Result<(), String>,
}

impl Destinations {
    /// The result of a request to `url` sent at `sent_at`, judged (see the module docs);
    /// `probe` asks the URL whether it serves requests, when needed.
    pub(super) async fn judge<P, F>(
        &self,
        url: &str,
        sent_at: Instant,
        posted: Result<(), Failed>,
        probe: P,
    ) -> Result<(), SendError>
    where
        P: FnOnce() -> F,
        F: Future<Output = Result<(), String>>,
    {
        let error = match posted {
            Ok(()) => {
                self.alive(url, Instant::now());
                return Ok(());
            }
            Err(Failed::Unsent(error)) => return Err(error),
            Err(Failed::Answered(error)) => {
                self.alive(url, Instant::now());
                return Err(error);
            }
            Err(Failed::Unreachable(error)) => return Err(self.down(url, &error, None)),
            Err(Failed::Unclear(error)) => error,
        };
        let (alive_at, probed) =
            self.health(url, |health| (health.alive_at, Arc::clone(&health.probed)));
        if alive_at.is_some_and(|at| at > sent_at) {
            return Err(error);
        }
        let answer = {
            let mut latest = probed.lock().await;
            match latest.as_ref().filter(|probe| probe.started >= sent_at) {
                Some(shared) => shared.answer.clone(),
                None => {
                    let started = Instant::now();
                    let answer = probe().await;
                    *latest = Some(Probed {
                        started,
                        answer: answer.clone(),
                    });
                    answer
                }
            }
        };
        match answer {
            Ok(()) => {
                self.alive(url, Instant::now());
                Err(error)
            }
            Err(why) => Err(self.down(url, &error, Some(&why))),
        }
    }

    /// Whether `url` showed itself alive within the last `within`.
    pub(super) fn alive_within(&self, url: &str, within: Duration) -> bool {
        let now = Instant::now();
        self.health(url, |health| health.alive_at)
            .is_some_and(|at| now.duration_since(at) <= within)
    }

    fn alive(&self, url: &str, at: Instant) {
        self.health(url, |health| {
            health.alive_at = Some(at);
            health.failures = 0;
        });
    }

    /// `error` as the URL's outage, with its pause (`Retry-After` honoured when longer) and,
    /// when a probe failed, why.
    fn down(&self, url: &str, error: &SendError, probe: Option<&str>) -> SendError {
        let failures = self.health(url, |health| {
            health.failures = health.failures.saturating_add(1);
            health.failures
        });
        let exponent = failures.saturating_sub(1).min(16);
        let ceiling = FIRST_PAUSE.saturating_mul(1 << exponent).min(MAX_PAUSE);
        let pause = ceiling.mul_f64(fastrand::f64()).max(FIRST_PAUSE / 4);
        let message = match probe {
            Some(why) => format!(
                "the endpoint is down: {} (its probe: {why})",
                error.message()
            ),
            None => format!("the endpoint is down: {}", error.message()),
        };
        SendError::Unavailable {
            message,
            retry_after: error.retry_after().map_or(pause, |asked| asked.max(pause)),
        }
    }

    /// Runs `with` on `url`'s health, under its shard's lock (so `with` must not touch the map).
    fn health<T>(&self, url: &str, with: impl FnOnce(&mut Health) -> T) -> T {
        if let Some(mut health) = self.0.get_mut(url) {
            return with(&mut health);
        }
        if self.0.len() >= MAX_URLS {
            self.0.clear();
        }
        with(&mut self.0.entry(url.to_owned()).or_default())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::time::Instant;

    use super::{Destinations, Failed};
    use crate::relay::SendError;

    fn unclear() -> Result<(), Failed> {
        Err(Failed::Unclear(SendError::transient("timed out")))
    }

    #[tokio::test]
    async fn an_unclear_failure_is_the_urls_when_its_probe_fails_and_the_messages_when_it_answers()
    {
        let destinations = Destinations::default();
        let probes = AtomicUsize::new(0);
        let probe = |answer: Result<(), String>| {
            probes.fetch_add(1, Ordering::SeqCst);
            async move { answer }
        };
        let refused = Err(Failed::Unreachable(SendError::transient("refused")));
        let judged = destinations
            .judge("http://a/", Instant::now(), refused, || probe(Ok(())))
            .await;
        assert!(judged.is_err_and(|error| error.is_unavailable()));
        assert_eq!(probes.load(Ordering::SeqCst), 0, "a refusal says enough");

        let sent = Instant::now();
        let down = destinations
            .judge("http://a/", sent, unclear(), || probe(Err("no".to_owned())))
            .await;
        assert!(down.is_err_and(|error| error.is_unavailable() && error.message().contains("no")));
        // A request sent before that probe started shares its answer.
        let shared = destinations
            .judge("http://a/", sent, unclear(), || probe(Ok(())))
            .await;
        assert!(shared.is_err_and(|error| error.is_unavailable()));
        assert_eq!(probes.load(Ordering::SeqCst), 1);

        let blamed = destinations
            .judge("http://a/", Instant::now(), unclear(), || probe(Ok(())))
            .await;
        assert!(blamed.is_err_and(|error| !error.is_unavailable() && !error.is_permanent()));
        assert_eq!(probes.load(Ordering::SeqCst), 2);
        // The probe answered after this request was sent: no need to ask again.
        let blamed = destinations
            .judge("http://a/", sent, unclear(), || probe(Err("no".to_owned())))
            .await;
        assert!(blamed.is_err_and(|error| !error.is_unavailable()));
        assert_eq!(probes.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn an_answer_about_the_request_is_the_messages_without_a_probe() {
        let destinations = Destinations::default();
        let answered = Err(Failed::Answered(SendError::transient("500")));
        let judged = destinations
            .judge("http://b/", Instant::now(), answered, || async {
                panic!("no probe for an answer")
            })
            .await;
        assert!(judged.is_err_and(|error| !error.is_unavailable()));
        assert!(destinations.alive_within("http://b/", std::time::Duration::from_secs(60)));
        let bad = Err(Failed::Answered(SendError::permanent("400")));
        let judged = destinations
            .judge("http://b/", Instant::now(), bad, || async { Ok(()) })
            .await;
        assert!(judged.is_err_and(|error| error.is_permanent()));
    }
}
