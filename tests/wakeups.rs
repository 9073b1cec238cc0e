//! Cross-process wake-ups go where someone listens: a lone outbox holds them back and sends
//! the one it held as soon as anyone is heard on the channel, a second outbox is woken
//! without the idle resync, and both go on after their LISTEN connections are killed. One test binary with one global recorder (recorders are
//! process-wide), one test.

mod common;

use std::time::Duration;

use common::counters::Counters;
use common::{Note, TestDb};
use futures::StreamExt;
use metrics_util::debugging::{DebuggingRecorder, Snapshotter};
use ordo::{EventStream, Outbox, OutboxConfig, Start, metrics as names};
use sqlx::postgres::PgListener;
use tokio::time::{Instant, timeout};

const PATIENCE: Duration = Duration::from_secs(20);
const CHANNEL: &str = "ordo_events";

/// The sequence a wake-up payload names (`"{sequence} {instance}"`, `"0 …"` for a presence).
fn sequence_of(payload: &str) -> u64 {
    payload
        .split(' ')
        .next()
        .and_then(|first| first.parse().ok())
        .unwrap_or(0)
}

/// Waits on `ear` for a payload naming a sequence at or above `at_least`; the payloads heard.
async fn hear_at_least(ear: &mut PgListener, at_least: u64) -> Vec<String> {
    let mut heard = Vec::new();
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let notification = timeout(left, ear.recv())
            .await
            .unwrap_or_else(|_| panic!("no wake-up at or above {at_least}; heard {heard:?}"))
            .expect("the raw listener's connection");
        heard.push(notification.payload().to_owned());
        if sequence_of(notification.payload()) >= at_least {
            return heard;
        }
    }
}

#[tokio::test]
async fn wake_ups_are_held_while_nobody_listens_and_reach_whoever_appears() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("install the test recorder");
    let db = TestDb::new().await;
    // The idle resync at its longest: a second process learns of a commit from a wake-up or
    // not within this test.
    let slow_resync = OutboxConfig::default()
        .sequencer(false)
        .resync_interval(Duration::from_secs(60));
    let writer: Outbox<Note> = Outbox::new(db.pool.clone(), slow_resync.clone())
        .await
        .expect("start the writer's outbox");
    // A raw LISTEN that says nothing: the writer cannot know of it.
    let mut ear = PgListener::connect_with(&db.pool)
        .await
        .expect("connect the raw listener");
    ear.listen(CHANNEL).await.expect("LISTEN");

    // 1. Alone, once the answers to its greeting had time to come, it holds its wake-ups.
    let mut counters = Counters::default();
    let last = publish_until_a_wake_up_is_held(&writer, &mut counters, &snapshotter).await;

    // 2. Someone says, from SQL, that it listens: the held wake-up goes out at once, with no
    //    commit after it.
    sqlx::query("SELECT pg_notify($1, '0')")
        .bind(CHANNEL)
        .execute(&db.pool)
        .await
        .expect("say that the raw listener listens");
    let heard = hear_at_least(&mut ear, last).await;
    counters.add(&snapshotter);
    assert!(
        counters.get(names::WAKEUPS, Some("sent")) > 0,
        "heard {heard:?} without a wake-up counted as sent"
    );

    // 3. A second outbox greets on connecting: the writer's next commits wake its listener,
    //    whose idle resync is a minute away.
    let reader_pool = db.another_pool(3).await;
    let reader: Outbox<Note> = Outbox::new(reader_pool, slow_resync)
        .await
        .expect("start the reader's outbox");
    let mut events = reader.listen_inserted(Start::After(ordo::EventSequence::new(last)));
    // Its greeting is on the channel once its LISTEN connection is up.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let notification = timeout(left, ear.recv())
            .await
            .expect("the reader's greeting")
            .expect("the raw listener's connection");
        if notification.payload().ends_with(" hello") {
            break;
        }
    }
    each_commit_reaches_the_reader(&writer, &mut events, 0..40).await;

    // 4. Both outboxes' LISTEN connections are killed: each greets again once reconnected, and
    //    the writer's commits go on reaching the reader without its idle resync.
    kill_both_listen_connections_and_hear_both_greet_again(&db, &mut ear).await;
    each_commit_reaches_the_reader(&writer, &mut events, 40..60).await;
    writer.shutdown().await;
    reader.shutdown().await;
}

/// Publishes one event at a time until the writer counts a wake-up held back: the last
/// sequence it published.
async fn publish_until_a_wake_up_is_held(
    writer: &Outbox<Note>,
    counters: &mut Counters,
    snapshotter: &Snapshotter,
) -> u64 {
    let deadline = Instant::now() + PATIENCE;
    let mut last = 0;
    for n in 0.. {
        let mut tx = writer.begin().await.expect("begin");
        tx.publish(Note { writer: 1, n }).expect("publish");
        last = tx.commit().await.expect("commit")[0].get();
        counters.add(snapshotter);
        if counters.get(names::WAKEUPS, Some("held")) > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no wake-up was ever held back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    last
}

/// Each of the writer's transactions `ns` (one event each, of writer 2) reaches the reader's
/// `events` (its idle resync a minute away). Past the reader's answer window too: what carries
/// them later is the presence each outbox says every second.
async fn each_commit_reaches_the_reader(
    writer: &Outbox<Note>,
    events: &mut EventStream<Note>,
    ns: std::ops::Range<u32>,
) {
    for n in ns {
        let mut tx = writer.begin().await.expect("begin");
        tx.publish(Note { writer: 2, n }).expect("publish");
        let sequence = tx.commit().await.expect("commit")[0];
        let event = timeout(PATIENCE, events.next())
            .await
            .unwrap_or_else(|_| panic!("event {n} never reached the second outbox"))
            .expect("the stream goes on")
            .expect("an event");
        assert_eq!(event.sequence, sequence);
        assert_eq!(event.payload, Note { writer: 2, n });
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Kills the writer's and the reader's LISTEN connections; each greets again once reconnected.
async fn kill_both_listen_connections_and_hear_both_greet_again(db: &TestDb, ear: &mut PgListener) {
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND application_name = 'ordo.listen') AS k",
    )
    .fetch_one(&db.pool)
    .await
    .expect("terminate the LISTEN connections");
    assert_eq!(
        killed, 2,
        "the writer's and the reader's LISTEN connections"
    );
    let mut greeters = std::collections::BTreeSet::new();
    let deadline = Instant::now() + PATIENCE;
    while greeters.len() < 2 {
        let left = deadline.saturating_duration_since(Instant::now());
        let notification = timeout(left, ear.recv())
            .await
            .unwrap_or_else(|_| panic!("greetings after the reconnect: {greeters:?}"))
            .expect("the raw listener's connection");
        if let Some(instance) = notification.payload().strip_suffix(" hello") {
            greeters.insert(instance.to_owned());
        }
    }
}
