//! What the relay's routing and envelope make of a request: the URL path a destination
//! template rendered, and the CloudEvents attributes as HTTP headers.

use crate::relay::SendError;

/// `url` with `path` (a rendered destination) after its path: `https://hooks.example/in` and
/// `/acme/orders` make `https://hooks.example/in/acme/orders`. Every byte of `path` outside the
/// characters a path segment takes as they are is percent-encoded (`%` too, so an event's
/// `%2e%2e` stays text), so an event's value cannot add a query or a fragment. The path is
/// checked first ([`check_path`]).
pub(super) fn joined(url: &str, path: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let mut joined = base.trim_end_matches('/').to_owned();
    if !path.starts_with('/') {
        joined.push('/');
    }
    for byte in path.bytes() {
        let plain = byte.is_ascii_alphanumeric()
            || matches!(
                byte,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'/'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
                    | b':'
                    | b'@'
            );
        if plain {
            joined.push(char::from(byte));
        } else {
            joined.push_str(&format!("%{byte:02X}"));
        }
    }
    if let Some(query) = query {
        joined.push('?');
        joined.push_str(query);
    }
    joined
}

/// A rendered destination path a request can take: no `.` or `..` segment (a URL resolves
/// them, which would send the event to another endpoint of the host), no empty segment, no
/// control character, at most 2,000 bytes. Else the message's permanent failure.
pub(super) fn check_path(path: &str) -> Result<(), SendError> {
    let refuse = |why: &str| {
        Err(SendError::permanent(format!(
            "the destination path {} {why}",
            crate::relay::quoted(path)
        )))
    };
    if path.len() > 2_000 {
        return refuse("is over 2,000 bytes");
    }
    if path.chars().any(char::is_control) {
        return refuse("holds a control character");
    }
    let segments = path.strip_prefix('/').unwrap_or(path).split('/');
    for segment in segments {
        if segment.is_empty() || segment == "." || segment == ".." {
            return refuse("has an empty, `.` or `..` segment");
        }
    }
    Ok(())
}

/// An attribute's value as an HTTP header value (the HTTP binding of CloudEvents): printable
/// ASCII but `"` and `%` as is, every other byte percent-encoded.
pub(super) fn header_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if (0x20..0x7f).contains(&byte) && byte != b'"' && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_destination_path_stays_a_path() {
        assert_eq!(
            joined("https://h.example/in/", "/acme/orders"),
            "https://h.example/in/acme/orders"
        );
        assert_eq!(
            joined("https://h.example/in?k=1", "Zürich?x#y"),
            "https://h.example/in/Z%C3%BCrich%3Fx%23y?k=1"
        );
        assert_eq!(
            joined("https://h/in", "a%2e%2e"),
            "https://h/in/a%252e%252e"
        );
        for bad in ["/a/../admin", "/a//b", "/.", "/a\nb", ""] {
            assert!(check_path(bad).is_err_and(|e| e.is_permanent()), "{bad:?}");
        }
        assert!(check_path("/acme/orders.v2").is_ok());
        assert_eq!(header_value("a \"b\" 100% ü"), "a %22b%22 100%25 %C3%BC");
    }
}
