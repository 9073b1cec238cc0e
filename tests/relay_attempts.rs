//! What holds a relay, and an event's attempt history: a parked event that holds its key is
//! reported as the relay's held head (its key, position, since when, its error), and
//! `ordo relay attempts` / `ordo::admin::relay_attempts` answer "was this event sent, when,
//! and why not" with each failed attempt's time, error, host and pid, by position or event id.
#![cfg(all(feature = "cli", feature = "http"))]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::TestDb;
use common::http_responder::{Reply, Responder};
use common::keyed::{Parcel, publish};
use common::relays::{config, keys, parcels, relayed};
use common::subscribers::PATIENCE;
use ordo::relay::http::WebhookSink;
use ordo::relay::{RelayEvent, RelayEventState};
use ordo::{Outbox, OutboxConfig};

const SECRET: &[u8] = b"an attempts secret";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_head_is_reported_and_its_attempts_say_when_and_why() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Parcel>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    // Parcel 1 (position 2, key k1) is refused while `refusing`; everything else is taken.
    let refusing = Arc::new(AtomicBool::new(true));
    let refuse = Arc::clone(&refusing);
    let responder = Responder::with_rule(move |request| {
        let parcel: Parcel = serde_json::from_slice(&request.body).ok()?;
        (parcel.id == 1 && refuse.load(Ordering::SeqCst))
            .then(|| Reply::status(400).with_header("content-type", "text/plain"))
    })
    .await;
    let sink = WebhookSink::builder(responder.url("/hook"), SECRET)
        .build()
        .expect("sink");
    let relay = outbox
        .relay(config("hist"), sink, keys)
        .await
        .expect("relay");
    publish(&outbox, parcels(0, 20)).await;

    // The relay's status names the parked event that holds its position.
    let (status, held) = relay
        .wait_for(PATIENCE, |status| {
            status.stalled.iter().any(|key| key.holds_watermark)
        })
        .await;
    assert!(held, "no parked head reported: {status:?}");
    let head = status
        .stalled
        .iter()
        .find(|key| key.holds_watermark)
        .expect("the head");
    assert_eq!((head.key.as_str(), head.position.get()), ("k1", 2));
    assert!(head.since.is_some(), "{head:?}");
    assert!(head.error.contains("400"), "{head:?}");
    // So do the database's readers (`ordo subscriptions`, `ordo relay parked`).
    let stored = ordo::admin::list_stalled_keys(&db.pool, "hist")
        .await
        .expect("stalled keys");
    assert!(
        stored
            .iter()
            .any(|key| key.position.get() == 2 && key.holds_watermark && key.since.is_some()),
        "{stored:?}"
    );

    // The library answer: parked, one attempt, by this process.
    let found = ordo::admin::relay_attempts(&db.pool, "hist", RelayEvent::Position(2))
        .await
        .expect("attempts");
    assert_eq!(found.state, RelayEventState::Parked);
    assert_eq!(found.attempts.len(), 1, "{found:?}");
    let attempt = &found.attempts[0];
    assert_eq!(attempt.attempt, 1);
    assert!(
        attempt.parked && attempt.error.contains("400"),
        "{attempt:?}"
    );
    assert_eq!(attempt.pid, std::process::id());
    assert!(!attempt.host.is_empty());
    let id = found.event_id.expect("the event's id");

    // The operator's answer, by position and by id.
    let (ok, out, err) = db.ordo(&["relay", "attempts", "hist", "2"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("parked") && out.contains(&id.to_string()),
        "{out}"
    );
    assert!(out.contains(&std::process::id().to_string()), "{out}");
    let (ok, out, err) = db.ordo(&["relay", "attempts", "hist", &id.to_string(), "--json"]);
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    assert_eq!(json["state"], "parked");
    assert_eq!(json["attempts"][0]["pid"], std::process::id());
    let (ok, _, err) = db.ordo(&["relay", "attempts", "hist", "not-an-event"]);
    assert!(
        !ok && err.contains("neither a position nor an event id"),
        "{err}"
    );

    // Requeued and delivered: the history stays, the state says delivered.
    refusing.store(false, Ordering::SeqCst);
    ordo::admin::retry_stalled_keys(&db.pool, "hist", Some("k1"))
        .await
        .expect("requeue");
    relayed(&relay, &db.pool, 20).await;
    relay.shutdown().await;
    let found = ordo::admin::relay_attempts(&db.pool, "hist", RelayEvent::Id(id))
        .await
        .expect("attempts");
    assert_eq!(found.state, RelayEventState::Delivered);
    assert_eq!(found.attempts.len(), 1, "{found:?}");
    let (ok, out, _) = db.ordo(&["relay", "attempts", "hist", "3"]);
    assert!(
        ok && out.contains("delivered") && out.contains("no failed attempt"),
        "{out}"
    );
}
