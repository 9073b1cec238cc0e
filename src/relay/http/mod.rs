//! [`WebhookSink`]: POST each event to an HTTP endpoint, signed; delivered on a 2xx.
//!
//! # The request
//!
//! `POST {url}` with the payload's JSON text as the body (exactly as stored) and these headers:
//!
//! | header | value |
//! | --- | --- |
//! | `Content-Type` | `application/json` |
//! | `Ordo-Event-Id` | the event id (UUID): deduplicate on it, a redelivery carries the same |
//! | `Ordo-Event-Type` | the event type (absent when untyped) |
//! | `Ordo-Sequence` | the event's insert-lane sequence |
//! | `Ordo-Position`, `Ordo-Lane` | the event's position on the relay's lane (`commit`: dense, 1, 2, 3, …; `insert`) |
//! | `Ordo-Source` | the sending database's name ([`RelayConfig::source`](crate::relay::RelayConfig::source); absent when not set) |
//! | `Ordo-Key` | the ordering key (absent without one) |
//! | `Ordo-Timestamp` | when this request was signed, Unix seconds |
//! | `Ordo-Signature` | lowercase hex HMAC-SHA256 of `"{Ordo-Timestamp}.{body}"` keyed with the secret |
//! | `traceparent` | the publisher's W3C trace context, when it stored one |
//!
//! A receiver checks the signature with [`verify_signature`] (or the same HMAC in any language:
//! `docs/relays.md` has Python and Node.js), refuses a timestamp far from its clock, and
//! deduplicates on `Ordo-Event-Id` (see [Receiving](self#receiving)). Each attempt is signed
//! afresh, with a new timestamp.
//!
//! # Receiving
//!
//! A receiver, in whatever web framework, does three things before it answers 2xx:
//!
//! 1. **Verify the signature over the raw body bytes**, before any JSON parsing (a parser that
//!    re-encodes changes the bytes), with a constant-time comparison ([`verify_signature`]
//!    compares in constant time).
//! 2. **Refuse a timestamp far from its clock** (five minutes, say), so that a captured request
//!    cannot be replayed later. The relay signs each attempt when it sends it, so only clock
//!    skew makes an honest request old: keep both clocks synchronised (NTP).
//! 3. **Deduplicate on `Ordo-Event-Id`**: a redelivery carries the same id. An ordo
//!    [`Inbox`](crate::inbox::Inbox) does it in the transaction of the receiver's own writes.
//!
//! ```
//! use std::time::{Duration, SystemTime, UNIX_EPOCH};
//!
//! use ordo::relay::http::{sign, verify_signature};
//!
//! /// How far a request's `Ordo-Timestamp` may be from this clock, either way.
//! const TOLERANCE: Duration = Duration::from_secs(5 * 60);
//!
//! /// Whether a request is signed with `secret` and fresh at `now`; `header` looks up a
//! /// request header by name, `body` is the raw body.
//! fn authentic<'a>(
//!     secret: &[u8],
//!     header: impl Fn(&str) -> Option<&'a str>,
//!     body: &[u8],
//!     now: SystemTime,
//! ) -> bool {
//!     let (Some(timestamp), Some(signature)) = (header("Ordo-Timestamp"), header("Ordo-Signature"))
//!     else {
//!         return false;
//!     };
//!     let (Ok(signed_at), Ok(now)) = (timestamp.parse::<u64>(), now.duration_since(UNIX_EPOCH))
//!     else {
//!         return false;
//!     };
//!     now.as_secs().abs_diff(signed_at) <= TOLERANCE.as_secs()
//!         && verify_signature(secret, timestamp, body, signature)
//! }
//!
//! // What the relay sends, and what the receiver concludes.
//! let secret = b"0123456789abcdef0123456789abcdef";
//! let body = br#"{"order_id":7}"#;
//! let now = SystemTime::now();
//! let signed_at = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()).to_string();
//! let signature = sign(secret, &signed_at, body);
//! let header = |name: &str| match name {
//!     "Ordo-Timestamp" => Some(signed_at.as_str()),
//!     "Ordo-Signature" => Some(signature.as_str()),
//!     _ => None,
//! };
//! assert!(authentic(secret, header, body, now));
//! assert!(!authentic(secret, header, br#"{"order_id":8}"#, now));
//! assert!(!authentic(b"another secret, also long enough", header, body, now));
//! // The same request ten minutes later: refused.
//! assert!(!authentic(secret, header, body, now + Duration::from_secs(600)));
//! ```
//!
//! Then the event, deduplicated by its id, and the answer that tells the relay what to do. A
//! 2xx only once the outcome is stored; **a 5xx (or 429) for "send it again"**, never a 4xx:
//! every 4xx but 408 and 429 is permanent, and the relay parks the event (see
//! [Answers](self#answers)). So a bad signature (401) parks the event too, which is right: the
//! same request cannot succeed until the secrets agree, and `ordo relay requeue RELAY --all`
//! sends the parked events again once they do.
//!
//! ```no_run
//! use ordo::inbox::{Inbox, InboxHandler, InboxMessage};
//!
//! /// The HTTP status for a request already found authentic.
//! async fn receive(inbox: &Inbox, handler: &impl InboxHandler, event_id: &str, body: &[u8]) -> u16 {
//!     let Ok(payload) = std::str::from_utf8(body) else {
//!         return 400; // the relay sends JSON text: this request never will be
//!     };
//!     let message = InboxMessage::new(event_id, payload);
//!     match inbox.receive(&message, handler).await {
//!         // Handled now, handled before (a redelivery), or failed for good and kept by the
//!         // inbox as `failed` (`ordo inbox replay` runs it again).
//!         Ok(receipt) if receipt.settled() => 204,
//!         // Busy elsewhere, or the handler failed and rolled back: send it again.
//!         Ok(_) => 503,
//!         Err(ordo::Error::InvalidInboxMessage { .. }) => 400, // can never be stored
//!         Err(_) => 503, // the database: nothing settled, send it again
//!     }
//! }
//! ```
//!
//! # Answers
//!
//! | answer | [`SendError`] |
//! | --- | --- |
//! | 2xx | delivered |
//! | 408, 429, 5xx | `Transient`, with `retry_after` from a `Retry-After` header (seconds or an HTTP date); `Unavailable` when the URL answered no 2xx since the request was sent (below) |
//! | 3xx (redirects are not followed: a POST must not become a GET) and every other 4xx | `Permanent` |
//! | no connection, a timeout ([`timeout`](WebhookSinkBuilder::timeout) per request) | `Transient`, or `Unavailable` as for a 5xx |
//! | the [`route`](WebhookSinkBuilder::route) function panicked on the message | `Permanent` |
//!
//! A transient failure of a request to a URL that answered nothing since that request was
//! sent (refused, timed out, 5xx, 429) is that URL's **outage**: reported as
//! [`SendError::Unavailable`], so no attempt counts against the message and it is sent again
//! after the URL's own backoff (200 ms doubling to 10 s, jittered); one customer's dead
//! endpoint holds only its own messages. Once the URL answers a 2xx, its failures are its
//! messages' again.
//!
//! Each answer is reported as it arrives (see [`Outcomes`]), so a batch cut short by the
//! relay's deadline keeps what the endpoint already answered.
//!
//! # Order and concurrency
//!
//! Up to [`concurrency`](WebhookSinkBuilder::concurrency) requests are in flight at once.
//! Messages without a key are independent: each goes out on its own, and one's failure
//! (a 400, a timeout) is reported for it alone. Messages of one key (a relay's batch never
//! holds two, but a direct caller's may) are sent one after another, in batch order; when one
//! fails, the later ones of its key are not sent and get no outcome (the relay releases them
//! without an attempt), so a receiver never sees a key's events out of order.

mod answer;
mod destinations;
mod signature;

use crate::wire::http as wire;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use reqwest::Client;
use reqwest::header::{CONTENT_TYPE, HeaderValue};

use answer::{answer, request_failed};
use destinations::Destinations;
pub use signature::{sign, verify_signature};
use tokio::time::Instant;

use super::{Message, Outcomes, SendError, Sink};
use crate::error::{Error, Result};

/// Maps a message to the URL it is posted to.
pub type UrlFn = Arc<dyn Fn(&Message) -> String + Send + Sync>;

/// The settings of a [`WebhookSink`]: start with [`WebhookSink::builder`].
#[must_use]
pub struct WebhookSinkBuilder {
    url: String,
    secret: Vec<u8>,
    route: Option<UrlFn>,
    timeout: Option<Duration>,
    connect_timeout: Duration,
    concurrency: usize,
    max_response_bytes: usize,
}

/// The most bytes of an answer's body read by default (see
/// [`WebhookSinkBuilder::max_response_bytes`]).
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// The shortest signing secret [`WebhookSinkBuilder::build`] accepts: 16 bytes (128 bits).
/// The signature is an HMAC-SHA256 that anyone who sees one signed request can test guesses
/// of the secret against offline, as fast as their hardware hashes; a key of fewer than about
/// 128 bits of entropy (a short word, a 6-byte token) is found that way, and with it every
/// request can be forged. 16 random bytes (32 hex digits) is the least; 32 matches SHA-256.
pub const MIN_SECRET_BYTES: usize = 16;

/// A request's timeout when none is set and no relay derived one.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

impl fmt::Debug for WebhookSinkBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookSinkBuilder")
            .field("url", &crate::wire::redact_url(&self.url))
            .field("secret", &"***")
            .field("custom_route", &self.route.is_some())
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

    /// How long one request may take, from connecting to the end of the answer's headers: a
    /// request past it is that message's transient failure (an attempt). Not zero. Default:
    /// derived by the relay that runs the sink, half its batch deadline, at most 10 s (10 s
    /// when used without a relay); a timeout set at or past the relay's batch deadline
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
        let route = self.route.unwrap_or_else(|| {
            let url = url.clone();
            Arc::new(move |_: &Message| url.clone())
        });
        Ok(WebhookSink {
            client,
            url,
            route,
            secret: Arc::from(self.secret),
            configured_timeout: self.timeout,
            timeout,
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

fn client(timeout: Duration, connect_timeout: Duration) -> Result<Client> {
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

/// Delivers to HTTP endpoints. See the [module docs](self) for the request, the answers and
/// the order of delivery.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use ordo::relay::{Message, Outcomes, Sink, http::WebhookSink};
///
/// let mut sink = WebhookSink::builder("https://hooks.example.com/orders", b"whsec_0123456789abcdef".to_vec())
///     .timeout(Duration::from_secs(5))
///     .build()?;
/// let batch = [Message::new(br#"{"order_id": 7}"#.as_slice())];
/// let mut outcomes = Outcomes::new(batch.len());
/// sink.send(&batch, &mut outcomes).await?;
/// assert!(outcomes.all_delivered());
/// # Ok(()) }
/// ```
pub struct WebhookSink {
    client: Client,
    url: String,
    route: UrlFn,
    secret: Arc<[u8]>,
    /// The timeout its user set, if any; otherwise `timeout` is derived.
    configured_timeout: Option<Duration>,
    timeout: Duration,
    connect_timeout: Duration,
    concurrency: usize,
    max_response_bytes: usize,
    destinations: Destinations,
}

impl fmt::Debug for WebhookSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookSink")
            .field("target", &self.describe())
            .finish_non_exhaustive()
    }
}

impl WebhookSink {
    /// Settings for a sink posting to `url`, signing with `secret` (any bytes, at least
    /// [`MIN_SECRET_BYTES`]: 16; share it with the receivers), with the defaults above.
    pub fn builder(url: impl Into<String>, secret: impl Into<Vec<u8>>) -> WebhookSinkBuilder {
        WebhookSinkBuilder {
            url: url.into(),
            secret: secret.into(),
            route: None,
            timeout: None,
            connect_timeout: Duration::from_secs(5),
            concurrency: 16,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }

    /// One key's messages, sent one after another in batch order, each result as it comes;
    /// after a failure the later ones are not sent (no result: they are not to blame).
    fn send_key<'a>(
        &'a self,
        batch: &'a [Message],
        indexes: Vec<usize>,
    ) -> impl futures::Stream<Item = (usize, Result<(), SendError>)> + Send + 'a {
        futures::stream::unfold(indexes.into_iter(), move |mut rest| async move {
            let index = rest.next()?;
            let result = self.post(&batch[index]).await;
            if result.is_err() {
                rest = Vec::new().into_iter();
            }
            Some(((index, result), rest))
        })
    }

    /// Posts `message`; a transient failure while its URL answered nothing since is that
    /// URL's outage ([`SendError::Unavailable`]), not the message's.
    async fn post(&self, message: &Message) -> Result<(), SendError> {
        let url = super::guarded("route", || (self.route)(message))?;
        let sent_at = Instant::now();
        let posted = self.post_to(&url, message).await;
        self.destinations.judge(&url, sent_at, posted)
    }

    async fn post_to(&self, url: &str, message: &Message) -> Result<(), SendError> {
        let timestamp = chrono::Utc::now().timestamp().to_string();
        let signature = sign(&self.secret, &timestamp, &message.payload);
        let mut request = self
            .client
            .post(url)
            .header(CONTENT_TYPE, "application/json")
            .header(wire::EVENT_ID, message.id.to_string())
            .header(wire::SEQUENCE, message.sequence.get().to_string())
            .header(wire::POSITION, message.position.to_string())
            .header(wire::LANE, message.lane.as_str())
            .header(wire::TIMESTAMP, timestamp)
            .header(wire::SIGNATURE, signature);
        // Optional headers whose text a header cannot carry are left out rather than failing.
        let optional = [
            (wire::EVENT_TYPE, message.event_type.as_deref()),
            (wire::KEY, message.key.as_deref()),
            (wire::SOURCE, message.source.as_deref()),
            (crate::wire::TRACEPARENT, message.traceparent()),
        ];
        for (name, value) in optional {
            if let Some(value) = value.and_then(|text| HeaderValue::from_str(text).ok()) {
                request = request.header(name, value);
            }
        }
        let response = request
            .body(message.payload.clone())
            .send()
            .await
            .map_err(|error| request_failed(&error, url))?;
        answer(response, url, self.max_response_bytes).await
    }
}

/// The batch's messages grouped by key, each group in batch order, groups in order of first
/// appearance; a message without a key is a group of its own (nothing orders it).
fn by_key(batch: &[Message]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut group_of: HashMap<&str, usize> = HashMap::new();
    for (index, message) in batch.iter().enumerate() {
        let Some(key) = message.key.as_deref() else {
            groups.push(vec![index]);
            continue;
        };
        let group = *group_of.entry(key).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[group].push(index);
    }
    groups
}

impl Sink for WebhookSink {
    async fn send(&mut self, batch: &[Message], outcomes: &mut Outcomes) -> Result<(), SendError> {
        let this = &*self;
        let mut answers = futures::stream::iter(by_key(batch))
            .map(|indexes| Box::pin(this.send_key(batch, indexes)))
            .flatten_unordered(this.concurrency);
        while let Some((index, result)) = answers.next().await {
            outcomes.report(index, result);
        }
        Ok(())
    }

    async fn reset(&mut self) -> Result<(), SendError> {
        // A new client: no pooled connection of the old one is reused.
        self.client = client(self.timeout, self.connect_timeout)
            .map_err(|error| SendError::transient(error.to_string()))?;
        Ok(())
    }

    fn describe(&self) -> String {
        if self.url.is_empty() {
            "webhook (URL per event)".to_owned()
        } else {
            format!("webhook {}", crate::wire::redact_url(&self.url))
        }
    }

    fn fit_to_deadline(&mut self, batch_deadline: Duration) -> Result<()> {
        let timeout = super::fitted_timeout(
            self.configured_timeout,
            DEFAULT_TIMEOUT,
            batch_deadline,
            "webhook timeout/batch_deadline",
        )?;
        if timeout != self.timeout {
            self.client = client(timeout, self.connect_timeout)?;
            self.timeout = timeout;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::by_key;
    use crate::relay::Message;

    #[test]
    fn keys_keep_batch_order() {
        let batch: Vec<Message> = ["a", "b", "a", "c", "b"]
            .iter()
            .map(|key| Message::new(&b"{}"[..]).with_key(Some(key)))
            .collect();
        assert_eq!(by_key(&batch), vec![vec![0, 2], vec![1, 4], vec![3]]);
    }

    #[test]
    fn messages_without_a_key_are_each_their_own_group() {
        let batch: Vec<Message> = [None, Some("a"), None, Some("a")]
            .iter()
            .map(|key| Message::new(&b"{}"[..]).with_key(*key))
            .collect();
        assert_eq!(by_key(&batch), vec![vec![0], vec![1, 3], vec![2]]);
    }
}
