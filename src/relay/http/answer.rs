//! What a webhook answer, or a failed request, means for delivery: the table in the
//! [module docs](super).

use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use reqwest::header::{LOCATION, RETRY_AFTER};

use super::blame::Failed;
use crate::relay::SendError;

/// A request that got no answer, as a message's result: which failure it was (refused, a TLS
/// handshake that failed, a timeout, another connection failure) first, then its causes. One
/// that failed before the request was sent (it could not connect) is the URL's; one after (a
/// timeout, a connection dropped, an answer that does not parse) is unclear until the URL is
/// probed (`blame.rs`). Only a request that cannot be built fails its message for good.
pub(super) fn request_failed(error: &reqwest::Error, url: &str) -> Failed {
    let shown = crate::wire::redact_url(url);
    // The Display of a reqwest error holds the whole URL (tokens in its query and all): only
    // its source chain is shown.
    let cause = causes(error);
    if error.is_builder() {
        return Failed::Unsent(SendError::permanent(format!(
            "cannot build a request to {shown}: {cause}"
        )));
    }
    let tls = url.starts_with("https:");
    let what = match io_kind(error) {
        _ if error.is_timeout() => "timed out",
        Some(std::io::ErrorKind::ConnectionRefused) => "was refused (nothing listens there)",
        // tokio-rustls reports every TLS error as `InvalidData`, and a peer that closes during
        // the handshake as `UnexpectedEof` ("tls handshake eof"): a server that does not speak
        // TLS, a certificate this client does not trust, a protocol both do not share.
        Some(std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof)
            if tls && error.is_connect() =>
        {
            "failed in the TLS handshake"
        }
        _ if error.is_connect() => "could not connect",
        _ => "failed after it was sent",
    };
    let failed = SendError::transient(format!("POST {shown} {what}: {cause}"));
    if error.is_connect() {
        Failed::Unreachable(failed)
    } else {
        Failed::Unclear(failed)
    }
}

/// The error's causes, outermost first, joined with `: ` (a cause whose text its wrapper
/// already shows is left out).
pub(super) fn causes(error: &reqwest::Error) -> String {
    let mut shown: Vec<String> = Vec::new();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let text = cause.to_string();
        if !shown.iter().any(|before| before.contains(&text)) {
            shown.push(text);
        }
        // An `io::Error` wrapping another error shows that error's text and skips it in its
        // own `source()`: look inside.
        source = match cause.downcast_ref::<std::io::Error>() {
            Some(io) => io.get_ref().and_then(|inner| inner.source()),
            None => cause.source(),
        };
    }
    shown.join(": ")
}

/// The kind of the first `io::Error` among the error's causes, or of the innermost one it wraps
/// (the connector wraps tokio-rustls's `InvalidData` in an `Other`).
fn io_kind(error: &reqwest::Error) -> Option<std::io::ErrorKind> {
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(mut io) = cause.downcast_ref::<std::io::Error>() {
            while let Some(inner) = io
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<std::io::Error>())
            {
                io = inner;
            }
            return Some(io.kind());
        }
        source = cause.source();
    }
    None
}

/// A response as a message's result: see the table in the module docs. Its body is read up to
/// `limit` bytes: a 2xx is delivered whatever its body (the endpoint took the event; reading
/// it only lets the connection serve the next request), another answer's body is quoted in
/// its error (its first 120 characters, escaped) or, past the limit, said to be too large.
/// A status that a gateway or an overloaded server gives for every request (408, 429, 502,
/// 503, 504) is unclear until the URL is probed; every other one is the endpoint's answer
/// about this message.
pub(super) async fn answer(
    mut response: reqwest::Response,
    url: &str,
    limit: usize,
) -> Result<(), Failed> {
    let status = response.status();
    let body = read_body(&mut response, limit).await;
    if status.is_success() {
        return Ok(());
    }
    let headers = response.headers();
    let said = match body {
        Body::Read(bytes) if bytes.is_empty() => String::new(),
        Body::Read(bytes) => format!(
            ": {}",
            crate::relay::quoted(&String::from_utf8_lossy(&bytes))
        ),
        Body::TooLarge(size) => format!(
            ", with a response over the sink's limit of {limit} bytes ({}; not read)",
            size.map_or("of unknown length".to_owned(), |size| format!(
                "{size} bytes"
            ))
        ),
        Body::Failed(why) => format!(" (its body could not be read: {why})"),
    };
    let unclear = status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || super::blame::says_unavailable(status);
    if unclear || status.is_server_error() {
        let failed = SendError::Transient {
            message: format!("the endpoint answered {status}{said}"),
            retry_after: headers
                .get(RETRY_AFTER)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| retry_after(value, SystemTime::now())),
        };
        return Err(if unclear {
            Failed::Unclear(failed)
        } else {
            Failed::Answered(failed)
        });
    }
    if status.is_redirection() {
        let location = headers
            .get(LOCATION)
            .and_then(|value| value.to_str().ok())
            .map_or_else(String::new, |to| redirected_to(url, to));
        return Err(Failed::Answered(SendError::permanent(format!(
            "the endpoint answered {status}{location}; redirects are not followed: configure the new URL{said}"
        ))));
    }
    Err(Failed::Answered(SendError::permanent(format!(
        "the endpoint answered {status}{said}"
    ))))
}

/// Where a redirect points, resolved against the request's URL (a `Location` may be relative:
/// `/v2/in`, `../in`), for the error: ` to http://host/v2/in`, with the `Location` as sent
/// when it differs. Passwords and queries are never shown.
fn redirected_to(url: &str, location: &str) -> String {
    let resolved = reqwest::Url::parse(url).and_then(|base| base.join(location));
    match resolved {
        Ok(target) if target.as_str() == location => {
            format!(" to {}", crate::wire::redact_url(target.as_str()))
        }
        Ok(target) => format!(
            " to {} (Location {})",
            crate::wire::redact_url(target.as_str()),
            crate::relay::quoted(location.split(['?', '#']).next().unwrap_or(""))
        ),
        Err(error) => format!(
            " to a Location that does not resolve ({}: {error})",
            crate::relay::quoted(location.split(['?', '#']).next().unwrap_or(""))
        ),
    }
}

/// An answer's body, as far as it was read.
enum Body {
    Read(Vec<u8>),
    /// Over the limit: its announced length, if it announced one.
    TooLarge(Option<u64>),
    Failed(String),
}

/// Reads `response`'s body up to `limit` bytes: a body announced or found larger is not read
/// further (its connection is not reused).
async fn read_body(response: &mut reqwest::Response, limit: usize) -> Body {
    let announced = response.content_length();
    if announced.is_some_and(|length| length > limit as u64) {
        return Body::TooLarge(announced);
    }
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) if body.len() + chunk.len() > limit => {
                return Body::TooLarge(announced);
            }
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => return Body::Read(body),
            Err(error) if error.is_timeout() => return Body::Failed("timed out".to_owned()),
            Err(error) => {
                let why = causes(&error);
                return Body::Failed(if why.is_empty() {
                    "the connection ended".to_owned()
                } else {
                    why
                });
            }
        }
    }
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
