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
//! | `Ordo-History`, `Ordo-History-Start` | on the commit lane, the position's server history: its id and first position ([`Message::history`](crate::relay::Message::history)) |
//! | `Ordo-Route`, `Ordo-Previous` | the message's route (the URL, without credentials or query) and the position sent before it there ([`Message::route`](crate::relay::Message::route), [`Message::previous`](crate::relay::Message::previous)) |
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
//! Each failure is judged **whose** it is, the message's (an attempt) or the URL's (its
//! outage: [`SendError::Unavailable`], no attempt), from what the endpoint said about that
//! request, never from what other requests did:
//!
//! | answer | [`SendError`] |
//! | --- | --- |
//! | 2xx | delivered |
//! | 500, 501, 505 and every other 5xx not below | `Transient`: the endpoint's answer about this request, an attempt |
//! | 408, 429, 502, 503, 504 | `Transient` (`retry_after` from a `Retry-After` header, seconds or an HTTP date) if the URL answers its probe, else `Unavailable` (below) |
//! | 3xx (redirects are not followed: a POST must not become a GET) and every other 4xx | `Permanent` |
//! | no answer within the [`timeout`](WebhookSinkBuilder::timeout), the connection reset or closed after the request was sent, an answer that does not parse (not HTTP, a head too large) | `Transient` if the URL answers its probe, else `Unavailable` |
//! | no connection: refused, a name that does not resolve, a TLS handshake that failed, connecting timed out | `Unavailable` |
//! | the [`route`](WebhookSinkBuilder::route) function panicked on the message | `Permanent` |
//!
//! **The probe** settles the failures that do not say whose they are: a `HEAD` request to the
//! same URL (no body, no event, no signature), answered within half the request timeout. Any
//! answer but `429`, `502`, `503` or `504` (a `200`, a `405`, a `401`) says a server is there
//! and serving: the failure is the message's. No answer, or one of those four, makes it the
//! URL's outage. A URL that showed itself alive after the request was sent (a 2xx, an answer,
//! an earlier probe) is not asked again, and concurrent failures share one probe. So a `500`
//! for one poisonous event counts its attempts and parks it even when it is the only event
//! in flight, while a load balancer answering `503` to everything, or an endpoint that does
//! not answer at all, is an outage. **An endpoint that cannot take any event for a while**
//! (its database is down) and wants its events held without attempts answers `503` to the
//! probe too.
//!
//! A URL's outage holds only its messages (one customer's dead endpoint holds only its own):
//! they are sent again after the URL's own backoff (200 ms doubling to 10 s, jittered, at least
//! a `Retry-After`).
//!
//! # Slow answers
//!
//! Used by a relay, a request that has no answer within the
//! [`timeout`](WebhookSinkBuilder::timeout) is that message's failure at once (judged as
//! above: an attempt, unless the URL fails its probe), but the request stays open until the
//! relay's batch deadline: an answer before then replaces the failure, and a 2xx delivers the
//! event. So an endpoint that takes longer than the timeout but less than the deadline gets
//! each event once. One that takes longer than the deadline has its request closed there, and
//! the event waits at least the deadline again (its `retry_after`) before it is sent again:
//! the relay never has two requests open with one event, and an endpoint that needs less
//! than twice the deadline has finished with the first before the second arrives. Used
//! directly (no relay), a request ends at its timeout.
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
mod blame;
mod builder;
mod destinations;
mod framing;
mod post;
mod signature;
mod signing;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use reqwest::Client;

pub use builder::WebhookSinkBuilder;
use builder::client;
use destinations::Destinations;
use post::by_key;
pub use signature::{sign, verify_signature};
pub use signing::{
    Signature, decode_standard_webhooks_secret, sign_standard_webhook, standard_webhooks_secret,
};

use super::{Message, Outcomes, SendError, Sink};
use crate::error::Result;

/// Maps a message to the URL it is posted to.
pub type UrlFn = Arc<dyn Fn(&Message) -> String + Send + Sync>;

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
    /// Every secret each request is signed with (the first, and those of a rotation).
    secrets: Arc<[Vec<u8>]>,
    signature: Signature,
    /// The relay's envelope, learned in `prepare`.
    framing: crate::relay::format::Framing,
    /// The timeout its user set, if any; otherwise `timeout` is derived.
    configured_timeout: Option<Duration>,
    timeout: Duration,
    /// Under a relay, its batch deadline: how long a request past `timeout` stays open for its
    /// answer (the relay cuts it then). `None` used directly: a request ends at `timeout`.
    open_for: Option<Duration>,
    /// The URL probed for the relay ([`Sink::probe`]), when every message goes to it (no route).
    probe_url: Option<String>,
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
            more_secrets: Vec::new(),
            signature: Signature::Ordo,
            timeout: None,
            connect_timeout: Duration::from_secs(5),
            concurrency: 16,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }
}

impl Sink for WebhookSink {
    /// The URL without its user, password and query, and with a query, `?` and a hash of it:
    /// one route per URL, with no secret in it.
    fn router(&self) -> Option<crate::relay::Router> {
        let route = Arc::clone(&self.route);
        Some(Arc::new(move |message: &Message| {
            route_of_url(&route(message))
        }))
    }

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
        let open = self.open_for.unwrap_or(self.timeout);
        self.client = client(open, self.connect_timeout)
            .map_err(|error| SendError::transient(error.to_string()))?;
        Ok(())
    }

    /// `HEAD` of the sink's URL, unless it showed itself alive within the request timeout; a
    /// sink with a [`route`](WebhookSinkBuilder::route) judges each URL as its requests fail
    /// and answers `Ok` (see [Answers](self#answers)).
    async fn probe(&mut self) -> Result<(), SendError> {
        let Some(url) = &self.probe_url else {
            return Ok(());
        };
        if self.destinations.alive_within(url, self.timeout) {
            return Ok(());
        }
        blame::probe(&self.client, url, self.timeout / 2)
            .await
            .map_err(SendError::transient)
    }

    fn describe(&self) -> String {
        if self.url.is_empty() {
            "webhook (URL per event)".to_owned()
        } else {
            format!("webhook {}", crate::wire::redact_url(&self.url))
        }
    }

    async fn prepare(&mut self, timing: &super::SinkTiming) -> Result<()> {
        self.framing = crate::relay::format::Framing::of(timing);
        self.fit_to_deadline(timing.batch_deadline)
    }

    fn fit_to_deadline(&mut self, batch_deadline: Duration) -> Result<()> {
        let timeout = super::fitted_timeout(
            self.configured_timeout,
            DEFAULT_TIMEOUT,
            batch_deadline,
            "webhook timeout/batch_deadline",
        )?;
        if timeout != self.timeout || self.open_for != Some(batch_deadline) {
            // A request stays open past its timeout until the relay's deadline cuts it.
            self.client = client(batch_deadline, self.connect_timeout)?;
            self.timeout = timeout;
            self.open_for = Some(batch_deadline);
        }
        Ok(())
    }
}

/// A webhook URL as a route: without its user, password, query and fragment, and with a
/// query, `?` and a hash of it (two URLs that differ by their query are two routes).
fn route_of_url(url: &str) -> String {
    let (url, query) = match url.split_once('?') {
        Some((url, query)) => (url, Some(query.split('#').next().unwrap_or(""))),
        None => (url.split('#').next().unwrap_or(url), None),
    };
    let shown = match url.split_once("://") {
        Some((scheme, rest)) => {
            let end = rest.find('/').unwrap_or(rest.len());
            let (authority, path) = rest.split_at(end);
            let host = authority
                .rsplit_once('@')
                .map_or(authority, |(_, host)| host);
            format!("{scheme}://{host}{path}")
        }
        None => url.to_owned(),
    };
    match query {
        Some(query) => format!(
            "{shown}?{:016x}",
            crate::relay::chain::fnv1a(query.as_bytes())
        ),
        None => shown,
    }
}

#[cfg(test)]
mod tests;
