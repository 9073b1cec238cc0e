//! What a webhook answer, or a failed request, means for delivery: the table in the
//! [module docs](super).

use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use reqwest::header::{LOCATION, RETRY_AFTER};

use crate::relay::SendError;

pub(super) fn request_failed(error: &reqwest::Error, url: &str) -> SendError {
    let url = crate::relay::redact_url(url);
    // The Display of a reqwest error holds the whole URL (tokens in its query and all): only
    // its source chain is shown.
    let cause = std::error::Error::source(error)
        .map(ToString::to_string)
        .unwrap_or_default();
    if error.is_builder() {
        return SendError::permanent(format!("cannot build a request to {url}: {cause}"));
    }
    let what = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "could not connect"
    } else {
        "failed"
    };
    SendError::transient(format!("POST {url} {what}: {cause}"))
}

/// A response as a message's result: see the table in the module docs.
pub(super) fn answer(
    status: StatusCode,
    headers: &reqwest::header::HeaderMap,
) -> Result<(), SendError> {
    if status.is_success() {
        return Ok(());
    }
    let transient = status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error();
    if transient {
        return Err(SendError::Transient {
            message: format!("the endpoint answered {status}"),
            retry_after: headers
                .get(RETRY_AFTER)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| retry_after(value, SystemTime::now())),
        });
    }
    if status.is_redirection() {
        let location = headers
            .get(LOCATION)
            .and_then(|value| value.to_str().ok())
            .map_or_else(String::new, |to| {
                format!(" to {}", crate::relay::redact_url(to))
            });
        return Err(SendError::permanent(format!(
            "the endpoint answered {status}{location}; redirects are not followed: configure the new URL"
        )));
    }
    Err(SendError::permanent(format!(
        "the endpoint answered {status}"
    )))
}

/// A `Retry-After` value (delay seconds, or an HTTP date) as a pause from `now`. A date in the
/// past is no pause; text that is neither is ignored.
fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::retry_after;

    #[test]
    fn retry_after_takes_seconds_or_an_http_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        assert_eq!(retry_after("120", now), Some(Duration::from_secs(120)));
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after("soon", now), None);
    }
}
