//! [`WebhookSinkBuilder`]: the settings of a [`WebhookSink`], checked when it is built, and
//! the HTTP client they make.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use reqwest::Client;

#[cfg(doc)]
use super::DEFAULT_MAX_RESPONSE_BYTES;
use super::destinations::Destinations;
use super::{DEFAULT_TIMEOUT, MIN_SECRET_BYTES, Message, Signature, UrlFn, WebhookSink};
use crate::error::{Error, Result};
#[cfg(doc)]
use crate::relay::Sink;

/// The settings of a [`WebhookSink`]: start with [`WebhookSink::builder`].
#[must_use]
pub struct WebhookSinkBuilder {
    pub(super) url: String,
    pub(super) secret: Vec<u8>,
    pub(super) route: Option<UrlFn>,
    pub(super) more_secrets: Vec<Vec<u8>>,
    pub(super) signature: Signature,
    pub(super) timeout: Option<Duration>,
    pub(super) connect_timeout: Duration,
    pub(super) concurrency: usize,
    pub(super) max_response_bytes: usize,
}

impl fmt::Debug for WebhookSinkBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookSinkBuilder")
            .field("url", &crate::wire::redact_url(&self.url))
            .field("secret", &"***")
            .field("custom_route", &self.route.is_some())
            .field("more_secrets", &self.more_secrets.len())
            .field("signature", &self.signature)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("concurrency", &self.concurrency)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish()
    }
}

impl WebhookSinkBuilder {
    /// The URL of each message, instead of the one given to [`WebhookSink::builder`] (e.g. one
    /// endpoint per recipient). A URL that does not parse fails that message permanently.
    pub fn route(mut self, url: impl Fn(&Message) -> String + Send + Sync + 'static) -> Self {
        self.route = Some(Arc::new(url));
        self
    }

    /// Also signs every request with `secret`: for a rotation, the receivers accept either
    /// secret while they move to the new one (`Ordo-Signature` carries one signature per
    /// secret, separated by `,`; `webhook-signature` by spaces). At least
    /// [`MIN_SECRET_BYTES`](super::MIN_SECRET_BYTES), as the first.
    pub fn also_sign_with(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.more_secrets.push(secret.into());
        self
    }

    /// The signature scheme: ordo's own ([`Signature::Ordo`], the default) or Standard
    /// Webhooks 1.0 ([`Signature::StandardWebhooks`]: `webhook-id`, `webhook-timestamp`,
    /// `webhook-signature`).
    pub fn signature(mut self, signature: Signature) -> Self {
        self.signature = signature;
        self
    }

    /// How long one request may take, from connecting to the end of the answer: a request past
    /// it is that message's transient failure (an attempt, unless the URL does not answer its
    /// probe either: see [Answers](super#answers)); under a relay the request stays open until
    /// the batch deadline, and an answer before then replaces the failure (see
    /// [Slow answers](super#slow-answers)). Half of it bounds the URL's probe. Not zero.
    /// Default: derived by the relay that runs the sink, half its batch deadline, at most 10 s
    /// (10 s when used without a relay); a timeout set at or past the relay's batch deadline
    /// is refused when the relay starts (see [`Sink::fit_to_deadline`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// How long connecting may take. Default 5 s; not zero.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How many requests are in flight at once (each key's one after another). Default 16;
    /// not zero.
    pub fn concurrency(mut self, keys: usize) -> Self {
        self.concurrency = keys;
        self
    }

    /// The most bytes of an answer's body read, in bytes. A body within it is read whole (so
    /// the connection serves the next request) and, in the error of an answer that is not a
    /// 2xx, quoted (its first 120 characters, escaped); a larger one is not read, and the error
    /// says it was over this limit. A 2xx is delivered whatever its body. Default
    /// [`DEFAULT_MAX_RESPONSE_BYTES`] (64 KiB); 0 reads no body.
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_response_bytes = bytes;
        self
    }

    /// Checks the settings and returns the sink.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the setting: a URL that is empty or not `http(s)`, a
    /// secret shorter than [`MIN_SECRET_BYTES`] (16 bytes), a zero timeout or concurrency.
    pub fn build(self) -> Result<WebhookSink> {
        if self.route.is_none() {
            check_url(&self.url)?;
        }
        if self.secret.is_empty() {
            return Error::invalid_config(
                "webhook secret",
                "is empty; receivers could not tell your requests from anyone's",
            );
        }
        if let Some(short) = self
            .more_secrets
            .iter()
            .find(|secret| secret.len() < MIN_SECRET_BYTES)
        {
            return Err(Error::InvalidConfig {
                setting: "webhook secret",
                reason: format!(
                    "a secret given to also_sign_with is {} bytes; at least {MIN_SECRET_BYTES} are needed",
                    short.len()
                ),
            });
        }
        if self.secret.len() < MIN_SECRET_BYTES {
            return Err(Error::InvalidConfig {
                setting: "webhook secret",
                reason: format!(
                    "is {} bytes; at least {MIN_SECRET_BYTES} are needed (a shorter key is found by \
                     testing guesses against one signed request, and then every request can be \
                     forged): use 32 random bytes, e.g. `openssl rand -hex 32`",
                    self.secret.len()
                ),
            });
        }
        if self.timeout.is_some_and(|timeout| timeout.is_zero()) {
            return Error::invalid_config("webhook timeout", "must be more than zero");
        }
        if self.connect_timeout.is_zero() {
            return Error::invalid_config("webhook connect_timeout", "must be more than zero");
        }
        if self.concurrency == 0 {
            return Error::invalid_config("webhook concurrency", "must be at least 1");
        }
        let timeout = self.timeout.unwrap_or(DEFAULT_TIMEOUT);
        let client = client(timeout, self.connect_timeout)?;
        let url = self.url;
        let probe_url = self.route.is_none().then(|| url.clone());
        let route = self.route.unwrap_or_else(|| {
            let url = url.clone();
            Arc::new(move |message: &Message| match &message.destination {
                Some(path) => super::framing::joined(&url, path),
                None => url.clone(),
            })
        });
        Ok(WebhookSink {
            client,
            url,
            route,
            secrets: std::iter::once(self.secret)
                .chain(self.more_secrets)
                .collect::<Vec<_>>()
                .into(),
            signature: self.signature,
            framing: crate::relay::format::Framing::default(),
            configured_timeout: self.timeout,
            timeout,
            open_for: None,
            probe_url,
            connect_timeout: self.connect_timeout,
            concurrency: self.concurrency,
            max_response_bytes: self.max_response_bytes,
            destinations: Destinations::default(),
        })
    }
}

fn check_url(url: &str) -> Result<()> {
    match reqwest::Url::parse(url) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") => Ok(()),
        Ok(_) => Error::invalid_config("webhook url", "must be an http:// or https:// URL"),
        Err(_) if url.trim().is_empty() => Error::invalid_config("webhook url", "is empty"),
        Err(error) => Error::invalid_config(
            "webhook url",
            &format!("{:?} does not parse: {error}", crate::wire::redact_url(url)),
        ),
    }
}

pub(super) fn client(timeout: Duration, connect_timeout: Duration) -> Result<Client> {
    Client::builder()
        .timeout(timeout)
        .connect_timeout(connect_timeout)
        // A redirected POST may turn into a GET; a moved endpoint is a configuration error.
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .or_else(|error| {
            Error::invalid_config("webhook", &format!("the HTTP client cannot start: {error}"))
        })
}
