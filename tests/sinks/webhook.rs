//! HTTP webhooks against a server the test runs (`common/http_responder.rs`).

use std::time::{Duration, SystemTime};

use ordo::relay::http::{WebhookSink, verify_signature};
use ordo::relay::{Message, Outcomes, SendError, Sink};

use super::common::http_responder::{Reply, Responder};
use super::{all_transient, batch, delivered, send};

const SECRET: &[u8] = b"whsec_ordo_test_secret";

fn sink(url: String) -> WebhookSink {
    WebhookSink::builder(url, SECRET.to_vec())
        .build()
        .expect("valid settings")
}

/// Sends one message and returns its result.
async fn one(sink: &mut WebhookSink) -> Result<(), SendError> {
    let mut results = send(sink, &batch(1)).await.expect("per-message results");
    results.pop().expect("one result")
}

#[tokio::test]
async fn webhook_posts_each_event_signed_so_the_receiver_can_verify_it() {
    let server = Responder::start(Vec::new()).await;
    let mut sink = sink(server.url("/hooks/orders"));
    let batch: Vec<Message> = batch(3)
        .into_iter()
        .zip(["k1", "k2", "k1"])
        .map(|(message, key)| message.with_key(Some(key)))
        .collect();
    let result = send(&mut sink, &batch).await;
    assert!(delivered(&result, 3), "{result:?}");

    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    for message in &batch {
        let id = message.id.to_string();
        let request = requests
            .iter()
            .find(|request| request.header("Ordo-Event-Id") == Some(id.as_str()))
            .expect("a request per event");
        assert_eq!(request.method, "POST");
        assert_eq!(request.path, "/hooks/orders");
        assert_eq!(request.body, message.payload.to_vec());
        assert_eq!(request.header("content-type"), Some("application/json"));
        assert_eq!(
            request.header("Ordo-Event-Type"),
            message.event_type.as_deref()
        );
        assert_eq!(request.header("Ordo-Key"), message.key.as_deref());
        let timestamp = request.header("Ordo-Timestamp").expect("a timestamp");
        let signature = request.header("Ordo-Signature").expect("a signature");
        assert!(verify_signature(
            SECRET,
            timestamp,
            &request.body,
            signature
        ));
        assert!(!verify_signature(
            b"another secret",
            timestamp,
            &request.body,
            signature
        ));
    }
    // One key's events arrive in batch order.
    let k1: Vec<&[u8]> = requests
        .iter()
        .filter(|request| request.header("Ordo-Key") == Some("k1"))
        .map(|request| request.body.as_slice())
        .collect();
    assert_eq!(k1, vec![&batch[0].payload[..], &batch[2].payload[..]]);
}

/// A key or type that is not ASCII goes as its UTF-8 bytes; one holding a control character,
/// which no HTTP header carries, is left out of that request alone, and the relay says so.
#[tokio::test]
async fn webhook_headers_carry_utf8_and_a_value_no_header_can_carry_is_left_out_and_said() {
    use tracing_subscriber::layer::SubscriberExt;

    let recorder = super::common::logs::Recorder::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(recorder.clone()));
    let server = Responder::start(Vec::new()).await;
    let mut sink = sink(server.url("/hooks/orders"));
    let batch: Vec<Message> = batch(2)
        .into_iter()
        .zip(["müller", "line\nbreak"])
        .map(|(message, key)| message.with_key(Some(key)))
        .collect();
    let result = send(&mut sink, &batch).await;
    assert!(delivered(&result, 2), "{result:?}");
    let requests = server.requests();
    let key_of = |message: &Message| {
        let id = message.id.to_string();
        requests
            .iter()
            .find(|request| request.header("Ordo-Event-Id") == Some(id.as_str()))
            .expect("a request per event")
            .header("Ordo-Key")
    };
    assert_eq!(key_of(&batch[0]), Some("müller"));
    assert_eq!(key_of(&batch[1]), None);
    let said: Vec<String> = recorder
        .events()
        .into_iter()
        .filter(|event| event.level == tracing::Level::WARN)
        .map(|event| event.fields)
        .collect();
    assert!(
        said.iter().any(|line| line.contains("Ordo-Key")
            && line.contains(&batch[1].id.to_string())
            && line.contains("left out")),
        "{said:#?}"
    );
}

#[tokio::test]
async fn webhook_answers_map_to_transient_or_permanent() {
    let in_a_minute = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(90));
    let script = vec![
        Reply::status(500),
        Reply::status(503),
        Reply::status(408),
        Reply::status(429).with_header("Retry-After", "7"),
        Reply::status(429).with_header("Retry-After", &in_a_minute),
        Reply::status(400),
        Reply::status(404),
        Reply::status(302).with_header("Location", "http://elsewhere.example/in"),
        Reply::status(204),
    ];
    let server = Responder::start(script).await;
    let mut sink = sink(server.url("/in"));

    // An answer about the request is the message's (an attempt), though the endpoint never
    // answered a 2xx: a 500 at once; a 503 or a 408 (which a gateway may give for every
    // request) once the URL answered its probe (a HEAD, 200 here).
    for status in [500, 503, 408] {
        let error = one(&mut sink).await.expect_err("not delivered");
        assert!(
            !error.is_unavailable() && !error.is_permanent(),
            "{status}: {error}"
        );
    }
    assert_eq!(
        server.probes(),
        2,
        "the 503 and the 408 were probed, the 500 not"
    );
    let error = one(&mut sink).await.expect_err("429");
    assert!(!error.is_permanent());
    assert_eq!(error.retry_after(), Some(Duration::from_secs(7)));
    let error = one(&mut sink).await.expect_err("429 with a date");
    let after = error.retry_after().expect("Retry-After as an HTTP date");
    assert!(
        after > Duration::from_secs(30) && after <= Duration::from_secs(90),
        "{after:?}"
    );

    for status in [400, 404, 302] {
        let error = one(&mut sink).await.expect_err("not delivered");
        assert!(error.is_permanent(), "{status}: {error}");
    }
    one(&mut sink).await.expect("204 is delivered");
}

/// A failure that does not say whose it is (a reset after the request was sent, a 503) is
/// the URL's outage when the URL does not answer its probe either: `Unavailable`, no attempt,
/// with the probe's answer in the error.
#[tokio::test]
async fn webhook_unclear_failure_is_the_urls_outage_when_its_probe_fails() {
    let server = Responder::with_rule(|request| {
        Some(match request.method.as_str() {
            "HEAD" => Reply::status(503),
            _ if request.body == br#"{"order_id":0}"# => Reply::reset(),
            _ => Reply::status(502),
        })
    })
    .await;
    let mut sink = sink(server.url("/in"));
    let results = send(&mut sink, &batch(2))
        .await
        .expect("per-message results");
    for result in results {
        let error = result.expect_err("not delivered");
        assert!(error.is_unavailable(), "{error}");
        assert!(error.message().contains("its probe: HEAD"), "{error}");
        assert!(error.message().contains("503"), "{error}");
    }
    assert!(server.probes() >= 1);
}

/// Under a relay (its deadline fitted), a request past its timeout counts as failed at once,
/// but stays open: the answer that comes before the deadline replaces the failure, and the
/// endpoint got one request.
#[tokio::test]
async fn webhook_slow_answer_within_the_deadline_replaces_its_timeout() {
    let server = Responder::start(vec![Reply::status(200).after(Duration::from_secs(1))]).await;
    let mut sink = WebhookSink::builder(server.url("/slow"), SECRET.to_vec())
        .timeout(Duration::from_millis(300))
        .build()
        .expect("valid settings");
    sink.fit_to_deadline(Duration::from_secs(5))
        .expect("a timeout within the deadline");
    let result = send(&mut sink, &batch(1)).await;
    assert!(delivered(&result, 1), "{result:?}");
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn webhook_slow_endpoint_is_a_transient_timeout() {
    let server = Responder::start(vec![Reply::status(200).after(Duration::from_secs(30))]).await;
    let mut sink = WebhookSink::builder(server.url("/slow"), SECRET.to_vec())
        .timeout(Duration::from_millis(300))
        .build()
        .expect("valid settings");
    let error = one(&mut sink).await.expect_err("timed out");
    assert!(!error.is_permanent(), "{error}");
    assert!(error.message().contains("timed out"), "{error}");
    // The next request gets the default 200.
    one(&mut sink)
        .await
        .expect("delivered once the endpoint answers");
}

#[tokio::test]
async fn webhook_failure_holds_back_the_rest_of_its_key_only() {
    let server = Responder::start(vec![Reply::status(500)]).await;
    let mut sink = WebhookSink::builder(server.url("/in"), SECRET.to_vec())
        // One key at a time, so the script's first answer goes to key a's first event.
        .concurrency(1)
        .build()
        .expect("valid settings");
    let batch: Vec<Message> = batch(3)
        .into_iter()
        .zip(["a", "a", "b"])
        .map(|(message, key)| message.with_key(Some(key)))
        .collect();
    let results = send(&mut sink, &batch).await.expect("per-message results");
    assert!(matches!(&results[0], Err(error) if !error.is_permanent()));
    // Not sent, and not charged: no outcome (the relay releases it without an attempt).
    assert!(matches!(&results[1], Err(error) if error.message() == "no outcome"));
    assert!(results[2].is_ok());
    // Key a's second event never reached the endpoint.
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn webhook_unreachable_endpoint_is_transient() {
    // A port that was just free: nothing listens there.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address").port()
    };
    let mut sink = sink(format!("http://127.0.0.1:{port}/in"));
    let result = send(&mut sink, &batch(2)).await;
    assert!(all_transient(&result), "{result:?}");
    sink.reset().await.expect("reset needs no connection");
}

/// A send cut short (as the relay's deadline does) leaves the answers already in: the fast
/// key-less messages are delivered, the one whose endpoint hangs has no outcome.
#[tokio::test]
async fn webhook_outcomes_in_hand_survive_a_cancelled_send() {
    let server = Responder::with_rule(|request| {
        let hangs = request.body == br#"{"order_id":1}"#;
        hangs.then(|| Reply::status(200).after(Duration::from_secs(30)))
    })
    .await;
    let mut sink = sink(server.url("/in"));
    let batch = batch(4);
    let mut outcomes = Outcomes::new(batch.len());
    let cut = tokio::time::timeout(Duration::from_secs(2), sink.send(&batch, &mut outcomes)).await;
    assert!(cut.is_err(), "the hanging request cannot have finished");
    assert!(outcomes.get(1).is_none(), "{outcomes:?}");
    for index in [0, 2, 3] {
        assert!(
            outcomes.get(index).is_some_and(Result::is_ok),
            "{outcomes:?}"
        );
    }
}

/// A port that was just free: nothing listens there.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").port()
}

#[tokio::test]
async fn webhook_refused_connection_says_it_was_refused() {
    let mut sink = sink(format!("http://127.0.0.1:{}/in", free_port()));
    let error = one(&mut sink).await.expect_err("nothing listens");
    assert!(
        error.is_unavailable(),
        "the URL's outage, not the message's: {error}"
    );
    assert!(
        error
            .message()
            .contains("was refused (nothing listens there)"),
        "{error}"
    );
}

#[tokio::test]
async fn webhook_tls_handshake_against_a_plain_tcp_server_says_tls() {
    // A plain TCP server that answers every connection with plain HTTP at once: what a
    // TLS client meets at an https:// URL that serves no TLS.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("address").port();
    let server = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        while let Ok((mut stream, _)) = listener.accept().await {
            let _ = stream
                .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                .await;
        }
    });
    let mut sink = sink(format!("https://127.0.0.1:{port}/in"));
    let error = one(&mut sink).await.expect_err("no TLS there");
    server.abort();
    assert!(!error.is_permanent(), "{error}");
    assert!(error.is_unavailable(), "the URL's outage: {error}");
    assert!(
        error.message().contains("failed in the TLS handshake"),
        "{error}"
    );
    assert!(
        !error.message().contains("refused"),
        "a handshake failure is not a refusal: {error}"
    );
}

#[tokio::test]
async fn webhook_answer_over_the_body_limit_says_so() {
    let script = vec![
        Reply::status(200).with_body(vec![b'y'; 200_000]),
        Reply::status(500).with_body(vec![b'x'; 100_000]),
        Reply::status(400).with_body("bad \u{1b}[31msignature\n".as_bytes()),
        Reply::status(422).with_body(vec![b'z'; 2_000]),
    ];
    let server = Responder::start(script).await;
    let mut sink = WebhookSink::builder(server.url("/in"), SECRET.to_vec())
        .max_response_bytes(1_000)
        .build()
        .expect("valid settings");
    // A 2xx took the event, whatever it answered with.
    one(&mut sink).await.expect("a 2xx is delivered");
    let error = one(&mut sink).await.expect_err("500");
    assert!(!error.is_permanent(), "{error}");
    assert!(
        error
            .message()
            .contains("over the sink's limit of 1000 bytes (100000 bytes; not read)"),
        "{error}"
    );
    // A body within the limit is quoted, escaped, in the error.
    let error = one(&mut sink).await.expect_err("400");
    assert!(error.is_permanent(), "{error}");
    assert!(
        error.message().contains(r#": "bad \u{1b}[31msignature\n""#),
        "{error}"
    );
    let error = one(&mut sink).await.expect_err("422");
    assert!(error.message().contains("over the sink's limit"), "{error}");
}

#[tokio::test]
async fn webhook_relative_redirect_is_reported_with_its_target() {
    let script = vec![
        Reply::status(308).with_header("Location", "/v2/in?token=secret"),
        Reply::status(301).with_header("Location", "other"),
    ];
    let server = Responder::start(script).await;
    let mut sink = sink(server.url("/hooks/in"));
    let error = one(&mut sink).await.expect_err("a redirect");
    assert!(error.is_permanent(), "{error}");
    let target = server.url("/v2/in");
    assert!(
        error
            .message()
            .contains(&format!("to {target} (Location \"/v2/in\")")),
        "{error}"
    );
    assert!(!error.message().contains("secret"), "{error}");
    let error = one(&mut sink).await.expect_err("a redirect");
    assert!(
        error.message().contains(&server.url("/hooks/other")),
        "{error}"
    );
}
