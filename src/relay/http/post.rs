//! Posting: one key's messages one after another, each request signed, and the batch grouped
//! by key.

use std::collections::HashMap;

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
        // Optional headers whose text a header cannot carry are left out rather than failing.
        // (A route a relay computed is always printable: `relay::chain::route_name`.)
        let optional = [
            (wire::EVENT_TYPE, message.event_type.as_deref()),
            (wire::KEY, message.key.as_deref()),
            (wire::SOURCE, message.source.as_deref()),
            (wire::ROUTE, message.route.as_deref()),
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
