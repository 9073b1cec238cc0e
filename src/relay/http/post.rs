//! Posting: one key's messages one after another, each request signed, and the batch grouped
//! by key.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::Duration;

use reqwest::header::{CONTENT_TYPE, HeaderValue};
use tokio::time::Instant;

use super::answer::{answer, request_failed};
use super::{Message, SendError, WebhookSink, sign};
use crate::wire::http as wire;

impl WebhookSink {
    /// One key's messages, sent one after another in batch order, each result as it comes;
    /// after a failure the later ones are not sent (no result: they are not to blame).
    pub(super) fn send_key<'a>(
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
        let url = crate::relay::guarded("route", || (self.route)(message))?;
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
        let response = request
            .body(message.payload.clone())
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
