//! An event id is its event's own (2026-12-07): a publisher that inserts a copy of another
//! event's id never gets it sent in place of the real one (a relay sends an id only for the
//! first event stored with it, and refuses the others), `ordo relay attempts` answers for an
//! id two rows share, no role but the owner can overwrite a stored event's id or payload, and
//! `publish_with_id` keeps its retry: after an aborted attempt it publishes, and a mistaken
//! second copy of a committed one is never sent twice.
#![cfg(all(feature = "cli", feature = "nats"))]

use crate::common;

use std::sync::{Arc, Mutex};

use common::TestDb;
use common::brokers::{NATS_ADDR, TestStream, addr, nats_url};
use common::eventually;
use common::keyed::Parcel;
use common::relays::{config, keys};
use common::roles::{Roles, denied, url_as};
use common::subscribers::PATIENCE;
use ordo::relay::nats::NatsSink;
use ordo::relay::{Message, Outcomes, RelayEvent, RelayEventState, SendError, Sink};
use ordo::{Headers, Ordering, Outbox, OutboxConfig, SubscriptionHandle};
use sqlx::PgPool;
use uuid::Uuid;

async fn nats_relay(
    outbox: &Outbox<Parcel>,
    stream: &TestStream,
    name: &str,
) -> SubscriptionHandle {
    let sink = NatsSink::builder(nats_url(addr(NATS_ADDR)))
        .subject_prefix(&stream.prefix)
        .build()
        .expect("sink");
    outbox
        .relay(config(name).ordering(Ordering::Insert), sink, keys)
        .await
        .expect("relay")
}

/// The stream's messages as (Nats-Msg-Id, the parcel's id).
async fn in_stream(stream: &TestStream) -> Vec<(String, u32)> {
    stream
        .messages()
        .await
        .iter()
        .map(|message| {
            let id = message
                .headers
                .get("Nats-Msg-Id")
                .map(ToString::to_string)
                .unwrap_or_default();
            let parcel: Parcel = serde_json::from_slice(&message.payload).expect("a parcel");
            (id, parcel.id)
        })
        .collect()
}

async fn sequence_of(pool: &PgPool, parcel: u32) -> i64 {
    sqlx::query_scalar("SELECT sequence FROM ordo.events WHERE (payload->>'id')::int = $1")
        .bind(i64::from(parcel))
        .fetch_one(pool)
        .await
        .expect("the parcel's sequence")
}

/// The case on JetStream: the real event waits behind a parked one of its key while a
/// publisher's copy of its id, on another key, is ready first. Before, the copy went out, the
/// stream then dropped the real event as a duplicate and the relay counted it delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publishers_copy_of_an_events_id_is_never_sent_in_its_place() {
    let roles = Roles::new(1_000_000).await;
    let writer = roles.pool_as(&roles.writer, 6).await;
    let outbox = Outbox::<Parcel>::new(writer.clone(), OutboxConfig::default())
        .await
        .expect("a writer's outbox");
    let stream = TestStream::new().await;
    let relay = nats_relay(&outbox, &stream, "orders").await;

    // Parcel 1 on key k parks (NATS refuses a header with a line break); parcel 2, the real
    // event, waits behind it.
    sqlx::query(
        "INSERT INTO ordo.events (payload, headers) VALUES ('{\"keys\": [\"k\"], \"id\": 1}', \
         jsonb_build_object('traceparent', \
             '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' || chr(10) || 'x: y'))",
    )
    .execute(&writer)
    .await
    .expect("a row that parks");
    let mut tx = outbox.begin().await.expect("begin");
    let real_id = tx.publish(Parcel::new(2, &["k"])).expect("publish");
    tx.commit().await.expect("commit");
    let (state, parked) = relay
        .wait_for(PATIENCE, |status| !status.stalled.is_empty())
        .await;
    assert!(parked, "{state:?}");

    // A publisher inserts a copy of the real event's id, on a key nothing holds, and parcel 4
    // follows it on that key: once 4 is in the stream, the copy had its turn.
    let publisher = roles.pool_as(&roles.publisher, 1).await;
    sqlx::query(
        "INSERT INTO ordo.events (id, payload) VALUES ($1, '{\"keys\": [\"f\"], \"id\": 3}')",
    )
    .bind(real_id)
    .execute(&publisher)
    .await
    .expect("a publisher may insert any id");
    sqlx::query("INSERT INTO ordo.events (payload) VALUES ('{\"keys\": [\"f\"], \"id\": 4}')")
        .execute(&publisher)
        .await
        .expect("a publisher publishes");
    let reached = eventually(PATIENCE, || async {
        in_stream(&stream)
            .await
            .iter()
            .any(|(_, parcel)| *parcel == 4)
    })
    .await;
    assert!(reached, "{:?}", in_stream(&stream).await);
    let real = real_id.to_string();
    assert!(
        !in_stream(&stream).await.iter().any(|(id, _)| *id == real),
        "the copy was sent in the real event's place: {:?}",
        in_stream(&stream).await
    );
    let (real_at, copy_at) = (sequence_of(&writer, 2).await, sequence_of(&writer, 3).await);

    // `ordo relay attempts` answers for the shared id (as a reader), and says which sequences
    // hold it; asked by the copy's position, it says the copy was refused.
    let reader_url = url_as(&roles.url, &roles.reader);
    let (ok, out, err) = common::ordo_at(&reader_url, &["relay", "attempts", "orders", &real]);
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!(
            "2 events carry this id, at sequences {real_at} (the one relays send) and {copy_at}"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!("position {real_at}, event {real}")),
        "{out}"
    );
    let (ok, out, err) = common::ordo_at(
        &reader_url,
        &["relay", "attempts", "orders", &copy_at.to_string()],
    );
    assert!(ok, "{err}");
    assert!(out.contains("refused, never sent"), "{out}");
    let reader = roles.pool_as(&roles.reader, 1).await;
    let copy = ordo::admin::relay_attempts(&reader, "orders", RelayEvent::Position(copy_at as u64))
        .await
        .expect("the copy's record");
    assert_eq!(copy.state, RelayEventState::Refused);
    assert_eq!(copy.id_holders, vec![real_at as u64, copy_at as u64]);

    // The parked row mended and requeued: the real event goes out, under its id, once.
    relay.shutdown().await;
    sqlx::query("UPDATE ordo.events SET headers = '{}' WHERE (payload->>'id')::int = 1")
        .execute(&roles.admin)
        .await
        .expect("mend the parked row");
    ordo::admin::retry_stalled_keys(&writer, "orders", None)
        .await
        .expect("requeue");
    let relay = nats_relay(&outbox, &stream, "orders").await;
    let all = eventually(PATIENCE, || async { stream.len().await >= 3 }).await;
    let sent = in_stream(&stream).await;
    assert!(all, "{sent:?}");
    let under_real: Vec<u32> = sent
        .iter()
        .filter(|(id, _)| *id == real)
        .map(|(_, parcel)| *parcel)
        .collect();
    assert_eq!(under_real, vec![2], "{sent:?}");
    let mut parcels: Vec<u32> = sent.iter().map(|(_, parcel)| *parcel).collect();
    parcels.sort_unstable();
    assert_eq!(parcels, vec![1, 2, 4], "{sent:?}");
    relay.shutdown().await;
    outbox.shutdown().await;
    for pool in [writer, publisher, reader] {
        pool.close().await;
    }
}

/// Delivers everything, recording each message's (id, insert sequence).
#[derive(Clone, Default)]
struct Ids(Arc<Mutex<Vec<(Uuid, u64)>>>);

impl Ids {
    fn sent(&self) -> Vec<(Uuid, u64)> {
        self.0.lock().map(|sent| sent.clone()).unwrap_or_default()
    }
}

impl Sink for Ids {
    async fn send(&mut self, batch: &[Message], outcomes: &mut Outcomes) -> Result<(), SendError> {
        if let Ok(mut sent) = self.0.lock() {
            sent.extend(batch.iter().map(|m| (m.id, m.sequence.get())));
        }
        (0..batch.len()).for_each(|index| outcomes.delivered(index));
        Ok(())
    }

    async fn reset(&mut self) -> Result<(), SendError> {
        Ok(())
    }

    fn describe(&self) -> String {
        "ids (test)".to_owned()
    }
}

async fn publish_with_id(outbox: &Outbox<Parcel>, id: Uuid, parcel: u32, commit: bool) {
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish_with_id(id, Parcel::new(parcel, &[]), Headers::new())
        .expect("publish");
    if commit {
        tx.commit().await.expect("commit");
    } else {
        tx.rollback().await.expect("rollback");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_with_id_retries_after_an_abort_and_a_second_copy_is_never_sent() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Parcel>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let sink = Ids::default();
    // The commit lane (the default): positions are commit sequences.
    let relay = outbox
        .relay(config("ids"), sink.clone(), keys)
        .await
        .expect("relay");
    let (first, retried) = (Uuid::now_v7(), Uuid::now_v7());
    publish_with_id(&outbox, first, 1, true).await;
    // An attempt that aborted, then its retry under the same id: published once.
    publish_with_id(&outbox, retried, 2, false).await;
    publish_with_id(&outbox, retried, 2, true).await;
    // A retry of a commit that did take effect (the caller did not ask `commit_status`).
    publish_with_id(&outbox, first, 3, true).await;
    publish_with_id(&outbox, Uuid::now_v7(), 4, true).await;
    let (state, done) = relay.wait_for(PATIENCE, |s| s.position.get() >= 4).await;
    assert!(done, "{state:?}");

    let sent = sink.sent();
    let of = |id: Uuid| -> Vec<u64> {
        sent.iter()
            .filter(|(sent, _)| *sent == id)
            .map(|(_, sequence)| *sequence)
            .collect()
    };
    let (one, two, three) = (
        sequence_of(&db.pool, 1).await as u64,
        sequence_of(&db.pool, 2).await as u64,
        sequence_of(&db.pool, 3).await as u64,
    );
    assert_eq!(of(first), vec![one], "{sent:?}");
    assert_eq!(of(retried), vec![two], "{sent:?}");
    assert_eq!(sent.len(), 3, "{sent:?}");

    let copy_position: i64 =
        sqlx::query_scalar("SELECT commit_seq FROM ordo.commit_log WHERE sequence = $1")
            .bind(three as i64)
            .fetch_one(&db.pool)
            .await
            .expect("the copy's commit position");
    let copy =
        ordo::admin::relay_attempts(&db.pool, "ids", RelayEvent::Position(copy_position as u64))
            .await
            .expect("the copy");
    assert_eq!(copy.state, RelayEventState::Refused);
    assert_eq!(copy.id_holders, vec![one, three]);
    let by_id = ordo::admin::relay_attempts(&db.pool, "ids", RelayEvent::Id(first))
        .await
        .expect("asked by the shared id");
    assert_eq!(by_id.state, RelayEventState::Delivered);
    assert_eq!(by_id.event_id, Some(first));
    assert_eq!(by_id.id_holders, vec![one, three]);
    let alone = ordo::admin::relay_attempts(&db.pool, "ids", RelayEvent::Id(retried))
        .await
        .expect("an id of its own");
    assert!(alone.id_holders.is_empty(), "{alone:?}");
    relay.shutdown().await;
    outbox.shutdown().await;
}

/// What the roles may do to stored rows: insert new ones, never change or remove one (the
/// parent table and each partition, directly). Only the owner (and an operator) may.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_role_but_the_owner_overwrites_or_removes_a_stored_event() {
    let roles = Roles::new(10).await;
    let writer = roles.pool_as(&roles.writer, 4).await;
    let outbox = Outbox::<Parcel>::new(writer.clone(), OutboxConfig::default())
        .await
        .expect("a writer's outbox");
    for n in 0..12 {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish(Parcel::new(n, &[])).expect("publish");
        tx.commit().await.expect("commit");
    }
    outbox.shutdown().await;
    let stored = || async {
        sqlx::query_as::<_, (i64, Uuid, Option<serde_json::Value>)>(
            "SELECT sequence, id, payload FROM ordo.events ORDER BY sequence",
        )
        .fetch_all(&roles.admin)
        .await
        .expect("the stored rows")
    };
    let before = stored().await;
    let partitions: Vec<String> = sqlx::query_scalar(
        "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = 'ordo.events'::regclass",
    )
    .fetch_all(&roles.admin)
    .await
    .expect("the partitions");
    assert!(partitions.len() >= 2, "{partitions:?}");
    let mut statements = Vec::new();
    for table in std::iter::once("ordo.events".to_owned()).chain(partitions) {
        statements.extend([
            format!("UPDATE {table} SET id = gen_random_uuid() WHERE sequence = 2"),
            format!("UPDATE {table} SET payload = '{{\"keys\": [], \"id\": 99}}'"),
            format!("DELETE FROM {table} WHERE sequence = 2"),
            format!("TRUNCATE {table}"),
            format!(
                "INSERT INTO {table} (id, payload) VALUES (gen_random_uuid(), '{{}}') \
                 ON CONFLICT (sequence) DO UPDATE SET id = EXCLUDED.id"
            ),
        ]);
    }
    for role in [
        &roles.writer,
        &roles.publisher,
        &roles.consumer,
        &roles.sequencer,
        &roles.reader,
        &roles.other,
    ] {
        let pool = roles.pool_as(role, 1).await;
        for sql in &statements {
            let result = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                .execute(&pool)
                .await;
            assert!(denied(result), "{role} ran {sql}");
        }
        pool.close().await;
    }
    assert_eq!(stored().await, before);
    writer.close().await;
}
