//! Route chains end to end (2026-12-07): a relay that passes over events (other services'
//! types) or sends them to several subjects feeds watermark inboxes on the far side of NATS
//! JetStream. Each inbox takes every event sent on the routes it reads, once, without waiting
//! on a position the relay never sent there; and a message that was sent and lost (deleted
//! from the stream) is still refused as a gap, visible in `ordo inbox watermarks`.
#![cfg(all(feature = "nats", feature = "cli"))]

use crate::common;

use std::time::Duration;

use common::brokers::{NATS_ADDR, TestStream};
use common::relays::config;
use common::{TestDb, eventually};
use ordo::HandlerError;
use ordo::inbox::{Inbox, InboxConfig, InboxHandler, InboxMessage, InboxMode, NatsInbox};
use ordo::relay::nats::NatsSink;
use ordo::{Keys, Outbox, OutboxConfig, SubscriptionHandle};
use sqlx::{PgConnection, PgPool};

const PATIENCE: Duration = Duration::from_secs(60);
const SOURCE: &str = "orders-db";

/// This service's events: each variant is a type (`Placed`, `Cancelled`), and the relay of an
/// `Outbox<Orders>` sends only these by default.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
enum Orders {
    Placed { id: i32 },
    Cancelled { id: i32 },
}

/// One projection row per handled message: its route, position and id. No unique key, so a
/// message handled twice shows as a second row.
struct Project;

impl InboxHandler for Project {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        message: &InboxMessage,
    ) -> Result<(), HandlerError> {
        let position = message
            .position
            .ok_or("a watermark message has a position")?;
        sqlx::query("INSERT INTO projection (route, position, event_id) VALUES ($1, $2, $3)")
            .bind(message.route.as_deref().unwrap_or(""))
            .bind(i64::try_from(position)?)
            .bind(&message.id)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

struct Sides {
    a: TestDb,
    b: TestDb,
    outbox: Outbox<Orders>,
    stream: TestStream,
    _relay: SubscriptionHandle,
}

/// A's outbox and its relay to a fresh stream (subjects `{prefix}.Placed`, `{prefix}.Cancelled`),
/// one key for every event so that it sends in commit order; B with a projection table.
async fn sides() -> Sides {
    let a = TestDb::new().await;
    let b = TestDb::new().await;
    sqlx::query(
        "CREATE TABLE projection (route TEXT NOT NULL, position BIGINT NOT NULL, event_id TEXT NOT NULL)",
    )
    .execute(&b.pool)
    .await
    .expect("projection table");
    let stream = TestStream::new().await;
    let outbox = Outbox::<Orders>::new(a.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox A");
    let sink = NatsSink::builder(NATS_ADDR)
        .subject_prefix(&stream.prefix)
        .build()
        .expect("sink");
    let relay = outbox
        .relay(config("a-to-nats").source(SOURCE), sink, |_| {
            Keys::one("all")
        })
        .await
        .expect("relay");
    Sides {
        a,
        b,
        outbox,
        stream,
        _relay: relay,
    }
}

fn inbox(pool: &PgPool, consumer: &str) -> Inbox {
    Inbox::new(
        pool.clone(),
        InboxConfig::new(consumer).mode(InboxMode::Watermark),
    )
    .expect("inbox")
}

/// B's adapter on the stream, reading `filter` (every subject when `None`).
fn adapter(stream: &TestStream, durable: &str, filter: Option<&str>) -> NatsInbox {
    let mut builder =
        NatsInbox::builder(format!("nats://{NATS_ADDR}"), stream.name.as_str(), durable)
            .ack_wait(Duration::from_secs(2))
            .redelivery(
                ordo::inbox::Redelivery::default()
                    .busy(Duration::from_millis(50))
                    .gap(Duration::from_millis(50))
                    .retry_backoff(Duration::from_millis(50), Duration::from_millis(200)),
            );
    if let Some(filter) = filter {
        builder = builder.filter_subject(filter);
    }
    builder.build().expect("adapter")
}

/// Runs `adapter` into `inbox` until the returned sender is dropped or fires.
fn receive(adapter: NatsInbox, inbox: Inbox) -> tokio::sync::oneshot::Sender<()> {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = adapter
            .run(&inbox, &Project, async move {
                let _ = stopped.await;
            })
            .await;
    });
    stop
}

async fn publish(outbox: &Outbox<Orders>, event: Orders) {
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(event).expect("publish");
    tx.commit().await.expect("commit");
}

/// Another service's row in the same table, written by plain SQL: the relay passes it over.
async fn foreign_row(pool: &PgPool) {
    sqlx::query(
        "INSERT INTO ordo.events (payload, event_type) VALUES ('{\"invoice\": 7}', 'billing.Invoiced')",
    )
    .execute(pool)
    .await
    .expect("a foreign row");
}

/// The projection's rows: (route, position, id), by route and position.
async fn projected(pool: &PgPool) -> Vec<(String, i64, String)> {
    sqlx::query_as("SELECT route, position, event_id FROM projection ORDER BY route, position")
        .fetch_all(pool)
        .await
        .expect("read the projection")
}

/// The ids of A's events of `kind` (`Placed`, `Cancelled`, or every one of A's own types).
async fn sent_ids(pool: &PgPool, kind: Option<&str>) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT id::text FROM ordo.events
         WHERE event_type IN ('Placed', 'Cancelled') AND ($1::text IS NULL OR event_type = $1)
         ORDER BY id",
    )
    .bind(kind)
    .fetch_all(pool)
    .await
    .expect("A's events")
}

fn sorted_ids(rows: &[(String, i64, String)]) -> Vec<String> {
    let mut ids: Vec<String> = rows.iter().map(|row| row.2.clone()).collect();
    ids.sort();
    ids
}

/// Positions strictly increase along each route (each message handled once, in order).
fn assert_in_order_once(rows: &[(String, i64, String)]) {
    for pair in rows.windows(2) {
        if pair[0].0 == pair[1].0 {
            assert!(
                pair[0].1 < pair[1].1,
                "route {} out of order or twice: {pair:?}",
                pair[0].0
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_type_filtered_relay_feeds_a_watermark_inbox_that_never_waits_on_what_it_passed_over() {
    let sides = sides().await;
    // 30 of A's own events, with another service's rows between them (passed over by the
    // relay: their positions are never sent), then more of A's.
    for id in 0..30 {
        let event = if id % 4 == 3 {
            Orders::Cancelled { id }
        } else {
            Orders::Placed { id }
        };
        publish(&sides.outbox, event).await;
        if id % 3 == 1 {
            foreign_row(&sides.a.pool).await;
        }
    }
    let b_inbox = inbox(&sides.b.pool, "b-orders");
    let stop = receive(adapter(&sides.stream, "b-orders", None), b_inbox);
    let expected = sent_ids(&sides.a.pool, None).await;
    assert_eq!(expected.len(), 30);
    let done = eventually(PATIENCE, || async {
        projected(&sides.b.pool).await.len() >= expected.len()
    })
    .await;
    let rows = projected(&sides.b.pool).await;
    assert!(
        done,
        "the inbox stopped at {} of {} events (waiting on a position the relay passed over?): {:?}",
        rows.len(),
        expected.len(),
        ordo::inbox::list_watermarks(&sides.b.pool, None).await
    );
    // A later foreign row and event: still no wait.
    foreign_row(&sides.a.pool).await;
    publish(&sides.outbox, Orders::Placed { id: 99 }).await;
    assert!(
        eventually(PATIENCE, || async {
            projected(&sides.b.pool).await.len() > expected.len()
        })
        .await
    );
    drop(stop);
    let rows = projected(&sides.b.pool).await;
    assert_eq!(
        sorted_ids(&rows),
        sent_ids(&sides.a.pool, None).await,
        "each sent event once"
    );
    assert_in_order_once(&rows);
    // One mark per subject, none waiting.
    let marks = ordo::inbox::list_watermarks(&sides.b.pool, Some("b-orders"))
        .await
        .expect("marks");
    let mut routes: Vec<&str> = marks.iter().map(|mark| mark.route.as_str()).collect();
    routes.sort();
    let placed = format!("{}.Placed", sides.stream.prefix);
    let cancelled = format!("{}.Cancelled", sides.stream.prefix);
    assert_eq!(routes, [cancelled.as_str(), placed.as_str()]);
    assert!(marks.iter().all(|mark| mark.gap.is_none()), "{marks:?}");
    // The chains' starts stored with the relay's watermark: each route's last position.
    let stored: Vec<(String, i64)> =
        sqlx::query_as("SELECT route, position FROM ordo.relay_routes ORDER BY route")
            .fetch_all(&sides.a.pool)
            .await
            .expect("the relay's routes");
    let last_of = |kind: &str| {
        let route = format!("{}.{kind}", sides.stream.prefix);
        rows.iter()
            .filter(|row| row.0 == route)
            .map(|row| row.1)
            .max()
    };
    let expect_stored = eventually(PATIENCE, || async {
        let stored: Vec<(String, i64)> =
            sqlx::query_as("SELECT route, position FROM ordo.relay_routes ORDER BY route")
                .fetch_all(&sides.a.pool)
                .await
                .unwrap_or_default();
        stored
            == vec![
                (cancelled.clone(), last_of("Cancelled").unwrap_or(0)),
                (placed.clone(), last_of("Placed").unwrap_or(0)),
            ]
    })
    .await;
    assert!(
        expect_stored,
        "ordo.relay_routes holds each route's last position: {stored:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_routing_to_two_subjects_feeds_an_inbox_per_subject_each_taking_its_own_once() {
    let sides = sides().await;
    for id in 0..24 {
        let event = if id % 2 == 0 {
            Orders::Placed { id }
        } else {
            Orders::Cancelled { id }
        };
        publish(&sides.outbox, event).await;
        if id % 5 == 0 {
            foreign_row(&sides.a.pool).await;
        }
    }
    let placed = format!("{}.Placed", sides.stream.prefix);
    let cancelled = format!("{}.Cancelled", sides.stream.prefix);
    let stops = [
        receive(
            adapter(&sides.stream, "b-placed", Some(&placed)),
            inbox(&sides.b.pool, "b-placed"),
        ),
        receive(
            adapter(&sides.stream, "b-cancelled", Some(&cancelled)),
            inbox(&sides.b.pool, "b-cancelled"),
        ),
    ];
    let all = sent_ids(&sides.a.pool, None).await;
    let done = eventually(PATIENCE, || async {
        projected(&sides.b.pool).await.len() >= all.len()
    })
    .await;
    let rows = projected(&sides.b.pool).await;
    assert!(
        done,
        "the inboxes stopped at {} of {} events: {:?}",
        rows.len(),
        all.len(),
        ordo::inbox::list_watermarks(&sides.b.pool, None).await
    );
    drop(stops);
    let of_route = |route: &str| -> Vec<(String, i64, String)> {
        rows.iter().filter(|row| row.0 == route).cloned().collect()
    };
    assert_eq!(
        sorted_ids(&of_route(&placed)),
        sent_ids(&sides.a.pool, Some("Placed")).await
    );
    assert_eq!(
        sorted_ids(&of_route(&cancelled)),
        sent_ids(&sides.a.pool, Some("Cancelled")).await
    );
    assert_in_order_once(&rows);
    let marks = ordo::inbox::list_watermarks(&sides.b.pool, None)
        .await
        .expect("marks");
    assert_eq!(
        marks.len(),
        2,
        "one mark per consumer, for its subject: {marks:?}"
    );
    assert!(marks.iter().all(|mark| mark.gap.is_none()), "{marks:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_lost_from_the_stream_is_still_refused_as_a_gap_and_shown() {
    let sides = sides().await;
    // A's events at every other position: a foreign row after each (so the dense rule alone
    // would wait on every foreign position).
    for id in 0..8 {
        publish(&sides.outbox, Orders::Placed { id }).await;
        foreign_row(&sides.a.pool).await;
    }
    assert!(eventually(PATIENCE, || async { sides.stream.len().await >= 8 }).await);
    // The broker loses the third message (A's third event, at commit position 5).
    let third = sides.stream.messages().await[2].clone();
    let lost_position: u64 = third
        .headers
        .get("Ordo-Position")
        .and_then(|value| value.as_str().parse().ok())
        .expect("a position header");
    assert_eq!(lost_position, 5);
    sides.stream.delete_message(third.sequence).await;
    let b_inbox = inbox(&sides.b.pool, "b-orders");
    let stop = receive(adapter(&sides.stream, "b-orders", None), b_inbox);
    // The first two are handled; the fourth (position 7, after 5 on its route) waits on 5.
    let waiting = eventually(PATIENCE, || async {
        ordo::inbox::list_watermarks(&sides.b.pool, Some("b-orders"))
            .await
            .is_ok_and(|marks| {
                marks
                    .iter()
                    .any(|mark| mark.gap.as_ref().is_some_and(|gap| gap.expected == 5))
            })
    })
    .await;
    assert!(
        waiting,
        "{:?}",
        ordo::inbox::list_watermarks(&sides.b.pool, None).await
    );
    drop(stop);
    let rows = projected(&sides.b.pool).await;
    let positions: Vec<i64> = rows.iter().map(|row| row.1).collect();
    assert_eq!(positions, [1, 3], "nothing after the lost message is taken");
    // Shown once the wait outlived a few redeliveries (moved back rather than waited out).
    sqlx::query("UPDATE ordo.inbox_watermarks SET gap_since = gap_since - interval '1 minute'")
        .execute(&sides.b.pool)
        .await
        .expect("age the gap");
    let (ok, out, err) = sides.b.ordo(&["inbox", "watermarks"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("position 5 has not arrived"),
        "the wait is shown: {out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_copy_of_an_events_id_leaves_no_hole_in_its_routes_chain() {
    let sides = sides().await;
    publish(&sides.outbox, Orders::Placed { id: 1 }).await;
    let real: uuid::Uuid =
        sqlx::query_scalar("SELECT id FROM ordo.events ORDER BY sequence LIMIT 1")
            .fetch_one(&sides.a.pool)
            .await
            .expect("the real event's id");
    // A publisher's copy of that id, of the same type (so on the same route), then more events.
    sqlx::query(
        "INSERT INTO ordo.events (id, payload, event_type) VALUES ($1, '{\"Placed\": {\"id\": 666}}', 'Placed')",
    )
    .bind(real)
    .execute(&sides.a.pool)
    .await
    .expect("the copy");
    for id in 2..6 {
        publish(&sides.outbox, Orders::Placed { id }).await;
    }
    let b_inbox = inbox(&sides.b.pool, "b-orders");
    let stop = receive(adapter(&sides.stream, "b-orders", None), b_inbox);
    let done = eventually(PATIENCE, || async {
        projected(&sides.b.pool).await.len() >= 5
    })
    .await;
    let marks = ordo::inbox::list_watermarks(&sides.b.pool, None).await;
    assert!(
        done,
        "the inbox waits on the refused copy's position: {marks:?}"
    );
    drop(stop);
    let rows = projected(&sides.b.pool).await;
    let positions: Vec<i64> = rows.iter().map(|row| row.1).collect();
    assert_eq!(
        positions,
        [1, 3, 4, 5, 6],
        "every real event, the copy (2) never"
    );
    assert_eq!(rows[0].2, real.to_string());
}
