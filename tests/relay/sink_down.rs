//! A relay's sink that is down, seen where an operator looks: the relay's
//! own handle, `admin::status` and `admin::list_subscriptions` (the database), and the CLI's
//! `ordo status` (text and `--prometheus`) and `ordo subscriptions` all say "sink down since T:
//! reason", while no attempt is counted and nothing parks; once the sink answers, every event
//! is delivered and the state clears, with no operator command.
//!
//! The sink is a webhook to a port where nothing listens (refused), then a server the test
//! starts on that very port. No assertion is on timing.
#![cfg(all(
    feature = "nats",
    feature = "rabbitmq",
    feature = "http",
    feature = "cli"
))]

use crate::common;

use common::http_responder::Responder;
use common::keyed::{Parcel, publish};
use common::relays::{config, keys, parcels, relayed};
use common::subscribers::PATIENCE;
use common::{TestDb, eventually};
use ordo::relay::http::WebhookSink;
use ordo::{Outbox, OutboxConfig, SinkDown, SubscriptionStatus};
use sqlx::PgPool;

const RELAY: &str = "sink-down";

/// The relay's row as `admin::status` reads it.
async fn stored(pool: &PgPool) -> SubscriptionStatus {
    let status = ordo::admin::status(pool).await.expect("status");
    status
        .subscriptions
        .into_iter()
        .find(|sub| sub.name == RELAY)
        .expect("the relay's row")
}

/// Rows of the relay's events that were charged an attempt or parked.
async fn charged(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM ordo.subscription_progress \
         WHERE subscription = $1 AND (attempts > 0 OR state <> 'done')",
    )
    .bind(RELAY)
    .fetch_one(pool)
    .await
    .expect("progress rows")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_is_down_shows_in_status_and_subscriptions_and_clears_by_itself() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Parcel>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    // A port that was just free: nothing listens there until the test starts its server.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address").port()
    };
    let sink = WebhookSink::builder(
        format!("http://127.0.0.1:{port}/in"),
        b"a sink-down secret".to_vec(),
    )
    .build()
    .expect("sink");
    // One attempt parks: an outage that counted one would show as a parked event.
    let relay = outbox
        .relay(config(RELAY).max_attempts(1), sink, keys)
        .await
        .expect("relay");
    publish(&outbox, parcels(0, 14)).await;

    // The database says so, for every reader.
    let down = eventually(PATIENCE, || async {
        stored(&db.pool).await.sink_down.is_some()
    })
    .await;
    let row = stored(&db.pool).await;
    assert!(down, "admin::status never said the sink is down: {row:?}");
    let SinkDown { since, reason, .. } = row.sink_down.clone().expect("down");
    assert!(reason.contains("refused"), "{reason}");
    assert!(since <= chrono::Utc::now(), "{since}");
    assert_eq!(row.attempts, 0, "{row:?}");
    assert!(row.stalled.is_empty(), "an outage parked: {row:?}");
    assert_eq!(charged(&db.pool).await, 0, "an outage charged an attempt");
    let listed = ordo::admin::list_subscriptions(&db.pool)
        .await
        .expect("list");
    let listed = listed.iter().find(|sub| sub.name == RELAY).expect("listed");
    assert_eq!(listed.sink_down, row.sink_down);
    // The relay's own handle too.
    let live = relay.status();
    assert!(
        live.sink_down
            .as_ref()
            .is_some_and(|down| down.reason.contains("refused")),
        "{live:?}"
    );

    // The CLI.
    let shown = format!("sink down since {}", since.format("%Y-%m-%dT%H:%M:%SZ"));
    let (ok, status_text, stderr) = db.ordo(&["status"]);
    assert!(ok, "{stderr}");
    let line = status_text
        .lines()
        .find(|line| line.starts_with(RELAY))
        .unwrap_or_else(|| panic!("no row for the relay: {status_text}"));
    assert!(line.contains(&shown), "{line}");
    assert!(line.contains("refused"), "{line}");
    let (ok, listed_text, stderr) = db.ordo(&["subscriptions"]);
    assert!(ok, "{stderr}");
    assert!(listed_text.contains(&shown), "{listed_text}");
    let (ok, metrics, stderr) = db.ordo(&["status", "--prometheus"]);
    assert!(ok, "{stderr}");
    let gauge = metrics
        .lines()
        .find(|line| {
            line.starts_with(&format!(
                "ordo_subscription_sink_down{{subscription=\"{RELAY}\""
            ))
        })
        .unwrap_or_else(|| panic!("no sink-down gauge: {metrics}"));
    assert!(gauge.ends_with(" 1"), "{gauge}");
    assert!(
        metrics.contains(&format!(
            "ordo_subscription_sink_down_seconds{{subscription=\"{RELAY}\""
        )),
        "{metrics}"
    );
    let (ok, json, stderr) = db.ordo(&["status", "--json"]);
    assert!(ok, "{stderr}");
    assert!(json.contains("\"sink_down\":{\"since\""), "{json}");

    // The endpoint comes up where nothing listened: everything is delivered, nothing parked,
    // and the state clears, with no operator command.
    let server = Responder::at(port, Vec::new()).await;
    relayed(&relay, &db.pool, 14).await;
    let cleared = eventually(PATIENCE, || async {
        stored(&db.pool).await.sink_down.is_none()
    })
    .await;
    let row = stored(&db.pool).await;
    assert!(cleared, "the stored state did not clear: {row:?}");
    assert!(relay.status().sink_down.is_none(), "{:?}", relay.status());
    assert_eq!(row.attempts, 0, "{row:?}");
    assert!(row.stalled.is_empty(), "{row:?}");
    assert_eq!(charged(&db.pool).await, 0);
    let sends = server.sends_per_event();
    assert_eq!(
        sends.len(),
        14,
        "every event reached the endpoint: {sends:?}"
    );
    let (ok, status_text, stderr) = db.ordo(&["status"]);
    assert!(ok, "{stderr}");
    assert!(!status_text.contains("sink down"), "{status_text}");
    let (ok, metrics, _) = db.ordo(&["status", "--prometheus"]);
    assert!(ok);
    assert!(
        metrics.contains(&format!(
            "ordo_subscription_sink_down{{subscription=\"{RELAY}\","
        )) && !metrics.contains("ordo_subscription_sink_down_seconds{"),
        "{metrics}"
    );
    relay.shutdown().await;
}

/// A new owner's claim clears the state the last owner stored (it judges the sink afresh).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_clears_the_stored_sink_state() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Parcel>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let server = Responder::start(Vec::new()).await;
    let sink = WebhookSink::builder(server.url("/in"), b"a sink-down secret".to_vec())
        .build()
        .expect("sink");
    // A row left by an owner that died while its sink was down.
    sqlx::query(
        "INSERT INTO ordo.subscriptions (name, lane, lease_owner, lease_expires_at, \
         sink_down_since, sink_down_reason) \
         VALUES ($1, 'commit', gen_random_uuid(), now() - interval '1 minute', now(), 'gone')",
    )
    .bind(RELAY)
    .execute(&db.pool)
    .await
    .expect("a dead owner's row");
    assert!(stored(&db.pool).await.sink_down.is_some());
    let relay = outbox
        .relay(config(RELAY), sink, keys)
        .await
        .expect("relay");
    publish(&outbox, parcels(0, 3)).await;
    relayed(&relay, &db.pool, 3).await;
    let row = stored(&db.pool).await;
    assert_eq!(row.sink_down, None, "{row:?}");
    relay.shutdown().await;
}
