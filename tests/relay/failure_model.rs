//! The relays' failure model (`docs/relays.md`, "The failure model"), against an HTTP
//! server the test runs and the real NATS JetStream: outcomes in hand survive the batch
//! deadline, a message that never answers is blamed (never re-sent for ever), a panic in user
//! code is its event's permanent failure, one key-less message's failure charges no other, and
//! a sink that is down is an outage (no attempt, nothing parked) that ends by itself.
//!
//! Sends per event are counted at the receiver; no assertion is on timing.
#![cfg(all(feature = "nats", feature = "rabbitmq", feature = "http"))]

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::brokers::{TestQueue, TestStream, amqp_uri, nats_url};
use common::http_responder::{Reply, Request, Responder};
use common::keyed::{Parcel, publish};
use common::relays::{config, head, keys, relayed};
use common::subscribers::PATIENCE;
use common::{TestDb, eventually};
use ordo::relay::http::WebhookSink;
use ordo::relay::nats::NatsSink;
use ordo::relay::rabbitmq::RabbitSink;
use ordo::relay::{Message, OnParked, Outcomes, RelayConfig, SendError, Sink};
use ordo::{Outbox, OutboxConfig, SubscriptionHandle};
use sqlx::PgPool;

const SECRET: &[u8] = b"a webhook secret";

/// The parcel a request carries.
fn parcel_of(request: &Request) -> Option<Parcel> {
    serde_json::from_slice(&request.body).ok()
}

fn keyless(from: u32, count: u32) -> impl Iterator<Item = Parcel> {
    (from..from + count).map(|id| Parcel::new(id, &[]))
}

/// Publishes `parcels` in one transaction: they are committed, so read and batched, together.
async fn publish_together(outbox: &Outbox<Parcel>, parcels: impl IntoIterator<Item = Parcel>) {
    let mut tx = outbox.begin().await.expect("begin");
    for parcel in parcels {
        tx.publish(parcel).expect("publish");
    }
    tx.commit().await.expect("commit");
}

/// Publishes one event at a time, each on a key of its own (ids from `after` + 1), until the
/// relay parks something: other traffic beside a failing message (its blame does not depend
/// on it: `tests/relay_blame.rs`). False if nothing was parked within the patience.
async fn trickle_until_parked(
    outbox: &Outbox<Parcel>,
    relay: &SubscriptionHandle,
    after: u32,
) -> bool {
    let mut next = after;
    eventually(PATIENCE, || {
        let status = relay.status();
        next += 1;
        let id = next;
        async move {
            if !status.stalled.is_empty() {
                return true;
            }
            publish(outbox, [Parcel::new(id, &[&format!("k{id}")])]).await;
            false
        }
    })
    .await
}

async fn outbox(db: &TestDb) -> Outbox<Parcel> {
    Outbox::<Parcel>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox")
}

/// The events of `relay` charged an attempt, as (position, attempts, state), while no
/// watermark has passed them (their rows are kept until it does).
async fn charged(pool: &PgPool, relay: &str) -> Vec<(i64, i32, String)> {
    sqlx::query_as(
        "SELECT position, attempts, state FROM ordo.subscription_progress \
         WHERE subscription = $1 AND attempts > 0 ORDER BY position",
    )
    .bind(relay)
    .fetch_all(pool)
    .await
    .expect("progress rows")
}

/// Waits until `relay` has a parked event, and returns its (position, attempts).
async fn parked(relay: &SubscriptionHandle) -> (u64, u32) {
    let (status, found) = relay
        .wait_for(PATIENCE, |status| !status.stalled.is_empty())
        .await;
    assert!(found, "nothing was parked: {status:?}");
    let key = &status.stalled[0];
    (key.position.get(), key.attempts)
}

/// An endpoint that answers each POST slowly, one request at a
/// time: a batch cannot finish within its deadline. What it answered before the deadline is
/// kept (delivered), only the rest is released, and the relay reaches the head with each event
/// sent a bounded number of times, no attempt counted (one would park: `max_attempts(1)`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_in_hand_when_the_deadline_expires_are_kept_and_the_relay_reaches_the_head() {
    let db = TestDb::new().await;
    let outbox = outbox(&db).await;
    let endpoint =
        Responder::with_rule(|_| Some(Reply::status(200).after(Duration::from_millis(100)))).await;
    // One request at a time: a batch of 20 takes 2 s, past the 600 ms deadline.
    let sink = WebhookSink::builder(endpoint.url("/slow"), SECRET)
        .concurrency(1)
        .build()
        .expect("sink");
    let relay = outbox
        .relay(config("keeps-answers").max_attempts(1), sink, keys)
        .await
        .expect("relay");
    publish_together(&outbox, keyless(0, 40)).await;
    relayed(&relay, &db.pool, 40).await;
    assert!(relay.status().stalled.is_empty(), "{:?}", relay.status());
    relay.shutdown().await;

    let sends = endpoint.sends_per_event();
    assert_eq!(sends.len(), 40, "every event reached the endpoint");
    // Bound (docs/relays.md): ⌈log₂ batch_size⌉ + 1 = 6 sends for a batch size of 20.
    let most = sends.values().copied().max().unwrap_or(0);
    assert!(most <= 6, "an event was sent {most} times: {sends:?}");
}

/// One event's endpoint never answers; the others of its batch
/// answer at once. They are delivered once each; the hanging event is blamed by its own
/// request timeout (derived from the deadline) and parks after the maximum attempts, holding
/// its key only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_never_answers_is_blamed_and_parks_while_its_batch_is_delivered_once() {
    let db = TestDb::new().await;
    let outbox = outbox(&db).await;
    let endpoint = Responder::with_rule(|request| {
        let hangs = parcel_of(request).is_some_and(|parcel| parcel.id == 0);
        hangs.then(|| Reply::status(200).after(PATIENCE * 3))
    })
    .await;
    let sink = WebhookSink::builder(endpoint.url("/hooks"), SECRET)
        .build()
        .expect("sink");
    let name = "hanging-one";
    let relay = outbox
        .relay(config(name).max_attempts(2), sink, keys)
        .await
        .expect("relay");
    // The hanging event first (position 1: it holds the watermark, so every progress row stays
    // to be read), then the others, each on a key of its own.
    publish(&outbox, [Parcel::new(0, &["hangs"])]).await;
    publish(
        &outbox,
        (1..20).map(|id| Parcel::new(id, &[&format!("k{id}")])),
    )
    .await;
    // Deliveries go on beside it meanwhile (its blame does not depend on them): a trickle.
    let blamed = trickle_until_parked(&outbox, &relay, 20).await;
    assert!(
        blamed,
        "the hanging event was never parked: {:?}",
        relay.status()
    );
    let (position, attempts) = parked(&relay).await;
    assert_eq!((position, attempts), (1, 2));
    let others = eventually(PATIENCE, || async {
        endpoint.sends_per_event().len() as u64 >= head(&db.pool).await
    })
    .await;
    assert!(others, "not every event reached the endpoint");
    relay.shutdown().await;

    let sends = endpoint.sends_per_event();
    let hanging = endpoint
        .requests()
        .iter()
        .find(|request| parcel_of(request).is_some_and(|parcel| parcel.id == 0))
        .and_then(|request| request.header("Ordo-Event-Id").map(str::to_owned))
        .expect("the hanging event was sent");
    for (id, count) in &sends {
        if *id != hanging {
            assert_eq!(*count, 1, "event {id} was sent {count} times");
        }
    }
    let rows = charged(&db.pool, name).await;
    assert_eq!(
        rows,
        vec![(1, 2, "stalled".to_owned())],
        "only the hanging event is charged"
    );
}

/// A `route` function that panics on one event: that event is parked
/// at once (a permanent failure, one attempt) and never posted; every other event is posted
/// exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_that_panics_on_one_event_parks_that_event_and_spares_the_others() {
    let db = TestDb::new().await;
    let outbox = outbox(&db).await;
    let endpoint = Responder::start(Vec::new()).await;
    let url = endpoint.url("/routed");
    let sink = WebhookSink::builder(url.clone(), SECRET)
        .route(move |message| {
            let parcel: Parcel = serde_json::from_slice(&message.payload).expect("a parcel");
            assert_ne!(parcel.id, 7, "no route for parcel 7");
            url.clone()
        })
        .build()
        .expect("sink");
    let relay = outbox
        .relay(
            config("panicking-route").on_parked(OnParked::Continue),
            sink,
            keys,
        )
        .await
        .expect("relay");
    publish(&outbox, keyless(0, 40)).await;
    let (position, attempts) = parked(&relay).await;
    assert_eq!((position, attempts), (8, 1), "parcel 7 parked at once");
    let all = eventually(PATIENCE, || async {
        endpoint.sends_per_event().len() >= 39
    })
    .await;
    assert!(
        all,
        "{} of 39 events posted",
        endpoint.sends_per_event().len()
    );
    relay.shutdown().await;
    let sends = endpoint.sends_per_event();
    assert!(sends.values().all(|count| *count == 1), "{sends:?}");
    assert_eq!(sends.len(), 39, "parcel 7 was never posted");
}

/// A key function that panics on one event parks that event (one attempt)
/// instead of stopping the relay; every other event is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_function_that_panics_on_one_event_parks_that_event_only() {
    let db = TestDb::new().await;
    let outbox = outbox(&db).await;
    let endpoint = Responder::start(Vec::new()).await;
    let sink = WebhookSink::builder(endpoint.url("/keyed"), SECRET)
        .build()
        .expect("sink");
    let relay = outbox
        .relay(
            config("panicking-key").on_parked(OnParked::Continue),
            sink,
            |event: &ordo::Envelope<Parcel>| {
                assert_ne!(event.payload.id, 3, "no key for parcel 3");
                keys(event)
            },
        )
        .await
        .expect("relay");
    publish(
        &outbox,
        (0..20).map(|id| Parcel::new(id, &[&format!("k{}", id % 4)])),
    )
    .await;
    let (position, attempts) = parked(&relay).await;
    assert_eq!((position, attempts), (4, 1), "parcel 3 parked at once");
    let all = eventually(PATIENCE, || async {
        endpoint.sends_per_event().len() >= 19
    })
    .await;
    assert!(
        all,
        "{} of 19 events delivered",
        endpoint.sends_per_event().len()
    );
    relay.shutdown().await;
}

/// A key-less batch in which one event is answered 400: that event
/// is parked (permanent); no other event is charged an attempt, and each is posted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_keyless_message_refused_charges_no_other() {
    let db = TestDb::new().await;
    let outbox = outbox(&db).await;
    let endpoint = Responder::with_rule(|request| {
        let refused = parcel_of(request).is_some_and(|parcel| parcel.id == 0);
        refused.then(|| Reply::status(400))
    })
    .await;
    let sink = WebhookSink::builder(endpoint.url("/refuses-one"), SECRET)
        .build()
        .expect("sink");
    let name = "refused-one";
    let relay = outbox
        .relay(config(name).on_parked(OnParked::Continue), sink, keys)
        .await
        .expect("relay");
    // One batch: the refused event first, the others behind it.
    publish_together(&outbox, keyless(0, 20)).await;
    let (position, attempts) = parked(&relay).await;
    assert_eq!((position, attempts), (1, 1));
    let all = eventually(PATIENCE, || async {
        endpoint.sends_per_event().len() >= 20
    })
    .await;
    assert!(
        all,
        "{} of 20 events posted",
        endpoint.sends_per_event().len()
    );
    // The parked event holds the watermark at 0: every other event's row is still there.
    let done = eventually(PATIENCE, || async {
        let rows: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM ordo.subscription_progress WHERE subscription = $1 AND state = 'done'",
        )
        .bind(name)
        .fetch_one(&db.pool)
        .await
        .expect("rows");
        rows == 19
    })
    .await;
    assert!(done, "the other 19 events were not all recorded delivered");
    relay.shutdown().await;
    assert_eq!(
        charged(&db.pool, name).await,
        vec![(1, 1, "stalled".to_owned())]
    );
    let sends = endpoint.sends_per_event();
    assert!(sends.values().all(|count| *count == 1), "{sends:?}");
}

/// A sink timeout at or past the batch deadline is refused when the
/// relay starts, naming both settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_timeout_at_or_past_the_batch_deadline_is_refused_naming_both() {
    let db = TestDb::new().await;
    let outbox = outbox(&db).await;
    let sink = WebhookSink::builder("http://127.0.0.1:9/never", SECRET)
        .timeout(Duration::from_secs(20))
        .build()
        .expect("sink");
    let config = RelayConfig::new("too-patient").batch_deadline(Duration::from_secs(5));
    let refused = outbox.relay(config, sink, keys).await.map(drop);
    match refused {
        Err(ordo::Error::InvalidConfig { setting, reason }) => {
            assert_eq!(setting, "webhook timeout/batch_deadline");
            assert!(reason.contains("20s") && reason.contains("5s"), "{reason}");
        }
        other => panic!("accepted a 20 s request timeout under a 5 s deadline: {other:?}"),
    }
}

/// The relay's NATS stream is deleted while events keep
/// coming, then created again: no attempt is counted and nothing parked (one attempt would
/// park: `max_attempts(1)`), the status says the sink is down meanwhile, and every event is
/// delivered once the stream is back, with no operator command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_stream_is_an_outage_that_parks_nothing_and_ends_by_itself() {
    let db = TestDb::new().await;
    let outbox = outbox(&db).await;
    let stream = TestStream::new().await;
    let sink = NatsSink::builder(nats_url(common::brokers::addr(common::brokers::NATS_ADDR)))
        .subject_prefix(&stream.prefix)
        .build()
        .expect("sink");
    let relay = outbox
        .relay(config("stream-outage").max_attempts(1), sink, keys)
        .await
        .expect("relay");
    publish(&outbox, common::relays::parcels(0, 20)).await;
    relayed(&relay, &db.pool, 20).await;

    stream.delete().await;
    publish(&outbox, common::relays::parcels(20, 20)).await;
    let (status, down) = relay
        .wait_for(PATIENCE, |status| {
            status
                .last_error
                .as_deref()
                .is_some_and(|error| error.contains("sink down since"))
        })
        .await;
    assert!(down, "the status never said the sink is down: {status:?}");
    assert!(status.stalled.is_empty(), "an outage parked: {status:?}");

    stream.restore().await;
    relayed(&relay, &db.pool, 40).await;
    let status = relay.status();
    assert!(status.stalled.is_empty(), "{status:?}");
    assert_eq!(status.last_error, None, "the sink is up again: {status:?}");
    relay.shutdown().await;
    // The restored stream holds what was published after it came back: the 20 of the outage.
    assert_eq!(stream.len().await, 20);
}

/// A sink of the user's that never answers for one message (no timeout of its own) and
/// delivers every other at once. Each batch it holds is cut by the deadline; the outcomes in
/// hand are kept, and the silent message's next batch is halved until, alone, it counts an
/// attempt: it parks after the maximum, sent no more than the documented bound
/// `⌈log₂ batch_size⌉ + max_attempts` times. Two sinks, so that deliveries go on beside it;
/// alone, the sink's probe (the default: it answers) makes its silence its own.
struct Silent {
    silent_on: u64,
    sends: Arc<Mutex<HashMap<u64, usize>>>,
}

impl Sink for Silent {
    async fn send(&mut self, batch: &[Message], outcomes: &mut Outcomes) -> Result<(), SendError> {
        let mut silent = false;
        for (index, message) in batch.iter().enumerate() {
            if let Ok(mut sends) = self.sends.lock() {
                *sends.entry(message.position).or_insert(0) += 1;
            }
            if message.position == self.silent_on {
                silent = true;
            } else {
                outcomes.delivered(index);
            }
        }
        if silent {
            std::future::pending::<()>().await;
        }
        Ok(())
    }

    async fn reset(&mut self) -> Result<(), SendError> {
        Ok(())
    }

    fn describe(&self) -> String {
        "silent on one message (test)".to_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_a_sink_never_answers_is_halved_down_to_alone_and_parked_within_the_bound() {
    let db = TestDb::new().await;
    let outbox = outbox(&db).await;
    let sends = Arc::new(Mutex::new(HashMap::new()));
    let sink = || Silent {
        silent_on: 1,
        sends: Arc::clone(&sends),
    };
    let (batch_size, max_attempts) = (20, 2);
    let relay = outbox
        .relay_with_sinks(
            config("silent-one")
                .batch_size(batch_size)
                .max_attempts(max_attempts),
            vec![sink(), sink()],
            keys,
        )
        .await
        .expect("relay");
    publish_together(
        &outbox,
        (0..20).map(|id| Parcel::new(id, &[&format!("k{id}")])),
    )
    .await;
    let blamed = trickle_until_parked(&outbox, &relay, 20).await;
    assert!(
        blamed,
        "the silent event was never parked: {:?}",
        relay.status()
    );
    let (position, attempts) = parked(&relay).await;
    assert_eq!((position, attempts), (1, max_attempts));
    relay.shutdown().await;

    let sends = sends.lock().expect("sends").clone();
    // ⌈log₂ 20⌉ = 5.
    let bound = 5 + max_attempts as usize;
    let silent = sends.get(&1).copied().unwrap_or(0);
    assert!(silent <= bound, "sent {silent} times, bound {bound}");
    assert!(
        sends.iter().all(|(at, count)| *at == 1 || *count == 1),
        "another event was sent twice: {sends:?}"
    );
}

/// A row whose payload does not decode as the relay's payload type
/// (plain SQL) is neither parked nor charged an attempt (it was parked, with two attempts and
/// then one): a relay forwards bytes, so it is sent as stored, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_row_is_sent_as_stored_with_no_attempt() {
    let db = TestDb::new().await;
    let outbox = outbox(&db).await;
    let endpoint = Responder::start(Vec::new()).await;
    let sink = WebhookSink::builder(endpoint.url("/in"), SECRET)
        .build()
        .expect("sink");
    let relay = outbox
        .relay(config("undecodable"), sink, keys)
        .await
        .expect("relay");
    sqlx::query(
        "INSERT INTO ordo.events (id, payload, headers) VALUES (gen_random_uuid(), '{\"shape\": \"other\"}', '{}')",
    )
    .execute(&db.pool)
    .await
    .expect("a row of another shape");
    relayed(&relay, &db.pool, 1).await;
    let bodies: Vec<Vec<u8>> = endpoint.requests().into_iter().map(|r| r.body).collect();
    assert_eq!(bodies, vec![br#"{"shape": "other"}"#.to_vec()]);
    assert!(relay.status().stalled.is_empty());
    assert!(charged(&db.pool, "undecodable").await.is_empty());
    relay.shutdown().await;
}

/// An event whose key holds a line break (plain SQL can write one),
/// which a NATS header cannot carry: refused before it is sent, parked at once with one
/// attempt; the events before and after it on other keys are in the stream once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_nats_cannot_carry_parks_its_event_before_it_is_sent() {
    let db = TestDb::new().await;
    let outbox = outbox(&db).await;
    let stream = TestStream::new().await;
    let sink = NatsSink::builder(nats_url(common::brokers::addr(common::brokers::NATS_ADDR)))
        .subject_prefix(&stream.prefix)
        .build()
        .expect("sink");
    let relay = outbox
        .relay(config("line-break-key"), sink, keys)
        .await
        .expect("relay");
    publish_together(
        &outbox,
        (0..10).map(|id| Parcel::new(id, &[&format!("k{id}")])),
    )
    .await;
    publish(&outbox, [Parcel::new(10, &["bad\nkey"])]).await;
    publish_together(
        &outbox,
        (11..20).map(|id| Parcel::new(id, &[&format!("k{id}")])),
    )
    .await;
    let (position, attempts) = parked(&relay).await;
    assert_eq!((position, attempts), (11, 1));
    let all = eventually(PATIENCE, || async { stream.len().await >= 19 }).await;
    assert!(all, "{} of 19 events in the stream", stream.len().await);
    relay.shutdown().await;
    assert_eq!(stream.len().await, 19, "each other event once");
}

/// RabbitMQ. The relay's exchange is deleted while
/// events keep coming, then declared again: no attempt counted, nothing parked
/// (`max_attempts(1)`), the status says the sink is down meanwhile, and every event reaches
/// the queue once the exchange is back, with no operator command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_exchange_is_an_outage_that_parks_nothing_and_ends_by_itself() {
    let db = TestDb::new().await;
    let outbox = outbox(&db).await;
    let queue = TestQueue::new().await;
    // The relay publishes to an exchange in front of the queue's (see `declare_front`).
    let front = format!("{}-front", queue.exchange);
    queue.declare_front(&front).await;
    let sink = RabbitSink::builder(amqp_uri(common::brokers::addr(
        common::brokers::RABBIT_ADDR,
    )))
    .exchange(&front)
    .build()
    .expect("sink");
    let relay = outbox
        .relay(config("exchange-outage").max_attempts(1), sink, keys)
        .await
        .expect("relay");
    publish(&outbox, common::relays::parcels(0, 20)).await;
    relayed(&relay, &db.pool, 20).await;

    queue.delete_front(&front).await;
    publish(&outbox, common::relays::parcels(20, 20)).await;
    let (status, down) = relay
        .wait_for(PATIENCE, |status| {
            status
                .last_error
                .as_deref()
                .is_some_and(|error| error.contains("sink down since"))
        })
        .await;
    assert!(down, "the status never said the sink is down: {status:?}");
    assert!(status.stalled.is_empty(), "an outage parked: {status:?}");

    queue.declare_front(&front).await;
    relayed(&relay, &db.pool, 40).await;
    let status = relay.status();
    assert!(status.stalled.is_empty(), "{status:?}");
    relay.shutdown().await;
    queue.delete_front(&front).await;
    let ids: std::collections::HashSet<String> = queue.drain_ids().await.into_iter().collect();
    assert_eq!(ids.len(), 40, "every event reached the queue");
}

/// An outage is per destination. One customer's endpoint answers 503 to
/// everything (its probe too) while another's works: the working one gets all its events, the
/// dead one's are charged nothing and parked nowhere (`max_attempts(1)`), and once it answers
/// again every event is delivered, with no operator command.
///
/// Its probe (`HEAD`) keeps answering 503 after its events are taken again: a request answered
/// 503 just before it comes back, whose probe is answered just after, is the message's (one
/// attempt, `docs/relays.md`, "The failure model"), which `max_attempts(1)` would park.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_dead_endpoint_holds_only_its_own_messages_and_resumes_by_itself() {
    let db = TestDb::new().await;
    let outbox = outbox(&db).await;
    let down = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let is_down = Arc::clone(&down);
    let dead = Responder::with_rule(move |request| {
        let probe = request.method == "HEAD";
        (probe || is_down.load(std::sync::atomic::Ordering::SeqCst)).then(|| Reply::status(503))
    })
    .await;
    let live = Responder::start(Vec::new()).await;
    let (dead_url, live_url) = (dead.url("/customer-a"), live.url("/customer-b"));
    let sink = WebhookSink::builder(live_url.clone(), SECRET)
        .route(move |message| {
            let to_a = message
                .key
                .as_deref()
                .is_some_and(|key| key.starts_with('a'));
            if to_a {
                dead_url.clone()
            } else {
                live_url.clone()
            }
        })
        .build()
        .expect("sink");
    let relay = outbox
        .relay(config("per-destination").max_attempts(1), sink, keys)
        .await
        .expect("relay");
    publish_together(
        &outbox,
        (0..30).map(|id| {
            let key = if id % 3 == 0 {
                format!("a{id}")
            } else {
                format!("b{id}")
            };
            Parcel::new(id, &[key.as_str()])
        }),
    )
    .await;
    let others = eventually(PATIENCE, || async { live.sends_per_event().len() >= 20 }).await;
    assert!(
        others,
        "{} of 20 events reached the live endpoint",
        live.sends_per_event().len()
    );
    let tried = eventually(PATIENCE, || async { dead.count() >= 20 }).await;
    assert!(tried, "the dead endpoint was not tried again and again");
    let status = relay.status();
    assert!(
        status.stalled.is_empty(),
        "a dead endpoint parked: {status:?}"
    );

    down.store(false, std::sync::atomic::Ordering::SeqCst);
    relayed(&relay, &db.pool, 30).await;
    assert!(relay.status().stalled.is_empty(), "{:?}", relay.status());
    relay.shutdown().await;
    assert_eq!(
        dead.sends_per_event().len(),
        10,
        "every event of the dead endpoint"
    );
}

/// At the relay: one event written by plain SQL whose stored
/// `headers.traceparent` holds a line break, and one whose key does (neither can travel in a
/// NATS header). Each parks as its own permanent failure (one attempt), its error quoting the
/// text escaped; every other event of every key (`OnParked::Continue`: the poisoned events'
/// keys too) is published once, counted by a plain NATS subscriber on the stream's subjects
/// (it sees every publish, even one the stream would drop as a duplicate): nothing is
/// republished in a loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_break_in_a_stored_traceparent_or_a_key_parks_only_that_event() {
    use futures::StreamExt;

    let db = TestDb::new().await;
    let outbox = outbox(&db).await;
    let stream = TestStream::new().await;
    let client = async_nats::connect(common::brokers::NATS_ADDR)
        .await
        .expect("NATS");
    let mut published = client
        .subscribe(format!("{}.>", stream.prefix))
        .await
        .expect("subscribe");
    client.flush().await.expect("flush");
    let sends: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let counting = Arc::clone(&sends);
    let counter = tokio::spawn(async move {
        while let Some(message) = published.next().await {
            let id = message
                .headers
                .as_ref()
                .and_then(|headers| headers.get("Nats-Msg-Id"))
                .map(ToString::to_string)
                .unwrap_or_default();
            *counting.lock().expect("sends").entry(id).or_insert(0) += 1;
        }
    });
    let relay = continuing_nats_relay(&outbox, &stream, "line-break-headers").await;
    publish_together(&outbox, (0..10).map(keyed_by_three)).await;
    sqlx::query(
        "INSERT INTO ordo.events (payload, headers) VALUES \
         ('{\"keys\": [\"k1\"], \"id\": 100}', \
          jsonb_build_object('traceparent', \
              '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' || chr(10) || 'Injected: yes')), \
         ('{\"keys\": [\"k\\n2\"], \"id\": 101}', '{}')",
    )
    .execute(&db.pool)
    .await
    .expect("two rows by plain SQL");
    publish_together(&outbox, (10..20).map(keyed_by_three)).await;

    let all = eventually(PATIENCE, || async { stream.len().await >= 20 }).await;
    assert!(all, "{} of 20 events in the stream", stream.len().await);
    let both_parked = eventually(PATIENCE, || async {
        charged(&db.pool, "line-break-headers")
            .await
            .iter()
            .filter(|(_, _, state)| state == "stalled")
            .count()
            == 2
    })
    .await;
    let rows = charged(&db.pool, "line-break-headers").await;
    assert!(both_parked, "{rows:?}");
    assert_eq!(
        rows.iter()
            .map(|(position, attempts, _)| (*position, *attempts))
            .collect::<Vec<_>>(),
        vec![(11, 1), (12, 1)],
        "each parked at once, with one attempt"
    );
    let errors: Vec<String> = sqlx::query_scalar(
        "SELECT last_error FROM ordo.subscription_progress \
         WHERE subscription = 'line-break-headers' AND state = 'stalled' ORDER BY position",
    )
    .fetch_all(&db.pool)
    .await
    .expect("errors");
    assert!(
        errors.iter().all(|error| !error.contains('\n')),
        "an error carried the line break raw: {errors:?}"
    );
    assert!(
        errors[0].contains("traceparent") && errors[0].contains(r"\nInjected: yes"),
        "{errors:?}"
    );
    assert!(errors[1].contains(r#""k\n2""#), "{errors:?}");
    relay.shutdown().await;
    // The subscriber may see the last publishes a moment after the stream acknowledged them.
    let seen = eventually(PATIENCE, || async {
        sends.lock().expect("sends").len() >= 20
    })
    .await;
    counter.abort();
    let sends = sends.lock().expect("sends").clone();
    assert!(seen, "{sends:?}");
    assert_eq!(
        sends.len(),
        20,
        "the 20 other events were published: {sends:?}"
    );
    assert!(
        sends.values().all(|&count| count == 1),
        "an event was published more than once: {sends:?}"
    );
    assert_eq!(stream.len().await, 20);
}

/// A NATS relay on `stream` whose parked events' keys go on without them.
async fn continuing_nats_relay(
    outbox: &Outbox<Parcel>,
    stream: &TestStream,
    name: &str,
) -> SubscriptionHandle {
    let sink = NatsSink::builder(nats_url(common::brokers::addr(common::brokers::NATS_ADDR)))
        .subject_prefix(&stream.prefix)
        .build()
        .expect("sink");
    outbox
        .relay(config(name).on_parked(OnParked::Continue), sink, keys)
        .await
        .expect("relay")
}

fn keyed_by_three(id: u32) -> Parcel {
    Parcel::new(id, &[&format!("k{}", id % 3)])
}

/// At the relay level: an event whose type (about 4 kB, written by plain
/// SQL) would make a subject over NATS's limit (the server drops a connection whose control
/// line passes 4,096 bytes, which was retried for ever): refused before it is sent, parked at
/// once with one attempt, the connection kept, and every other event, of its key too
/// (`OnParked::Continue`), in the stream once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_type_too_long_for_a_subject_parks_only_that_event() {
    let db = TestDb::new().await;
    let outbox = outbox(&db).await;
    let stream = TestStream::new().await;
    let relay = continuing_nats_relay(&outbox, &stream, "long-type").await;
    publish_together(&outbox, (0..10).map(keyed_by_three)).await;
    sqlx::query(
        "INSERT INTO ordo.events (payload, event_type) \
         VALUES ('{\"keys\": [\"k1\"], \"id\": 100}', repeat('t', 4100))",
    )
    .execute(&db.pool)
    .await
    .expect("a row with a 4 kB type");
    publish_together(&outbox, (10..20).map(keyed_by_three)).await;

    let all = eventually(PATIENCE, || async { stream.len().await >= 20 }).await;
    assert!(all, "{} of 20 events in the stream", stream.len().await);
    let (position, attempts) = parked(&relay).await;
    assert_eq!(
        (position, attempts),
        (11, 1),
        "parked at once, with one attempt"
    );
    let error = relay.status().stalled[0].error.clone();
    assert!(error.contains("4,000") || error.contains("4000"), "{error}");
    assert!(error.len() < 600, "the type is not repeated whole: {error}");
    assert_eq!(
        stream.len().await,
        20,
        "nothing else was sent twice or lost"
    );
    relay.shutdown().await;
}
