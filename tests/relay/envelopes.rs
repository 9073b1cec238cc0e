//! The envelopes the built-in sinks send, checked by an independent verifier: the reference
//! libraries of the standards, from PyPI (`cloudevents`, the CloudEvents Python SDK;
//! `standardwebhooks`), in a virtual environment of the test's own (`target/pyverify`, made
//! and filled on first use; `.ci/run` makes it too). Each sink sends real messages to its
//! broker (Kafka: librdkafka's mock cluster in a process of its own) in CloudEvents binary and
//! structured mode, and a webhook signs with two secrets at once (a rotation) under Standard
//! Webhooks; `tests/python/verify_envelopes.py` parses every one with the libraries.
#![cfg(all(
    feature = "kafka",
    feature = "nats",
    feature = "rabbitmq",
    feature = "http"
))]

use crate::common;

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;

use base64::Engine as _;
use common::brokers::{NATS_ADDR, TestQueue, TestStream, addr, amqp_uri};
use common::http_responder::{Reply, Responder};
use common::kafka::{MockKafka, read_topic, topic_name};
use ordo::relay::http::{Signature, WebhookSink, standard_webhooks_secret};
use ordo::relay::kafka::KafkaSink;
use ordo::relay::nats::NatsSink;
use ordo::relay::rabbitmq::RabbitSink;
use ordo::relay::{Format, Message, Outcomes, RelayConfig, Sink, SinkTiming};
use serde_json::{Value, json};

const RELAY: &str = "envelopes";
const PAYLOAD: &str = r#"{"order": 7, "total": 1.5, "note": "héllo"}"#;
const SECRETS: [&[u8]; 2] = [
    b"old secret, 16+ bytes long",
    b"new secret, also long enough",
];

/// The Python of the verifiers' virtual environment, made and filled on first use.
fn python() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/pyverify");
    let python = root.join("bin/python");
    let ready = Command::new(&python)
        .args(["-c", "import cloudevents.core, standardwebhooks"])
        .status()
        .is_ok_and(|status| status.success());
    if !ready {
        let made = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&root)
            .status()
            .expect("python3 -m venv (Debian: python3-venv)");
        assert!(made.success(), "python3 -m venv {}", root.display());
        let installed = Command::new(root.join("bin/pip"))
            .args(["install", "-q", "cloudevents>=2.2", "standardwebhooks>=1.3"])
            .status()
            .expect("pip install");
        assert!(
            installed.success(),
            "pip install cloudevents standardwebhooks"
        );
    }
    python
}

fn message(key: Option<&str>) -> Message {
    Message::new(PAYLOAD.as_bytes().to_vec())
        .with_event_type(Some("order.placed"))
        .with_key(key)
}

fn expected(message: &Message) -> Value {
    json!({
        "specversion": "1.0",
        "id": message.id.to_string(),
        "source": RELAY,
        "type": "order.placed",
        "datacontenttype": "application/json",
        "data": serde_json::from_str::<Value>(PAYLOAD).expect("JSON"),
        "partitionkey": message.key,
    })
}

async fn prepared<K: Sink>(mut sink: K, format: Format) -> K {
    let timing = SinkTiming::of(&RelayConfig::new(RELAY).format(format));
    sink.prepare(&timing).await.expect("prepare");
    sink
}

async fn send<K: Sink>(sink: &mut K, message: &Message) {
    let batch = [message.clone()];
    let mut outcomes = Outcomes::new(1);
    sink.send(&batch, &mut outcomes).await.expect("send");
    assert!(outcomes.all_delivered(), "{outcomes:?}");
}

fn case(
    name: &str,
    binding: &str,
    format: Format,
    headers: HashMap<String, String>,
    body: &[u8],
) -> Value {
    let mode = if format == Format::CloudEventsBinary {
        "binary"
    } else {
        "structured"
    };
    json!({
        "name": name,
        "binding": binding,
        "mode": mode,
        "headers": headers,
        "body_b64": base64::engine::general_purpose::STANDARD.encode(body),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_and_standard_webhooks_pass_the_reference_libraries() {
    let python = tokio::task::spawn_blocking(python)
        .await
        .expect("the verifiers");
    let mut cases = Vec::new();
    cases.extend(http_cases().await);
    cases.extend(kafka_cases().await);
    cases.extend(amqp_cases().await);
    cases.extend(nats_cases().await);
    verify(python, &cases);
}

/// The formats every sink sends in.
const FORMATS: [Format; 2] = [Format::CloudEventsBinary, Format::CloudEventsStructured];

/// HTTP, both modes, signed Standard Webhooks with two secrets.
async fn http_cases() -> Vec<Value> {
    let mut cases = Vec::new();
    let responder = Responder::start(vec![Reply::status(204), Reply::status(204)]).await;
    for format in FORMATS {
        let sink = WebhookSink::builder(responder.url("/in"), SECRETS[0].to_vec())
            .also_sign_with(SECRETS[1].to_vec())
            .signature(Signature::StandardWebhooks)
            .build()
            .expect("webhook sink");
        let mut sink = prepared(sink, format).await;
        let message = message(Some("customer 7"));
        send(&mut sink, &message).await;
        let request = responder.requests().pop().expect("a request");
        let mut ce = case(
            "http",
            "http",
            format,
            request.headers.clone(),
            &request.body,
        );
        ce["expect"] = expected(&message);
        cases.push(ce);
        let mut webhook = case(
            "standard webhooks",
            "standard-webhooks",
            format,
            request.headers,
            &request.body,
        );
        webhook["secrets"] = json!(SECRETS.map(standard_webhooks_secret));
        webhook["wrong"] = json!(standard_webhooks_secret(b"a wrong secret, long enough"));
        cases.push(webhook);
    }

    cases
}

/// Kafka, both modes.
async fn kafka_cases() -> Vec<Value> {
    let mut cases = Vec::new();
    let kafka = Arc::new(MockKafka::start(1));
    let topic = topic_name("envelopes");
    kafka.topic(&topic, 1);
    let mut sent = Vec::new();
    for format in FORMATS {
        let sink = KafkaSink::builder(&kafka.bootstrap)
            .topic(&topic)
            .build()
            .expect("kafka sink");
        let mut sink = prepared(sink, format).await;
        let message = message(Some("customer 7"));
        send(&mut sink, &message).await;
        sent.push((format, message));
    }
    let (reader, read_from) = (Arc::clone(&kafka), topic.clone());
    let records = tokio::task::spawn_blocking(move || read_topic(&reader.bootstrap, &read_from))
        .await
        .expect("read the topic");
    for ((format, message), record) in sent.iter().zip(records) {
        let mut ce = case("kafka", "kafka", *format, record.headers, &record.payload);
        ce["key"] = json!(record.key);
        ce["expect"] = expected(message);
        cases.push(ce);
    }

    cases
}

/// RabbitMQ (the AMQP binding's application properties), both modes.
async fn amqp_cases() -> Vec<Value> {
    let mut cases = Vec::new();
    let queue = TestQueue::new().await;
    for format in FORMATS {
        let sink = RabbitSink::builder(amqp_uri(addr(common::brokers::RABBIT_ADDR)))
            .exchange(&queue.exchange)
            .build()
            .expect("rabbit sink");
        let mut sink = prepared(sink, format).await;
        let message = message(None);
        send(&mut sink, &message).await;
        let delivery = queue.drain().await.pop().expect("a delivery");
        let mut headers = HashMap::new();
        if let Some(table) = delivery.properties.headers() {
            for (name, value) in table.inner() {
                if let ordo::relay::rabbitmq::lapin::types::AMQPValue::LongString(text) = value {
                    headers.insert(name.to_string(), text.to_string());
                }
            }
        }
        let mut ce = case("amqp", "amqp", format, headers, &delivery.data);
        ce["content_type"] = json!(
            delivery
                .properties
                .content_type()
                .as_ref()
                .map(|t| t.to_string())
        );
        ce["expect"] = expected(&message);
        cases.push(ce);
    }

    cases
}

/// NATS, both modes.
async fn nats_cases() -> Vec<Value> {
    let mut cases = Vec::new();
    let stream = TestStream::new().await;
    for format in FORMATS {
        let sink = NatsSink::builder(NATS_ADDR)
            .subject_prefix(&stream.prefix)
            .build()
            .expect("nats sink");
        let mut sink = prepared(sink, format).await;
        let message = message(Some("customer 7"));
        send(&mut sink, &message).await;
        let stored = stream.messages().await.pop().expect("a message");
        let headers: HashMap<String, String> = stored
            .headers
            .iter()
            .filter_map(|(name, values)| Some((name.to_string(), values.first()?.to_string())))
            .collect();
        let mut ce = case("nats", "nats", format, headers, &stored.payload);
        ce["expect"] = expected(&message);
        cases.push(ce);
    }
    cases
}

/// Runs `tests/python/verify_envelopes.py` with `python` over `cases`: every one passes.
fn verify(python: PathBuf, cases: &[Value]) {
    let mut verifier = Command::new(python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/verify_envelopes.py"
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run the verifier");
    let input = serde_json::to_vec(cases).expect("the cases");
    verifier
        .stdin
        .take()
        .expect("its stdin")
        .write_all(&input)
        .expect("write the cases");
    let output = verifier.wait_with_output().expect("the verifier's verdict");
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the reference libraries refused: {said}"
    );
    assert!(
        said.contains(&format!("{} passed, 0 failed", cases.len())),
        "{said}"
    );
}
