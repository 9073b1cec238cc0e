//! The sinks of a standalone relay, built from its settings before it connects anywhere: a
//! sink whose cargo feature this `ordo` was built without is refused, naming the feature.

use super::settings::{Settings, SinkKind};

/// Where the webhook sink's secret is read from unless `--secret-env` names another variable.
#[cfg_attr(not(feature = "http"), allow(dead_code))]
pub(crate) const DEFAULT_SECRET_ENV: &str = "ORDO_WEBHOOK_SECRET";

/// One relay's sinks (one batch in flight per sink), of the kind its settings chose. Without
/// any sink feature this has no variant, and no relay can be planned.
pub(crate) enum Sinks {
    #[cfg(feature = "nats")]
    Nats(Vec<ordo::relay::nats::NatsSink>),
    #[cfg(feature = "rabbitmq")]
    Rabbit(Vec<ordo::relay::rabbitmq::RabbitSink>),
    #[cfg(feature = "http")]
    Webhook(Vec<ordo::relay::http::WebhookSink>),
    #[cfg(feature = "kafka")]
    Kafka(Vec<ordo::relay::kafka::KafkaSink>),
}

/// `count` sinks of `kind` to `url`, with `settings`; or why not, naming the setting (or the
/// cargo feature this build lacks).
pub(crate) fn build(
    kind: SinkKind,
    url: &str,
    settings: &Settings,
    count: usize,
) -> Result<Sinks, String> {
    match kind {
        SinkKind::Nats => nats::sinks(url, settings, count),
        SinkKind::Rabbitmq => rabbitmq::sinks(url, settings, count),
        SinkKind::Webhook => webhook::sinks(url, settings, count),
        SinkKind::Kafka => kafka::sinks(url, settings, count),
    }
}

/// The refusal of a sink whose cargo feature this build lacks.
#[cfg_attr(
    all(
        feature = "nats",
        feature = "rabbitmq",
        feature = "http",
        feature = "kafka"
    ),
    allow(dead_code)
)]
fn missing_feature(kind: SinkKind) -> String {
    format!(
        "--sink {}: this ordo was built without the `{}` cargo feature; install one with it: \
         cargo install ordo-outbox --features cli,{}",
        kind.name(),
        kind.feature(),
        kind.feature()
    )
}

#[cfg(any(
    feature = "nats",
    feature = "rabbitmq",
    feature = "http",
    feature = "kafka"
))]
fn many<K>(count: usize, one: impl Fn() -> ordo::Result<K>) -> Result<Vec<K>, String> {
    (0..count)
        .map(|_| one().map_err(|error| super::run::refusal(&error)))
        .collect()
}

/// `setter(builder, value)` when the value was given: the builder's default otherwise.
#[cfg(any(
    feature = "nats",
    feature = "rabbitmq",
    feature = "http",
    feature = "kafka"
))]
fn set<B, T>(builder: B, value: Option<T>, setter: fn(B, T) -> B) -> B {
    match value {
        Some(value) => setter(builder, value),
        None => builder,
    }
}

#[cfg(feature = "nats")]
mod nats {
    use ordo::relay::nats::{NatsSink, NatsSinkBuilder as B};

    use super::{Settings, Sinks, many, set};

    pub(super) fn sinks(url: &str, s: &Settings, count: usize) -> Result<Sinks, String> {
        let one = || {
            let builder = NatsSink::builder(url);
            let builder = set(builder, s.subject_prefix.clone(), |b, p| {
                b.subject_prefix(p)
            });
            let builder = set(builder, s.max_in_flight, B::max_in_flight);
            let builder = set(builder, s.ack_timeout, B::ack_timeout);
            let builder = set(builder, s.detail_headers, B::detail_headers);
            set(builder, s.sink_connect_timeout, B::connect_timeout).build()
        };
        many(count, one).map(Sinks::Nats)
    }
}

#[cfg(not(feature = "nats"))]
mod nats {
    use super::{Settings, SinkKind, Sinks, missing_feature};

    pub(super) fn sinks(_: &str, _: &Settings, _: usize) -> Result<Sinks, String> {
        Err(missing_feature(SinkKind::Nats))
    }
}

#[cfg(feature = "rabbitmq")]
mod rabbitmq {
    use ordo::relay::rabbitmq::{RabbitSink, RabbitSinkBuilder as B};

    use super::{Settings, Sinks, many, set};

    pub(super) fn sinks(url: &str, s: &Settings, count: usize) -> Result<Sinks, String> {
        let one = || {
            let builder = RabbitSink::builder(url);
            let builder = set(builder, s.exchange.clone(), |b, e| b.exchange(e));
            let builder = set(builder, s.pipeline_depth, B::pipeline_depth);
            set(builder, s.sink_connect_timeout, B::connect_timeout).build()
        };
        many(count, one).map(Sinks::Rabbit)
    }
}

#[cfg(not(feature = "rabbitmq"))]
mod rabbitmq {
    use super::{Settings, SinkKind, Sinks, missing_feature};

    pub(super) fn sinks(_: &str, _: &Settings, _: usize) -> Result<Sinks, String> {
        Err(missing_feature(SinkKind::Rabbitmq))
    }
}

#[cfg(feature = "http")]
mod webhook {
    use ordo::relay::http::{
        MIN_SECRET_BYTES, Signature, WebhookSink, WebhookSinkBuilder as B,
        decode_standard_webhooks_secret,
    };

    use super::super::routing::SignatureArg;
    use super::{DEFAULT_SECRET_ENV, Settings, Sinks, many, set};

    pub(super) fn sinks(url: &str, s: &Settings, count: usize) -> Result<Sinks, String> {
        let variable = s.secret_env.as_deref().unwrap_or(DEFAULT_SECRET_ENV);
        let first = secret(variable)?;
        let also = match s.routing.also_secret_env.as_deref() {
            Some(variable) => Some(secret(variable)?),
            None => None,
        };
        let signature = match s.routing.signature {
            Some(SignatureArg::StandardWebhooks) => Signature::StandardWebhooks,
            Some(SignatureArg::Ordo) | None => Signature::Ordo,
        };
        let one = || {
            let builder = WebhookSink::builder(url, first.clone()).signature(signature);
            let builder = set(builder, also.clone(), B::also_sign_with);
            let builder = set(builder, s.concurrency, B::concurrency);
            let builder = set(builder, s.request_timeout, B::timeout);
            set(builder, s.sink_connect_timeout, B::connect_timeout).build()
        };
        many(count, one).map(Sinks::Webhook)
    }

    /// A signing secret, from the environment `variable` (`--secret-env`, `--also-secret-env`):
    /// never a flag, which `ps` and shell history would show. Written `whsec_...` (as Standard
    /// Webhooks libraries take it), its base64 is decoded; otherwise its bytes are the secret.
    /// At least [`MIN_SECRET_BYTES`], as the sink's builder requires; said here in the
    /// variable's name.
    fn secret(variable: &str) -> Result<Vec<u8>, String> {
        let decoded = std::env::var(variable)
            .ok()
            .and_then(|text| decode_standard_webhooks_secret(&text));
        let raw = std::env::var_os(variable).map(|secret| secret.into_encoded_bytes());
        match decoded.or(raw) {
            Some(secret) if secret.len() >= MIN_SECRET_BYTES => Ok(secret),
            Some(secret) if !secret.is_empty() => Err(format!(
                "--sink webhook: the signing secret in {variable} is {} bytes, and at least \
                 {MIN_SECRET_BYTES} are needed (a shorter one is guessed from one signed \
                 request); use 32 random bytes, e.g. `openssl rand -hex 32`",
                secret.len()
            )),
            _ => Err(format!(
                "--sink webhook signs with a secret read from the environment variable \
                 {variable} (--secret-env names another), which is not set or is empty"
            )),
        }
    }
}

#[cfg(not(feature = "http"))]
mod webhook {
    use super::{Settings, SinkKind, Sinks, missing_feature};

    pub(super) fn sinks(_: &str, _: &Settings, _: usize) -> Result<Sinks, String> {
        Err(missing_feature(SinkKind::Webhook))
    }
}

#[cfg(feature = "kafka")]
mod kafka {
    use ordo::relay::kafka::{KafkaSink, KafkaSinkBuilder as B};

    use super::{Settings, Sinks, many, set};

    pub(super) fn sinks(url: &str, s: &Settings, count: usize) -> Result<Sinks, String> {
        let bootstrap = url
            .strip_prefix("kafka://")
            .unwrap_or(url)
            .trim_end_matches('/');
        let properties = s.routing.kafka_properties()?;
        let one = || {
            let mut builder = KafkaSink::builder(bootstrap);
            for (name, value) in &properties {
                builder = builder.property(name, value);
            }
            let builder = set(builder, s.routing.topic.clone(), |b, t| b.topic(t));
            let builder = set(builder, s.routing.delivery_timeout, B::delivery_timeout);
            set(builder, s.sink_connect_timeout, B::connect_timeout).build()
        };
        many(count, one).map(Sinks::Kafka)
    }
}

#[cfg(not(feature = "kafka"))]
mod kafka {
    use super::{Settings, SinkKind, Sinks, missing_feature};

    pub(super) fn sinks(_: &str, _: &Settings, _: usize) -> Result<Sinks, String> {
        Err(missing_feature(SinkKind::Kafka))
    }
}

/// Whether `url` carries credentials (`user:password@` or a token `user@`): such a URL is
/// refused as a flag.
pub(crate) fn has_credentials(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    rest[..authority_end].contains('@')
}

#[cfg(test)]
mod tests {
    use super::has_credentials;

    #[test]
    fn credentials_in_a_url_are_seen() {
        assert!(has_credentials("amqp://guest:guest@127.0.0.1:5672/%2f"));
        assert!(has_credentials("nats://s3cr3t-token@127.0.0.1:4222"));
        assert!(!has_credentials("nats://127.0.0.1:4222"));
        assert!(!has_credentials("https://hooks.example/in/a@b"));
    }
}
