//! Posting: one key's messages one after another, each request signed and its failure judged,
//! and the batch grouped by key.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::Duration;

use reqwest::header::{CONTENT_TYPE, HeaderValue};
use tokio::time::Instant;

use super::answer::{answer, request_failed};
use super::blame::{Failed, probe};
use super::{Message, SendError, WebhookSink, framing, signing};
use crate::wire::http as wire;

impl WebhookSink {
    /// One key's messages, sent one after another in batch order, each result as it comes
    /// (a message may have two: see [`post`](Self::post)); after a failure the later ones are
    /// not sent (no result: they are not to blame).
    pub(super) fn send_key<'a>(
        &'a self,
        batch: &'a [Message],
        indexes: Vec<usize>,
    ) -> impl futures::Stream<Item = (usize, Result<(), SendError>)> + Send + 'a {
        async_stream::stream! {
            for index in indexes {
                let mut failed = false;
                for await result in self.post(&batch[index]) {
                    failed = result.is_err();
                    yield (index, result);
                }
                if failed {
                    break;
                }
            }
        }
    }

    /// Posts `message`, its failure judged whose it is (`destinations.rs`). A request with no
    /// answer within the timeout is that message's failure, reported then; under a relay its
    /// request stays open until the batch deadline cuts it, and an answer that comes before
    /// is reported too and replaces the failure (a 2xx delivers it): an endpoint slower than
    /// the timeout is not sent the event again while it holds the request that carries it.
    fn post<'a>(
        &'a self,
        message: &'a Message,
    ) -> impl futures::Stream<Item = Result<(), SendError>> + Send + 'a {
        async_stream::stream! {
            let url = match crate::relay::guarded("route", || (self.route)(message)) {
                Ok(url) => url,
                Err(error) => {
                    yield Err(error);
                    return;
                }
            };
            let sent_at = Instant::now();
            let request = self.post_to(&url, message);
            tokio::pin!(request);
            let posted = match tokio::time::timeout(self.timeout, &mut request).await {
                Ok(posted) => posted,
                Err(_) => {
                    // Under a relay the request stays open until its deadline: if it is cut
                    // there unanswered, the endpoint showed it needs longer than that, so the
                    // event waits at least as long again before it is sent again.
                    let silent = Failed::Unclear(SendError::Transient {
                        message: format!(
                            "POST {} timed out: no answer within {:?}",
                            crate::wire::redact_url(&url),
                            self.timeout
                        ),
                        retry_after: self.open_for,
                    });
                    yield self.judge(&url, sent_at, Err(silent)).await;
                    if self.open_for.is_none() {
                        return;
                    }
                    request.await
                }
            };
            yield self.judge(&url, sent_at, posted).await;
        }
    }

    async fn judge(
        &self,
        url: &str,
        sent_at: Instant,
        posted: Result<(), Failed>,
    ) -> Result<(), SendError> {
        let bound = self.timeout / 2;
        self.destinations
            .judge(url, sent_at, posted, || probe(&self.client, url, bound))
            .await
    }

    async fn post_to(&self, url: &str, message: &Message) -> Result<(), Failed> {
        let body = self.framing.body(message).map_err(Failed::Unsent)?;
        if let Some(path) = &message.destination {
            framing::check_path(path).map_err(Failed::Unsent)?;
        }
        let timestamp = chrono::Utc::now().timestamp().to_string();
        let id = message.id.to_string();
        let signed = signing::headers(self.signature, &self.secrets, &id, &timestamp, &body);
        let mut request = self
            .client
            .post(url)
            .header(CONTENT_TYPE, self.framing.content_type())
            .header(wire::EVENT_ID, id.as_str())
            .header(wire::SEQUENCE, message.sequence.get().to_string())
            .header(wire::POSITION, message.position.to_string())
            .header(wire::LANE, message.lane.as_str());
        for (name, value) in signed {
            request = request.header(name, value);
        }
        if let Some(history) = message.history {
            request = request
                .header(wire::HISTORY, history.id.to_string())
                .header(wire::HISTORY_START, history.first_position.to_string());
        }
        if let Some(previous) = message.previous {
            request = request.header(wire::PREVIOUS, previous.to_string());
        }
        // Optional headers go as their UTF-8 bytes; one whose text a header cannot carry at
        // all (a control character) is left out, and said, rather than failing the event.
        // (A route a relay computed is always printable: `relay::chain::route_name`.)
        let optional = [
            (wire::EVENT_TYPE, message.event_type.as_deref()),
            (wire::KEY, message.key.as_deref()),
            (wire::SOURCE, message.source.as_deref()),
            (wire::ROUTE, message.route.as_deref()),
            (crate::wire::TRACEPARENT, message.traceparent()),
        ];
        for (name, value) in optional {
            let Some(text) = value else { continue };
            match HeaderValue::from_bytes(text.as_bytes()) {
                Ok(value) => request = request.header(name, value),
                Err(_) => left_out(name, message),
            }
        }
        // The headers the relay's templates chose: one an HTTP header cannot carry fails the
        // message, which was asked to carry it.
        for (name, value) in &message.header_fields {
            let value = HeaderValue::from_str(value).map_err(|_| {
                Failed::Unsent(SendError::permanent(format!(
                    "header {name} {} holds characters an HTTP header cannot carry",
                    crate::relay::quoted(value)
                )))
            })?;
            request = request.header(name.as_str(), value);
        }
        for (name, value) in self.framing.binary_attributes(message, wire::CE_PREFIX) {
            request = request.header(name, framing::header_value(&value));
        }
        let response = request
            .body(body)
            .send()
            .await
            .map_err(|error| request_failed(&error, url))?;
        answer(response, url, self.max_response_bytes).await
    }
}

/// Says that `header` was left out of `message`'s request: at most once a minute per process
/// (with how many were left out since), so that a stream of such events cannot flood the log.
fn left_out(header: &str, message: &Message) {
    static LEFT_OUT: AtomicU64 = AtomicU64::new(0);
    static LAST_SAID: Mutex<Option<Instant>> = Mutex::new(None);
    let count = LEFT_OUT.fetch_add(1, AtomicOrdering::Relaxed) + 1;
    let Ok(mut last) = LAST_SAID.lock() else {
        return;
    };
    if last.is_some_and(|at| at.elapsed() < Duration::from_secs(60)) {
        return;
    }
    *last = Some(Instant::now());
    tracing::warn!(
        header,
        event = %message.id,
        left_out_since_start = count,
        "a header's text holds a control character, which HTTP cannot carry: the header is left \
         out of the event's request (the body and the other headers go as usual)"
    );
}

/// The batch's messages grouped by key, each group in batch order, groups in order of first
/// appearance; a message without a key is a group of its own (nothing orders it).
pub(super) fn by_key(batch: &[Message]) -> Vec<Vec<usize>> {
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
