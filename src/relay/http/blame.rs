//! Whose fault a failed request is: the message's (an attempt) or its URL's (the URL's outage,
//! no attempt), from what the endpoint said about that request, and where it said nothing
//! that tells, from a probe of the URL (`destinations.rs` keeps each URL's state).
//!
//! | what happened | whose |
//! | --- | --- |
//! | the request could not be built (a URL that does not parse) | the message's, permanent |
//! | no connection: refused, a name that does not resolve, a TLS handshake that failed, connecting timed out | the URL's |
//! | an answer about the request: any status but the ones below (a `500`, a `400`) | the message's |
//! | no answer in time, the connection dropped after the request was sent, an answer that does not parse, or `408`, `429`, `502`, `503`, `504` (what a gateway or an overloaded server answers to every request) | unclear: the URL's if it does not answer a `HEAD` probe (or answers it `429`, `502`, `503`, `504`), else the message's |
//!
//! Why a probe rather than "did anything else get through": a message that is the only
//! traffic has nothing beside it to compare with, and a 500 for one poisonous event must
//! count and park, not be re-sent for ever. A `HEAD` to the same URL is cheap, carries no
//! event and no signature, and passes the same load balancer and gateway: a server that
//! answers it serves requests, so the silence or the reset was about the message.

use std::time::Duration;

use reqwest::{Client, StatusCode};

use super::answer::causes;
use crate::relay::SendError;

/// A request that did not deliver its message, and what that says about whose fault it is.
#[derive(Debug)]
pub(super) enum Failed {
    /// Refused before it was sent (it cannot be built): the message's, and no news of the URL.
    Unsent(SendError),
    /// It could not be sent: the URL cannot be reached.
    Unreachable(SendError),
    /// The endpoint answered this request: its verdict on the message.
    Answered(SendError),
    /// Nothing that tells whose fault it is (see the module docs): the URL is probed.
    Unclear(SendError),
}

/// Whether `status` is what a gateway in front of a server, or a server that cannot serve
/// now, answers to every request (a `503` of a load balancer without backends).
pub(super) fn says_unavailable(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    )
}

/// Asks the endpoint at `url` whether it serves requests: a `HEAD` without body, event or
/// signature, answered within `bound`. Any answer but `429`, `502`, `503` and `504` says yes
/// (a `405` or a `401` included: a server is there and answers); no answer, a refused or
/// dropped connection, or one of those statuses says no, and why.
pub(super) async fn probe(client: &Client, url: &str, bound: Duration) -> Result<(), String> {
    let shown = crate::wire::redact_url(url);
    match tokio::time::timeout(bound, client.head(url).send()).await {
        Err(_) => Err(format!("HEAD {shown} got no answer within {bound:?}")),
        Ok(Err(error)) => Err(format!("HEAD {shown} failed: {}", causes(&error))),
        Ok(Ok(response))
            if says_unavailable(response.status())
                || response.status() == StatusCode::TOO_MANY_REQUESTS =>
        {
            Err(format!("HEAD {shown} was answered {}", response.status()))
        }
        Ok(Ok(_)) => Ok(()),
    }
}
