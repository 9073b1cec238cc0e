//! Event types: the publisher stores the payload's serde tag, plain SQL may set the type, and
//! listeners and subscriptions that select types skip the others before decoding them, so a
//! foreign row never halts or dead-letters a typed subscription.

use crate::common;

use std::time::Duration;

use common::TestDb;
use futures::StreamExt;
use ordo::{
    Batch, Delivery, HandlerError, JobConfig, OnExhaustion, Ordering, Outbox, OutboxConfig,
    RetryPolicy, Start, Subscriber, SubscriptionHandle, SubscriptionState,
};
use sqlx::{PgConnection, PgPool};

const PATIENCE: Duration = Duration::from_secs(30);

/// One event enum per service: each variant is a type.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
enum Orders {
    Placed { id: i32 },
    Cancelled { id: i32 },
}

impl Orders {
    fn id(&self) -> i32 {
        match self {
            Orders::Placed { id } | Orders::Cancelled { id } => *id,
        }
    }
}

/// Records the id of every event it is handed.
struct Record;

impl Subscriber<Orders> for Record {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        event: &Delivery<Orders>,
    ) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO handled (id) VALUES ($1)")
            .bind(event.payload.id())
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

async fn setup() -> (TestDb, Outbox<Orders>) {
    let db = TestDb::new().await;
    sqlx::query("CREATE TABLE handled (id INT NOT NULL)")
        .execute(&db.pool)
        .await
        .expect("handled table");
    let outbox = Outbox::<Orders>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    (db, outbox)
}

async fn publish(outbox: &Outbox<Orders>, event: Orders) {
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(event).expect("publish");
    tx.commit().await.expect("commit");
}

/// The README's plain-SQL publish, with a type of another service.
async fn foreign_row(pool: &PgPool, event_type: Option<&str>) {
    sqlx::query("INSERT INTO ordo.events (payload, event_type) VALUES ('{\"k\": 1}', $1)")
        .bind(event_type)
        .execute(pool)
        .await
        .expect("plain-SQL insert");
}

async fn handled(pool: &PgPool) -> Vec<i32> {
    sqlx::query_scalar("SELECT id FROM handled ORDER BY id")
        .fetch_all(pool)
        .await
        .expect("read handled")
}

fn fast_halting(name: &str) -> JobConfig {
    JobConfig::new(name)
        .retry(RetryPolicy {
            max_attempts: 2,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(10),
        })
        .on_exhaustion(OnExhaustion::Halt)
        .on_undecodable(OnExhaustion::Halt)
}

/// Waits until the subscription's position reaches `position` while running, and says why not.
async fn reaches(handle: &SubscriptionHandle, position: u64) {
    let (status, reached) = handle
        .wait_for(PATIENCE, |s| {
            s.state == SubscriptionState::Halted || s.position.get() >= position
        })
        .await;
    assert!(
        reached && status.state != SubscriptionState::Halted,
        "expected position {position} without a halt: {status:?}"
    );
    assert_eq!(status.position.get(), position, "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_row_of_another_type_is_skipped_and_does_not_halt_a_typed_subscription() {
    let (db, outbox) = setup().await;
    publish(&outbox, Orders::Placed { id: 1 }).await;
    foreign_row(&db.pool, Some("shipping.LabelPrinted")).await;
    publish(&outbox, Orders::Cancelled { id: 2 }).await;
    // Last, so the position has to move past it with nothing handled after it.
    foreign_row(&db.pool, Some("shipping.LabelPrinted")).await;

    let config = fast_halting("typed").event_types(["Placed", "Cancelled"]);
    let handle = outbox.subscribe(config, Record).await.expect("subscribe");
    reaches(&handle, 4).await;
    assert_eq!(handled(&db.pool).await, vec![1, 2]);
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM ordo.dead_letters")
        .fetch_one(&db.pool)
        .await
        .expect("dead letters");
    assert_eq!(dead, 0, "skipped, not dead-lettered");
    outbox.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_lane_group_subscription_skips_foreign_rows_inside_and_between_groups() {
    let (db, outbox) = setup().await;
    publish(&outbox, Orders::Placed { id: 1 }).await;
    foreign_row(&db.pool, Some("shipping.LabelPrinted")).await;
    // One transaction: a typed event, then a foreign row that ends the group.
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(Orders::Placed { id: 2 }).expect("publish");
    tx.commit().await.expect("commit");
    let mut tx = db.pool.begin().await.expect("begin");
    sqlx::query("INSERT INTO ordo.events (payload, event_type) VALUES ('{\"Placed\": {\"id\": 3}}', 'Placed')")
        .execute(&mut *tx)
        .await
        .expect("typed plain-SQL row");
    sqlx::query(
        "INSERT INTO ordo.events (payload, event_type) VALUES ('{\"k\": 1}', 'billing.Invoiced')",
    )
    .execute(&mut *tx)
    .await
    .expect("foreign plain-SQL row");
    tx.commit().await.expect("commit");

    let config = fast_halting("typed-groups")
        .ordering(Ordering::Commit)
        .batch(Batch::Groups)
        .event_types(["Placed"]);
    let handle = outbox.subscribe(config, Record).await.expect("subscribe");
    reaches(&handle, 5).await;
    assert_eq!(handled(&db.pool).await, vec![1, 2, 3]);
    outbox.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_untyped_passes_over_the_readmes_untyped_row() {
    let (db, outbox) = setup().await;
    publish(&outbox, Orders::Placed { id: 1 }).await;
    foreign_row(&db.pool, None).await;
    publish(&outbox, Orders::Placed { id: 2 }).await;

    let config = fast_halting("typed-only")
        .event_types(["Placed"])
        .skip_untyped(true);
    let handle = outbox.subscribe(config, Record).await.expect("subscribe");
    reaches(&handle, 3).await;
    assert_eq!(handled(&db.pool).await, vec![1, 2]);
    outbox.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untyped_row_that_does_not_decode_still_reaches_the_handler_path_and_its_policy() {
    let (db, outbox) = setup().await;
    publish(&outbox, Orders::Placed { id: 1 }).await;
    foreign_row(&db.pool, None).await;

    let config = fast_halting("untyped-halts").event_types(["Placed"]);
    let handle = outbox.subscribe(config, Record).await.expect("subscribe");
    let (status, halted) = handle
        .wait_for(PATIENCE, |s| s.state == SubscriptionState::Halted)
        .await;
    assert!(halted, "{status:?}");
    assert_eq!(status.position.get(), 1, "stopped at the untyped row");
    outbox.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_an_enum_stores_its_variant_and_publish_typed_overrides_it() {
    let (db, outbox) = setup().await;
    let mut events = outbox.listen_inserted(Start::Beginning);
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(Orders::Placed { id: 1 }).expect("publish");
    tx.publish(Orders::Cancelled { id: 2 }).expect("publish");
    tx.publish_typed(Some("orders.Special"), Orders::Placed { id: 3 })
        .expect("publish_typed");
    tx.publish_typed(None, Orders::Placed { id: 4 })
        .expect("publish_typed");
    tx.commit().await.expect("commit");

    let stored: Vec<Option<String>> =
        sqlx::query_scalar("SELECT event_type FROM ordo.events ORDER BY sequence")
            .fetch_all(&db.pool)
            .await
            .expect("read types");
    let expected = [
        Some("Placed"),
        Some("Cancelled"),
        Some("orders.Special"),
        None,
    ];
    assert_eq!(
        stored,
        expected.map(|t| t.map(str::to_owned)).to_vec(),
        "stored types"
    );
    for want in expected {
        let event = events.next().await.expect("open").expect("event");
        assert_eq!(event.event_type.as_deref(), want, "{event:?}");
    }
    outbox.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_selecting_types_sees_only_those_and_plain_sql_can_set_the_type() {
    let (db, outbox) = setup().await;
    let mut cancelled = outbox.listen_inserted_types(Start::Beginning, ["Cancelled"]);
    publish(&outbox, Orders::Placed { id: 1 }).await;
    publish(&outbox, Orders::Cancelled { id: 2 }).await;
    // A foreign type whose payload `Orders` cannot decode: passed over, not an `Err` item.
    foreign_row(&db.pool, Some("shipping.LabelPrinted")).await;
    sqlx::query("INSERT INTO ordo.events (payload, event_type) VALUES ('{\"Cancelled\": {\"id\": 3}}', 'Cancelled')")
        .execute(&db.pool)
        .await
        .expect("typed plain-SQL row");

    let mut seen = Vec::new();
    let done = tokio::time::timeout(PATIENCE, async {
        while let Some(item) = cancelled.next().await {
            let event = item.expect("no error item");
            seen.push((
                event.sequence.get(),
                event.event_type.clone(),
                event.payload.clone(),
            ));
            if event.payload.id() == 3 {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    assert!(done, "the plain-SQL row arrives: {seen:?}");
    assert_eq!(
        seen,
        vec![
            (2, Some("Cancelled".to_owned()), Orders::Cancelled { id: 2 }),
            (4, Some("Cancelled".to_owned()), Orders::Cancelled { id: 3 }),
        ]
    );
    outbox.shutdown().await;
}

/// Placed 1, then rows of other services' types (one whose payload is not even an object),
/// then Cancelled 2, then another foreign row last: positions 1 to 5.
async fn mixed_rows(db: &TestDb, outbox: &Outbox<Orders>) {
    publish(outbox, Orders::Placed { id: 1 }).await;
    foreign_row(&db.pool, Some("billing.Invoiced")).await;
    sqlx::query("INSERT INTO ordo.events (payload, event_type) VALUES ('\"a bare string\"', 'shipping.Label')")
        .execute(&db.pool)
        .await
        .expect("plain-SQL insert");
    publish(outbox, Orders::Cancelled { id: 2 }).await;
    foreign_row(&db.pool, Some("billing.Invoiced")).await;
}

async fn dead_letters(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM ordo.dead_letters")
        .fetch_one(pool)
        .await
        .expect("dead letters")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_of_an_enum_outbox_takes_only_its_own_types_by_default() {
    let (db, outbox) = setup().await;
    mixed_rows(&db, &outbox).await;
    let handle = outbox
        .subscribe(fast_halting("default"), Record)
        .await
        .expect("subscribe");
    reaches(&handle, 5).await;
    assert_eq!(handled(&db.pool).await, vec![1, 2]);
    assert_eq!(
        dead_letters(&db.pool).await,
        0,
        "skipped, not dead-lettered"
    );
    outbox.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_subscription_of_an_enum_outbox_takes_only_its_own_types_by_default() {
    let (db, outbox) = setup().await;
    mixed_rows(&db, &outbox).await;
    let config = fast_halting("keyed-default").keyed(4);
    let handle = outbox.subscribe(config, Record).await.expect("subscribe");
    reaches(&handle, 5).await;
    assert_eq!(handled(&db.pool).await, vec![1, 2]);
    assert_eq!(
        dead_letters(&db.pool).await,
        0,
        "skipped, not dead-lettered"
    );
    let stalled = ordo::admin::list_stalled_keys(&db.pool, "keyed-default")
        .await
        .expect("stalled keys");
    assert!(stalled.is_empty(), "no key stalled: {stalled:?}");
    outbox.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_types_hands_a_foreign_row_to_the_subscription_as_before() {
    let (db, outbox) = setup().await;
    mixed_rows(&db, &outbox).await;
    let handle = outbox
        .subscribe(fast_halting("everything").all_types(), Record)
        .await
        .expect("subscribe");
    let (status, halted) = handle
        .wait_for(PATIENCE, |s| s.state == SubscriptionState::Halted)
        .await;
    assert!(
        halted,
        "the foreign row does not decode as Orders: {status:?}"
    );
    assert_eq!(status.position.get(), 1, "halted at the first foreign row");
    assert_eq!(handled(&db.pool).await, vec![1]);
    outbox.shutdown().await;
}

/// A row that does not decode fails without a handler: the log says so, and blames no handler.
/// (One thread, so that the runner's lines reach this test's subscriber.)
#[tokio::test(flavor = "current_thread")]
async fn a_row_that_does_not_decode_is_logged_as_such_not_as_a_handler_failure() {
    use tracing_subscriber::layer::SubscriberExt;

    let recorder = common::logs::Recorder::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(recorder.clone()));
    let (db, outbox) = setup().await;
    publish(&outbox, Orders::Placed { id: 1 }).await;
    foreign_row(&db.pool, Some("shipping.LabelPrinted")).await;
    let handle = outbox
        .subscribe(fast_halting("everything").all_types(), Record)
        .await
        .expect("subscribe");
    let (status, halted) = handle
        .wait_for(PATIENCE, |s| s.state == SubscriptionState::Halted)
        .await;
    assert!(halted, "{status:?}");
    outbox.shutdown().await;
    let lines: Vec<String> = recorder
        .events()
        .into_iter()
        .filter(|event| event.level == tracing::Level::WARN)
        .map(|event| event.fields)
        .collect();
    assert!(
        lines.iter().any(|line| line.contains("does not decode")
            && line.contains("no handler ran")
            && line.contains("sequence 2")),
        "{lines:#?}"
    );
    assert!(
        !lines.iter().any(|line| line.contains("handler failed")),
        "{lines:#?}"
    );
}
