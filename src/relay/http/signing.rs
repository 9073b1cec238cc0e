//! How a webhook request is signed: ordo's own scheme (`Ordo-Timestamp`, `Ordo-Signature`) or
//! Standard Webhooks 1.0 (`webhook-id`, `webhook-timestamp`, `webhook-signature`), each with
//! every secret the sink holds, so that receivers can rotate secrets without a gap.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::signature::{hmac, sign};
use crate::wire::http as wire;

/// The signature scheme of a [`WebhookSink`](super::WebhookSink), set with
/// [`WebhookSinkBuilder::signature`](super::WebhookSinkBuilder::signature).
///
/// | scheme | headers | signed bytes | signature |
/// | --- | --- | --- | --- |
/// | `Ordo` | `Ordo-Timestamp`, `Ordo-Signature` | `"{timestamp}.{body}"` | lowercase hex HMAC-SHA256, one per secret, separated by `,` |
/// | `StandardWebhooks` | `webhook-id` (the event id), `webhook-timestamp`, `webhook-signature` | `"{id}.{timestamp}.{body}"` | `v1,` and the base64 HMAC-SHA256, one per secret, separated by spaces |
///
/// Standard Webhooks receivers verify with the off-the-shelf libraries (`standardwebhooks` in
/// Python, JavaScript, Go, ...), given the secret as [`standard_webhooks_secret`] writes it
/// (`whsec_` and the base64 of its bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Signature {
    /// ordo's own headers. The default.
    #[default]
    Ordo,
    /// Standard Webhooks 1.0 (<https://www.standardwebhooks.com>).
    StandardWebhooks,
}

/// The Standard Webhooks signature of a request (`webhook-signature`, one secret): `v1,` and
/// the base64 of HMAC-SHA256 keyed with `secret` over `"{id}.{timestamp}.{body}"`.
///
/// ```
/// use ordo::relay::http::sign_standard_webhook;
///
/// let signature = sign_standard_webhook(b"0123456789abcdef", "msg_1", "1700000000", b"{}");
/// assert!(signature.starts_with("v1,"));
/// ```
pub fn sign_standard_webhook(secret: &[u8], id: &str, timestamp: &str, body: &[u8]) -> String {
    let digest = hmac(
        secret,
        &[id.as_bytes(), b".", timestamp.as_bytes(), b".", body],
    );
    format!("v1,{}", STANDARD.encode(digest))
}

/// `secret` as Standard Webhooks libraries take it: `whsec_` and the base64 of its bytes.
/// Give the receivers this text; give the sink the bytes.
///
/// ```
/// assert_eq!(ordo::relay::http::standard_webhooks_secret(b"key"), "whsec_a2V5");
/// ```
pub fn standard_webhooks_secret(secret: &[u8]) -> String {
    format!("whsec_{}", STANDARD.encode(secret))
}

/// The bytes of a secret written as Standard Webhooks libraries take it (`whsec_` and base64),
/// or `None` when `text` is not so written.
pub fn decode_standard_webhooks_secret(text: &str) -> Option<Vec<u8>> {
    STANDARD.decode(text.strip_prefix("whsec_")?).ok()
}

/// The signature headers of a request with `body` for the event `id`, signed at `timestamp`
/// (Unix seconds) with each of `secrets`.
pub(super) fn headers(
    scheme: Signature,
    secrets: &[Vec<u8>],
    id: &str,
    timestamp: &str,
    body: &[u8],
) -> Vec<(&'static str, String)> {
    match scheme {
        Signature::Ordo => {
            let signatures: Vec<String> = secrets
                .iter()
                .map(|secret| sign(secret, timestamp, body))
                .collect();
            vec![
                (wire::TIMESTAMP, timestamp.to_owned()),
                (wire::SIGNATURE, signatures.join(",")),
            ]
        }
        Signature::StandardWebhooks => {
            let signatures: Vec<String> = secrets
                .iter()
                .map(|secret| sign_standard_webhook(secret, id, timestamp, body))
                .collect();
            vec![
                (wire::WEBHOOK_ID, id.to_owned()),
                (wire::WEBHOOK_TIMESTAMP, timestamp.to_owned()),
                (wire::WEBHOOK_SIGNATURE, signatures.join(" ")),
            ]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The expected value was computed by Python's `hmac` and `base64` modules (an independent
    /// implementation): `base64.b64encode(hmac.new(b"key", b"msg_1.1.{}", hashlib.sha256).digest())`.
    #[test]
    fn a_standard_webhook_signature_matches_an_independent_hmac() {
        assert_eq!(
            sign_standard_webhook(b"key", "msg_1", "1", b"{}"),
            "v1,jKGHVBDuJf5ZbCMVrrutoMHDN1OlFFCE9iogVIO9MLQ="
        );
        let secret = standard_webhooks_secret(b"0123456789abcdef");
        assert_eq!(
            decode_standard_webhooks_secret(&secret).as_deref(),
            Some(&b"0123456789abcdef"[..])
        );
        let both = headers(
            Signature::StandardWebhooks,
            &[b"one".to_vec(), b"two".to_vec()],
            "e",
            "1",
            b"{}",
        );
        assert_eq!(both[2].1.split(' ').count(), 2);
    }
}
