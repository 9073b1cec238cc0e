//! Blame that does not depend on traffic (`docs/relays.md`, "The failure model"). One event
//! that fails while nothing else is in flight is judged by what the sink said about it (a
//! webhook's `500`, a connection reset after its request was sent, an answer that does not
//! parse or is too large, a JetStream refusal of that message): its attempts are counted in
//! `ordo.relay_attempts`, it is parked after `max_attempts`, and the sink is never shown down.
//! The same among healthy traffic. A real outage (a cut or black-holed link, a deleted stream)
//! is still an outage: nothing counted, nothing parked, over by itself. And an endpoint that
//! answers slower than the request timeout is not sent the event again while it holds the
//! request.
//!
//! Against an HTTP server the test runs and the real NATS JetStream. "Never shown down" is
//! read from the log line the relay writes whenever it judges its sink down (a process-wide
//! recorder, hence a test binary of its own) and from the relay's status and stored row.
#![cfg(all(feature = "nats", feature = "rabbitmq", feature = "http"))]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::brokers::{NATS_ADDR, RABBIT_ADDR, TestQueue, TestStream, addr, amqp_uri, nats_url};
use common::http_responder::{Reply, Request, Responder};
use common::keyed::{Parcel, publish};
use common::logs::Recorder;
use common::relays::{config, keys};
use common::subscribers::PATIENCE;
use common::tcp_fault::{Fault, TcpFault};
use common::{TestDb, eventually};
use ordo::relay::http::WebhookSink;
use ordo::relay::nats::NatsSink;
use ordo::relay::nats::async_nats::jetstream::stream::DiscardPolicy;
use ordo::relay::rabbitmq::RabbitSink;
use ordo::relay::{OnParked, RelayConfig, Sink};
use ordo::{Outbox, OutboxConfig, SubscriptionHandle};
use sqlx::PgPool;

const SECRET: &[u8] = b"a webhook secret";
/// Small, so that a blamed event parks within a few sends.
const MAX_ATTEMPTS: u32 = 3;

/// Every event ordo logs in this binary.
fn logs() -> &'static Recorder {
    static LOGS: OnceLock<Recorder> = OnceLock::new();
    LOGS.get_or_init(|| {
        use tracing_subscriber::layer::SubscriberExt;
        let recorder = Recorder::default();
        tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(recorder.clone()),
        )
        .expect("the only subscriber of this binary");
        recorder
    })
}

/// The relay's "the sink is down" lines so far: one at the start of every outage.
fn shown_down(relay: &str) -> Vec<String> {
    let named = format!("relay={relay} ");
    logs()
        .events()
        .into_iter()
        .filter(|event| event.fields.contains("the sink is down") && event.fields.contains(&named))
        .map(|event| event.fields)
        .collect()
}

async fn outbox(db: &TestDb) -> Outbox<Parcel> {
    logs();
    Outbox::<Parcel>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox")
}

/// The relay's settings for these tests: few attempts, and a parked event's keys go on.
fn blaming(name: &str) -> RelayConfig {
    config(name)
        .max_attempts(MAX_ATTEMPTS)
        .on_parked(OnParked::Continue)
}

fn parcel_of(request: &Request) -> Option<Parcel> {
    serde_json::from_slice(&request.body).ok()
}

/// A relay posting every event to `url`.
async fn webhook_relay(outbox: &Outbox<Parcel>, url: String, name: &str) -> SubscriptionHandle {
    let sink = WebhookSink::builder(url, SECRET).build().expect("sink");
    relay(outbox, blaming(name), sink).await
}

async fn relay(
    outbox: &Outbox<Parcel>,
    config: RelayConfig,
    sink: impl Sink,
) -> SubscriptionHandle {
    outbox.relay(config, sink, keys).await.expect("relay")
}

/// The failed attempts of the relay's event at `position`, as (attempt, parked, error).
async fn attempts(pool: &PgPool, relay: &str, position: i64) -> Vec<(i32, bool, String)> {
    sqlx::query_as(
        "SELECT attempt, parked, error FROM ordo.relay_attempts \
         WHERE relay = $1 AND position = $2 ORDER BY id",
    )
    .bind(relay)
    .bind(position)
    .fetch_all(pool)
    .await
    .expect("attempts")
}

/// Waits until the event at `position` is parked, and checks that it was after `MAX_ATTEMPTS`
/// attempts, each in the history; returns the errors.
async fn parked_after_its_attempts(
    db: &TestDb,
    relay: &SubscriptionHandle,
    name: &str,
    position: u64,
) -> Vec<String> {
    let (status, parked) = relay
        .wait_for(PATIENCE, |status| {
            status
                .stalled
                .iter()
                .any(|key| key.position.get() == position)
        })
        .await;
    assert!(parked, "event {position} was never parked: {status:?}");
    let key = status
        .stalled
        .iter()
        .find(|key| key.position.get() == position)
        .expect("parked");
    assert_eq!(key.attempts, MAX_ATTEMPTS, "{status:?}");
    let all = eventually(PATIENCE, || async {
        attempts(&db.pool, name, position as i64).await.len() >= MAX_ATTEMPTS as usize
    })
    .await;
    let history = attempts(&db.pool, name, position as i64).await;
    assert!(all, "{history:?}");
    let numbers: Vec<(i32, bool)> = history.iter().map(|(n, parked, _)| (*n, *parked)).collect();
    assert_eq!(
        numbers,
        vec![(1, false), (2, false), (3, true)],
        "{history:?}"
    );
    history.into_iter().map(|(_, _, error)| error).collect()
}

/// The relay never judged its sink down, and neither its handle nor its stored row says so.
async fn never_shown_down(db: &TestDb, relay: &SubscriptionHandle, name: &str) {
    assert_eq!(shown_down(name), Vec::<String>::new());
    assert_eq!(relay.status().sink_down, None, "{:?}", relay.status());
    let status = ordo::admin::status(&db.pool).await.expect("status");
    let row = status
        .subscriptions
        .iter()
        .find(|sub| sub.name == name)
        .expect("the relay's row");
    assert_eq!(row.sink_down, None, "{row:?}");
}

/// How many requests carried parcel `id`.
fn sends_of(endpoint: &Responder, id: u32) -> usize {
    endpoint
        .requests()
        .iter()
        .filter(|request| parcel_of(request).is_some_and(|parcel| parcel.id == id))
        .count()
}

/// One event alone, answered by `reply`: counted, parked after its attempts, each attempt one
/// request, the sink never shown down. Returns the errors of its attempts.
async fn a_lone_event_answered(name: &str, reply: Reply) -> Vec<String> {
    let db = TestDb::new().await;
    let outbox = outbox(&db).await;
    let endpoint = Responder::with_rule(move |request| {
        let bad = parcel_of(request).is_some_and(|parcel| parcel.id == 7);
        bad.then(|| reply.clone())
    })
    .await;
    let relay = webhook_relay(&outbox, endpoint.url("/in"), name).await;
    publish(&outbox, [Parcel::new(7, &["bad"])]).await;
    let errors = parked_after_its_attempts(&db, &relay, name, 1).await;
    assert_eq!(sends_of(&endpoint, 7), MAX_ATTEMPTS as usize);
    never_shown_down(&db, &relay, name).await;
    relay.shutdown().await;
    errors
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_event_answered_500_is_counted_and_parked_and_the_sink_never_shown_down() {
    let errors = a_lone_event_answered("lone-500", Reply::status(500)).await;
    assert!(
        errors.iter().all(|error| error.contains("500")),
        "{errors:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_event_whose_connection_is_reset_after_its_request_is_counted_and_parked() {
    let errors = a_lone_event_answered("lone-reset", Reply::reset()).await;
    assert!(
        errors
            .iter()
            .all(|error| error.contains("failed after it was sent")),
        "{errors:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_event_answered_with_bytes_that_are_no_http_is_counted_and_parked() {
    let garbage = Reply::raw(&b"this is not HTTP\r\n\r\n"[..]);
    let errors = a_lone_event_answered("lone-garbage", garbage).await;
    assert!(
        errors.iter().all(|error| error.contains("POST")),
        "{errors:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_event_answered_with_a_head_too_large_to_read_is_counted_and_parked() {
    // A 200 whose head passes what the client reads (about 400 kB): never a readable answer.
    let mut head = b"HTTP/1.1 200 OK\r\nx-padding: ".to_vec();
    head.extend(std::iter::repeat_n(b'a', 1 << 20));
    head.extend_from_slice(b"\r\ncontent-length: 0\r\n\r\n");
    a_lone_event_answered("lone-oversized", Reply::raw(head)).await;
}

/// A stream that holds one message per subject and refuses the next (`discard: new` per
/// subject): a refusal of that message, not of the stream. The sink publishes each event on
/// `{prefix}.{its key}`.
async fn one_per_subject() -> (TestStream, NatsSink) {
    let stream = TestStream::with_config(|config| {
        config.max_messages_per_subject = 1;
        config.discard = DiscardPolicy::New;
        config.discard_new_per_subject = true;
    })
    .await;
    let prefix = stream.prefix.clone();
    let sink = NatsSink::builder(nats_url(addr(NATS_ADDR)))
        .subject(move |message| format!("{prefix}.{}", message.key.as_deref().unwrap_or("none")))
        .stream(&stream.name)
        .build()
        .expect("sink");
    // Subject `full` holds its one message already.
    stream.publish("full", &[], "{}").await;
    (stream, sink)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_event_the_stream_refuses_is_counted_and_parked() {
    let db = TestDb::new().await;
    let outbox = outbox(&db).await;
    let (stream, sink) = one_per_subject().await;
    let name = "lone-refused";
    let relay = relay(&outbox, blaming(name), sink).await;
    publish(&outbox, [Parcel::new(7, &["full"])]).await;
    let errors = parked_after_its_attempts(&db, &relay, name, 1).await;
    assert!(
        errors
            .iter()
            .all(|error| error.contains("maximum messages per subject exceeded")),
        "{errors:?}"
    );
    never_shown_down(&db, &relay, name).await;
    relay.shutdown().await;
    assert_eq!(
        stream.len().await,
        1,
        "only the message that filled the subject"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_event_the_broker_nacks_is_counted_and_parked() {
    let db = TestDb::new().await;
    let outbox = outbox(&db).await;
    let queue = TestQueue::refusing().await;
    let sink = RabbitSink::builder(amqp_uri(addr(RABBIT_ADDR)))
        .exchange(&queue.exchange)
        .build()
        .expect("sink");
    let name = "lone-nacked";
    let relay = relay(&outbox, blaming(name), sink).await;
    publish(&outbox, [Parcel::new(7, &["bad"])]).await;
    let errors = parked_after_its_attempts(&db, &relay, name, 1).await;
    assert!(
        errors.iter().all(|error| error.contains("nacked")),
        "{errors:?}"
    );
    never_shown_down(&db, &relay, name).await;
    relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_answered_500_among_healthy_traffic_is_parked_and_every_other_delivered_once() {
    let db = TestDb::new().await;
    let outbox = outbox(&db).await;
    let endpoint = Responder::with_rule(|request| {
        let bad = parcel_of(request).is_some_and(|parcel| parcel.id == 7);
        bad.then(|| Reply::status(500))
    })
    .await;
    let name = "500-among-others";
    let relay = webhook_relay(&outbox, endpoint.url("/in"), name).await;
    publish(
        &outbox,
        (0..20).map(|id| Parcel::new(id, &[&format!("k{id}")])),
    )
    .await;
    parked_after_its_attempts(&db, &relay, name, 8).await;
    let others = eventually(PATIENCE, || async {
        endpoint.sends_per_event().len() >= 20
    })
    .await;
    assert!(others, "{:?}", endpoint.sends_per_event());
    relay.shutdown().await;
    for id in (0..20).filter(|id| *id != 7) {
        assert_eq!(sends_of(&endpoint, id), 1, "parcel {id}");
    }
    assert_eq!(sends_of(&endpoint, 7), MAX_ATTEMPTS as usize);
    never_shown_down(&db, &relay, name).await;
}

/// An event's requests are counted in `ordo.relay_attempts` (none for one delivered).
async fn no_attempts(pool: &PgPool, relay: &str, position: i64) -> bool {
    attempts(pool, relay, position).await.is_empty()
}

/// Waits until the relay shows its sink down; then nothing it holds was charged an attempt.
async fn shown_down_charging_nothing(
    db: &TestDb,
    relay: &SubscriptionHandle,
    name: &str,
    position: i64,
) {
    let (status, down) = relay
        .wait_for(PATIENCE, |status| status.sink_down.is_some())
        .await;
    assert!(down, "the outage was never shown: {status:?}");
    assert!(no_attempts(&db.pool, name, position).await);
    assert_eq!(
        status.stalled.len(),
        1,
        "only the event parked before: {status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_or_black_holed_endpoint_is_still_an_outage_beside_a_parked_event() {
    let db = TestDb::new().await;
    let outbox = outbox(&db).await;
    // Set while the link is faulty and until the held event is through: the endpoint then
    // answers its probe 503. The fault itself keeps every probe from reaching it meanwhile;
    // this only spares the request that failed just before the link came back and is probed
    // just after, which would be blamed (one attempt: `docs/relays.md`, "The failure model").
    let recovering = Arc::new(AtomicBool::new(false));
    let says_down = Arc::clone(&recovering);
    let endpoint = Responder::with_rule(move |request| {
        if request.method == "HEAD" {
            return says_down.load(Ordering::SeqCst).then(|| Reply::status(503));
        }
        let bad = parcel_of(request).is_some_and(|parcel| parcel.id == 7);
        bad.then(|| Reply::status(500))
    })
    .await;
    let proxy = TcpFault::start(
        endpoint
            .url("")
            .trim_start_matches("http://")
            .parse()
            .expect("the endpoint's address"),
    )
    .await;
    let name = "outage-beside-parked";
    let relay = webhook_relay(&outbox, format!("http://{}/in", proxy.addr()), name).await;
    publish(&outbox, [Parcel::new(7, &["bad"])]).await;
    parked_after_its_attempts(&db, &relay, name, 1).await;
    never_shown_down(&db, &relay, name).await;

    // Every connection closed as soon as it opens: an outage, whatever the event.
    recovering.store(true, Ordering::SeqCst);
    proxy.set(Fault::Cut);
    publish(&outbox, [Parcel::new(8, &["k8"])]).await;
    shown_down_charging_nothing(&db, &relay, name, 2).await;
    proxy.set(Fault::Pass);
    let delivered = eventually(PATIENCE, || async { sends_of(&endpoint, 8) >= 1 }).await;
    assert!(delivered, "parcel 8 never reached the endpoint");
    recovering.store(false, Ordering::SeqCst);
    let (status, up) = relay
        .wait_for(PATIENCE, |status| status.sink_down.is_none())
        .await;
    assert!(up, "{status:?}");

    // Nothing answered at all: the request times out, and so does the probe.
    recovering.store(true, Ordering::SeqCst);
    proxy.set(Fault::BlackHole);
    publish(&outbox, [Parcel::new(9, &["k9"])]).await;
    shown_down_charging_nothing(&db, &relay, name, 3).await;
    proxy.set(Fault::Pass);
    let delivered = eventually(PATIENCE, || async { sends_of(&endpoint, 9) >= 1 }).await;
    assert!(delivered, "parcel 9 never reached the endpoint");
    recovering.store(false, Ordering::SeqCst);
    let (status, up) = relay
        .wait_for(PATIENCE, |status| status.sink_down.is_none())
        .await;
    assert!(up, "{status:?}");
    relay.shutdown().await;
    assert!(no_attempts(&db.pool, name, 2).await && no_attempts(&db.pool, name, 3).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_event_among_traffic_parks_and_a_deleted_stream_is_still_an_outage() {
    let db = TestDb::new().await;
    let outbox = outbox(&db).await;
    let (stream, sink) = one_per_subject().await;
    let name = "refused-then-deleted";
    let relay = relay(&outbox, blaming(name), sink).await;
    // Parcel 7 goes to the full subject, each other one to a subject of its own.
    publish(
        &outbox,
        (0..20).map(|id| {
            let key = if id == 7 {
                "full".to_owned()
            } else {
                format!("k{id}")
            };
            Parcel::new(id, &[&key])
        }),
    )
    .await;
    parked_after_its_attempts(&db, &relay, name, 8).await;
    let others = eventually(PATIENCE, || async { stream.len().await >= 20 }).await;
    assert!(others, "{} messages in the stream", stream.len().await);
    never_shown_down(&db, &relay, name).await;

    stream.delete().await;
    publish(&outbox, [Parcel::new(20, &["k20"])]).await;
    shown_down_charging_nothing(&db, &relay, name, 21).await;
    stream.restore().await;
    let delivered = eventually(PATIENCE, || async { stream.len().await >= 1 }).await;
    assert!(delivered, "parcel 20 never reached the restored stream");
    let (status, up) = relay
        .wait_for(PATIENCE, |status| status.sink_down.is_none())
        .await;
    assert!(up, "{status:?}");
    relay.shutdown().await;
    assert!(no_attempts(&db.pool, name, 21).await);
}

/// An endpoint that answers 200 after longer than the request timeout (derived: half the
/// 4 s batch deadline) but within the deadline: the relay awaits the answer on the open
/// request and never sends the event again meanwhile; it is delivered, with no attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_endpoint_is_not_sent_the_event_again_while_it_holds_the_request() {
    let db = TestDb::new().await;
    let outbox = outbox(&db).await;
    let endpoint = Responder::with_rule(|request| {
        let slow = parcel_of(request).is_some_and(|parcel| parcel.id == 7);
        slow.then(|| Reply::status(200).after(Duration::from_secs(3)))
    })
    .await;
    let name = "slow-but-answers";
    let sink = WebhookSink::builder(endpoint.url("/in"), SECRET)
        .build()
        .expect("sink");
    let config = blaming(name)
        .batch_deadline(Duration::from_secs(4))
        .lease(Duration::from_secs(10));
    let relay = relay(&outbox, config, sink).await;
    publish(&outbox, [Parcel::new(7, &["slow"])]).await;
    let (status, delivered) = relay
        .wait_for(PATIENCE, |status| status.position.get() >= 1)
        .await;
    assert!(delivered, "{status:?}");
    assert_eq!(
        sends_of(&endpoint, 7),
        1,
        "sent again while its request was open"
    );
    assert!(no_attempts(&db.pool, name, 1).await);
    never_shown_down(&db, &relay, name).await;
    relay.shutdown().await;
}
