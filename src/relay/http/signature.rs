//! The webhook signature: HMAC-SHA256 over `"{timestamp}.{body}"`, lowercase hex.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The signature [`WebhookSink`](super::WebhookSink) sends in `Ordo-Signature` for a request
/// signed at `timestamp` (the `Ordo-Timestamp` header: Unix seconds, as decimal text) with
/// `body` (the raw request body): lowercase hex of HMAC-SHA256 keyed with `secret` over the
/// bytes of `timestamp`, one `.`, then `body`.
pub fn sign(secret: &[u8], timestamp: &str, body: &[u8]) -> String {
    let mut mac = keyed(secret);
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let mut hex = String::with_capacity(digest.len() * 2);
    for byte in digest.iter() {
        hex.push(char::from(HEX[usize::from(byte >> 4)]));
        hex.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    hex
}

/// Whether `header` (the `Ordo-Signature` value a receiver got) holds the signature of `body`
/// at `timestamp` (the `Ordo-Timestamp` value) with `secret`. A sink that signs with several
/// secrets (while they are rotated) sends one signature per secret, separated by `,`: any one
/// that matches is enough. The comparison takes the same time whichever byte differs, so it
/// leaks nothing about the expected signature. Hex in either case is accepted; surrounding
/// whitespace is ignored.
///
/// It does not judge the timestamp: a receiver should also refuse a request whose
/// `Ordo-Timestamp` is far from its clock (five minutes, say), so that a captured request
/// cannot be replayed later. Deduplicating by `Ordo-Event-Id` absorbs honest redeliveries.
///
/// ```
/// use ordo::relay::http::{sign, verify_signature};
///
/// let secret = b"whsec_test";
/// let body = br#"{"order_id":7}"#;
/// let header = sign(secret, "1767225600", body);
/// assert!(verify_signature(secret, "1767225600", body, &header));
/// assert!(!verify_signature(secret, "1767225601", body, &header));
/// assert!(!verify_signature(b"another secret", "1767225600", body, &header));
/// ```
pub fn verify_signature(secret: &[u8], timestamp: &str, body: &[u8], header: &str) -> bool {
    header
        .split(',')
        .any(|one| verify_one(secret, timestamp, body, one))
}

fn verify_one(secret: &[u8], timestamp: &str, body: &[u8], header: &str) -> bool {
    let Some(expected) = decode_hex(header.trim()) else {
        return false;
    };
    let mut mac = keyed(secret);
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    // `verify_slice` compares in constant time (and refuses a wrong length).
    mac.verify_slice(&expected).is_ok()
}

/// HMAC-SHA256 keyed with `secret` over `parts`, one after another.
pub(super) fn hmac(secret: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = keyed(secret);
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().to_vec()
}

fn keyed(secret: &[u8]) -> HmacSha256 {
    // HMAC takes a key of any length, so this cannot fail; an empty secret is refused by
    // the builder, not here.
    match HmacSha256::new_from_slice(secret) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC accepts keys of every length"),
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    bytes
        .chunks_exact(2)
        .map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?))
        .collect()
}

fn nibble(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{sign, verify_signature};

    /// The expected value was computed by Python's `hmac` module (an independent
    /// implementation): `hmac.new(b"key", b"1.{}", hashlib.sha256).hexdigest()`.
    #[test]
    fn matches_an_independent_hmac_sha256() {
        let expected = "1ba6b8171186efc613e8bcc0cbdab2748f24984d7c5a84faa2637afa0e40d224";
        assert_eq!(sign(b"key", "1", b"{}"), expected);
        assert!(verify_signature(b"key", "1", b"{}", expected));
        assert!(verify_signature(
            b"key",
            "1",
            b"{}",
            &expected.to_uppercase()
        ));
    }

    #[test]
    fn refuses_malformed_or_wrong_signatures() {
        let good = sign(b"key", "10", b"body");
        assert!(!verify_signature(b"key", "10", b"body", ""));
        assert!(!verify_signature(b"key", "10", b"body", "zz"));
        assert!(!verify_signature(b"key", "10", b"body", &good[..62]));
        assert!(!verify_signature(b"key", "10", b"bodY", &good));
    }
}
