//! Least privilege that holds. Each forgery found against the old grants is tried
//! again as every role `ordo grant` makes, on a database owned by a dedicated owner:
//! - rewriting the commit log (its state row, its chunks) is refused by privilege, and the
//!   fold's function appends only what it finds in `ordo.events` over a resolved range;
//! - moving, claiming or adopting another role's subscription, or writing its progress, dead
//!   letters or attempts, is refused by row security;
//! - a relay never runs a subscription's row, nor the reverse.
//!
//! And every legitimate operation of each role still works (publish, fold, checkpoint, relay,
//! operator commands), with the commit lane and every subscription exact afterwards.

use crate::common;

use std::time::Duration;

use common::invariants::{ORDO, check_log};
use common::recording_sink::Recording;
use common::roles::{Roles, denied};
use common::subscribers::Seen;
use common::{Note, eventually};
use futures::StreamExt;
use ordo::relay::RelayConfig;
use ordo::{Envelope, Error, JobConfig, Keys, Ordering, Outbox, OutboxConfig, Start};
use sqlx::PgPool;

const PATIENCE: Duration = Duration::from_secs(30);

fn no_keys(_event: &Envelope<Note>) -> Keys {
    Keys::none()
}

fn relay_config(name: &str) -> RelayConfig {
    RelayConfig::new(name)
        .ordering(Ordering::Insert)
        .batch_size(20)
        .per_event_budget(Duration::from_millis(25))
        .batch_deadline(Duration::from_millis(600))
        .lease(Duration::from_secs(3))
        .backoff(Duration::from_millis(5), Duration::from_millis(50))
}

/// `count` transactions of one event each.
async fn publish(outbox: &Outbox<Note>, writer: u32, count: u32) {
    for n in 0..count {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish(Note { writer, n }).expect("publish");
        tx.commit().await.expect("commit");
    }
}

/// A writer's outbox whose subscription `name` has handled five events and stopped (its lease
/// released), the writer's pool, and what the subscription saw.
async fn writer_with_a_subscription_at_five(
    roles: &Roles,
    name: &str,
) -> (PgPool, Outbox<Note>, Seen) {
    let writer = roles.pool_as(&roles.writer, 6).await;
    let outbox = Outbox::<Note>::new(writer.clone(), OutboxConfig::default())
        .await
        .expect("a writer's outbox");
    let seen = Seen::default();
    let handle = outbox
        .subscribe(JobConfig::new(name), seen.clone())
        .await
        .expect("a writer subscribes");
    publish(&outbox, 1, 5).await;
    let (state, done) = handle.wait_for(PATIENCE, |s| s.position.get() >= 5).await;
    assert!(done, "{state:?}");
    handle.shutdown().await;
    (writer, outbox, seen)
}

/// (last_commit_seq, logged_through_sequence).
async fn fold_state(pool: &PgPool) -> (i64, i64) {
    sqlx::query_as("SELECT last_commit_seq, logged_through_sequence FROM ordo.sequencer_state")
        .fetch_one(pool)
        .await
        .expect("sequencer state")
}

async fn commit_head_reaches(pool: &PgPool, head: i64) -> bool {
    eventually(PATIENCE, || async { fold_state(pool).await.0 >= head }).await
}

async fn stored_position(pool: &PgPool, name: &str) -> i64 {
    sqlx::query_scalar("SELECT position FROM ordo.subscriptions WHERE name = $1")
        .bind(name)
        .fetch_one(pool)
        .await
        .expect("a stored position")
}

/// Whether `result` is the fold function's refusal (SQLSTATE OR001).
fn refused_by_function<T: std::fmt::Debug>(result: Result<T, sqlx::Error>) -> bool {
    match result {
        Err(sqlx::Error::Database(error)) => error.code().as_deref() == Some("OR001"),
        other => panic!("expected the append to be refused, got {other:?}"),
    }
}

/// Whether `result` failed on row security (a new row that violates a policy: 42501).
fn refused_by_policy(result: Result<sqlx::postgres::PgQueryResult, sqlx::Error>) -> bool {
    denied(result)
}

async fn append(
    pool: &PgPool,
    expected: i64,
    new: i64,
) -> Result<Vec<(Option<i64>, Option<i64>)>, sqlx::Error> {
    sqlx::query_as("SELECT commit_seq, sequence FROM ordo.append_commit_log($1, $2)")
        .bind(expected)
        .bind(new)
        .fetch_all(pool)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_role_rewrites_the_commit_log_and_the_fold_appends_only_what_it_verifies() {
    let roles = Roles::new(1_000_000).await;
    let writer = roles.pool_as(&roles.writer, 4).await;
    ten_folded_ten_unfolded_and_a_hole_at_21(&roles, &writer).await;
    every_forgery_of_the_log_is_refused_as_every_role(&roles).await;

    // What a folding role may do through the function is what a fold does: the events of the
    // range, each once, whatever it hoped for.
    let other = roles.pool_as(&roles.other, 1).await;
    let entries = append(&other, 10, 20).await.expect("an append of 11 to 20");
    let appended: Vec<(i64, i64)> = entries
        .iter()
        .filter_map(|(commit_seq, sequence)| Some(((*commit_seq)?, (*sequence)?)))
        .collect();
    assert_eq!(
        appended,
        (11..=20).map(|n| (n, n)).collect::<Vec<(i64, i64)>>()
    );
    assert_eq!(fold_state(&roles.admin).await, (20, 20));
    other.close().await;

    let (sequencer, reader) = the_real_fold_goes_on_and_a_reader_reads_it(&roles, &writer).await;
    for pool in [writer, sequencer, reader] {
        pool.close().await;
    }
}

/// Ten events folded by the writer's own outbox (through the function), then ten more with no
/// sequencer running: the log stops at 10 until a real fold runs. And a sequence drawn and
/// never written: a hole at 21 that nothing has resolved yet.
async fn ten_folded_ten_unfolded_and_a_hole_at_21(roles: &Roles, writer: &PgPool) {
    let outbox = Outbox::<Note>::new(writer.clone(), OutboxConfig::default())
        .await
        .expect("a writer's outbox");
    publish(&outbox, 1, 10).await;
    assert!(
        commit_head_reaches(&roles.admin, 10).await,
        "the writer's fold"
    );
    outbox.shutdown().await;
    let quiet = Outbox::<Note>::new(writer.clone(), OutboxConfig::default().sequencer(false))
        .await
        .expect("an outbox without a sequencer");
    publish(&quiet, 2, 10).await;
    quiet.shutdown().await;
    assert_eq!(fold_state(&roles.admin).await, (10, 10));
    let hole: i64 = sqlx::query_scalar("SELECT nextval('ordo.events_sequence')")
        .fetch_one(writer)
        .await
        .expect("draw a sequence");
    assert_eq!(hole, 21);
}

/// As every role: the forgeries of before refused by privilege, and through the fold's
/// function a cursor it cannot verify refused (or, for a role that may not fold, the function
/// itself); nothing is written.
async fn every_forgery_of_the_log_is_refused_as_every_role(roles: &Roles) {
    let folding = [
        &roles.writer,
        &roles.sequencer,
        &roles.consumer,
        &roles.other,
    ];
    for role in [
        &roles.writer,
        &roles.publisher,
        &roles.sequencer,
        &roles.consumer,
        &roles.reader,
        &roles.other,
    ] {
        let pool = roles.pool_as(role, 1).await;
        // The forgeries of before: moving the cursor past unfolded events, a forged chunk
        // that delivers event 1 twice.
        for sql in [
            "UPDATE ordo.sequencer_state SET logged_through_sequence = 20",
            "UPDATE ordo.sequencer_state SET last_commit_seq = last_commit_seq + 1",
            "INSERT INTO ordo.commit_chunks (first_commit_seq, last_commit_seq, min_sequence, max_sequence, sequences, group_last) \
             VALUES (11, 11, 1, 1, ARRAY[1]::bigint[], ARRAY[true])",
            "UPDATE ordo.commit_chunks SET sequences = sequences",
            "DELETE FROM ordo.commit_chunks",
        ] {
            let result = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&pool).await;
            assert!(denied(result), "{role} ran {sql}");
        }
        // Through the function: a cursor it cannot verify is refused, and nothing is written.
        for (what, expected, new) in [
            ("moves the cursor back", 10, 5),
            ("passes an unresolved hole", 10, 21),
            ("goes above the sequence head", 10, 30),
        ] {
            let result = append(&pool, expected, new).await;
            if folding.contains(&role) {
                assert!(refused_by_function(result), "{role}: an append that {what}");
            } else {
                assert!(denied(result), "{role} may not fold at all ({what})");
            }
        }
        if folding.contains(&role) {
            // Event 1 again, or any range the cursor has passed: the CAS refuses (no row).
            let entries = append(&pool, 0, 10).await.expect("a stale append");
            assert!(entries.is_empty(), "{role} appended again: {entries:?}");
        }
        assert_eq!(fold_state(&roles.admin).await, (10, 10), "after {role}");
        pool.close().await;
    }
}

/// The real fold, by the folding role, goes on from where the function's append left it (the
/// hole resolved, one more event), and the commit lane, as a reader reads it, holds each event
/// once, in the log's order. The sequencer's and the reader's pools.
async fn the_real_fold_goes_on_and_a_reader_reads_it(
    roles: &Roles,
    writer: &PgPool,
) -> (PgPool, PgPool) {
    let sequencer = roles.pool_as(&roles.sequencer, 4).await;
    let folder = Outbox::<Note>::new(sequencer.clone(), OutboxConfig::default())
        .await
        .expect("a sequencer's outbox folds");
    sqlx::query("INSERT INTO ordo.events (payload) VALUES ('{\"writer\": 3, \"n\": 0}')")
        .execute(writer)
        .await
        .expect("a writer publishes by SQL");
    assert!(commit_head_reaches(&roles.admin, 21).await, "the fold");
    folder.shutdown().await;
    check_log(&roles.admin, &ORDO)
        .await
        .expect("the commit log");
    // And the commit lane, as a reader reads it, holds each event once, in the log's order.
    let reader = roles.pool_as(&roles.reader, 2).await;
    let watcher = Outbox::<Note>::new(reader.clone(), OutboxConfig::default().sequencer(false))
        .await
        .expect("a reader's outbox");
    let mut committed = watcher.listen_committed(Start::Beginning);
    let mut sequences = Vec::new();
    for position in 1..=21 {
        let event = tokio::time::timeout(PATIENCE, committed.next())
            .await
            .expect("the commit lane delivers")
            .expect("open")
            .expect("an event");
        assert_eq!(event.commit_sequence.get(), position);
        sequences.push(event.event.sequence.get());
    }
    let mut expected: Vec<u64> = (1..=20).collect();
    expected.push(22);
    assert_eq!(sequences, expected);
    drop(committed);
    watcher.shutdown().await;
    (sequencer, reader)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_folding_roles_race_through_the_function_under_rollbacks_and_savepoints() {
    let roles = Roles::new(1_000_000).await;
    let writer = roles.pool_as(&roles.writer, 6).await;
    let web = Outbox::<Note>::new(writer.clone(), OutboxConfig::default().sequencer(false))
        .await
        .expect("a writer's outbox without a sequencer");
    // Two folding processes of two roles: their appends race on the compare-and-set, each
    // through the function.
    let (a, b) = (
        roles.pool_as(&roles.sequencer, 3).await,
        roles.pool_as(&roles.consumer, 3).await,
    );
    let fold_a = Outbox::<Note>::new(a.clone(), OutboxConfig::default())
        .await
        .expect("the sequencer role folds");
    let fold_b = Outbox::<Note>::new(b.clone(), OutboxConfig::default())
        .await
        .expect("the consumer role folds");
    let mut writers = Vec::new();
    for w in 0..4u32 {
        let (web, pool) = (web.clone(), writer.clone());
        writers.push(tokio::spawn(async move {
            let mut committed = 0u64;
            for n in 0..25u32 {
                let mut tx = pool.begin().await.expect("begin");
                web.publish_in(&mut tx, [Note { writer: w, n }])
                    .await
                    .expect("publish");
                // Every fifth: a second event in a savepoint that is rolled back.
                if n % 5 == 0 {
                    sqlx::query("SAVEPOINT s")
                        .execute(&mut *tx)
                        .await
                        .expect("savepoint");
                    web.publish_in(
                        &mut tx,
                        [Note {
                            writer: w,
                            n: 1000 + n,
                        }],
                    )
                    .await
                    .expect("publish in the savepoint");
                    sqlx::query("ROLLBACK TO SAVEPOINT s")
                        .execute(&mut *tx)
                        .await
                        .expect("roll the savepoint back");
                }
                // Every third: the whole transaction rolled back.
                if n % 3 == 0 {
                    tx.rollback().await.expect("rollback");
                } else {
                    tx.commit().await.expect("commit");
                    committed += 1;
                }
            }
            committed
        }));
    }
    let mut committed = 0;
    for writer in writers {
        committed += writer.await.expect("a writer task");
    }
    assert!(
        commit_head_reaches(&roles.admin, committed as i64).await,
        "the two folds logged {committed} events"
    );
    fold_a.shutdown().await;
    fold_b.shutdown().await;
    web.shutdown().await;
    check_log(&roles.admin, &ORDO)
        .await
        .expect("the commit log");
    assert_eq!(fold_state(&roles.admin).await.0, committed as i64);
    for pool in [writer, a, b] {
        pool.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_cannot_move_claim_or_adopt_another_roles_subscription() {
    let roles = Roles::new(1_000_000).await;
    let (writer, outbox, seen) = writer_with_a_subscription_at_five(&roles, "app").await;

    for role in [&roles.other, &roles.consumer] {
        let pool = roles.pool_as(role, 2).await;
        // Row security hides the row from its writes: nothing matches.
        for sql in [
            "UPDATE ordo.subscriptions SET position = 10 WHERE name = 'app'",
            "UPDATE ordo.subscriptions SET lease_owner = gen_random_uuid(), \
             lease_expires_at = now() + interval '1 hour' WHERE name = 'app'",
            "UPDATE ordo.subscriptions SET role = current_user WHERE name = 'app'",
            "UPDATE ordo.subscriptions SET status = 'halted'",
        ] {
            let done = sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&pool)
                .await
                .unwrap_or_else(|e| panic!("{role}: {sql}: {e}"));
            assert_eq!(done.rows_affected(), 0, "{role} ran {sql}");
        }
        // Rows that belong to it: refused by the policies.
        for sql in [
            "INSERT INTO ordo.subscription_progress (subscription, position, state) VALUES ('app', 7, 'done')",
            "INSERT INTO ordo.dead_letters (subscription, lane, position, sequence, error, attempts) \
             VALUES ('app', 'insert', 6, 6, 'forged', 1)",
            "INSERT INTO ordo.relay_attempts (relay, position, sequence, attempt, error, parked, host, pid, owner) \
             VALUES ('app', 6, 6, 1, 'forged', true, 'h', 1, gen_random_uuid())",
        ] {
            let result = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&pool).await;
            assert!(refused_by_policy(result), "{role} ran {sql}");
        }
        // A row in another role's name, and deleting one.
        let squat = sqlx::query(
            "INSERT INTO ordo.subscriptions (name, lane, role) VALUES ('squat', 'insert', $1)",
        )
        .bind(&roles.writer)
        .execute(&pool)
        .await;
        assert!(
            refused_by_policy(squat),
            "{role} created a row as the writer"
        );
        let removed = sqlx::query("DELETE FROM ordo.subscriptions WHERE name = 'app'")
            .execute(&pool)
            .await;
        assert!(denied(removed), "{role} deleted the writer's subscription");
        // Through ordo: a clear refusal, not a standby that waits for ever.
        let theirs = Outbox::<Note>::new(pool.clone(), OutboxConfig::default().sequencer(false))
            .await
            .expect("an outbox");
        match theirs
            .subscribe(JobConfig::new("app"), Seen::default())
            .await
        {
            Err(Error::NotOwnRow {
                subscription,
                owner,
                connected,
            }) => {
                assert_eq!(subscription, "app");
                assert_eq!(&owner, &roles.writer);
                assert_eq!(&connected, role);
            }
            other => panic!("{role} ran the writer's subscription: {other:?}"),
        }
        theirs.shutdown().await;
        pool.close().await;
    }
    for role in [&roles.publisher, &roles.reader, &roles.sequencer] {
        let pool = roles.pool_as(role, 1).await;
        let moved = sqlx::query("UPDATE ordo.subscriptions SET position = 10 WHERE name = 'app'")
            .execute(&pool)
            .await;
        assert!(denied(moved), "{role} moved a subscription");
        pool.close().await;
    }
    let stored: (i64, Option<String>, Option<String>, i64) = sqlx::query_as(
        "SELECT position, kind, role, (SELECT count(*) FROM ordo.subscription_progress)
             + (SELECT count(*) FROM ordo.dead_letters) + (SELECT count(*) FROM ordo.relay_attempts)
         FROM ordo.subscriptions WHERE name = 'app'",
    )
    .fetch_one(&roles.admin)
    .await
    .expect("the stored row");
    assert_eq!(
        stored,
        (
            5,
            Some("subscription".into()),
            Some(roles.writer.clone()),
            0
        )
    );

    // The writer's subscription is exact: it goes on from 5 and sees every event once.
    let app = outbox
        .subscribe(JobConfig::new("app"), seen.clone())
        .await
        .expect("the writer subscribes again");
    publish(&outbox, 2, 5).await;
    let (state, done) = app.wait_for(PATIENCE, |s| s.position.get() >= 10).await;
    assert!(done, "{state:?}");
    assert_eq!(seen.sequences(), (1..=10).collect::<Vec<u64>>());
    // The operator still administers every row: pause and resume it.
    let operator = roles.pool_as(&roles.operator, 1).await;
    ordo::admin::pause_subscription(&operator, "app")
        .await
        .expect("an operator pauses the writer's subscription");
    ordo::admin::resume_subscription(&operator, "app")
        .await
        .expect("an operator resumes it");
    app.shutdown().await;
    outbox.shutdown().await;
    assert_eq!(stored_position(&roles.admin, "app").await, 10);
    writer.close().await;
    operator.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_never_runs_a_subscriptions_row_nor_the_reverse() {
    let roles = Roles::new(1_000_000).await;
    let (writer, outbox, seen) = writer_with_a_subscription_at_five(&roles, "shared").await;

    // `ordo relay run shared` used to take the row over and move it to the head.
    match outbox
        .relay(relay_config("shared"), Recording::default(), no_keys)
        .await
    {
        Err(error @ Error::KindMismatch { .. }) => {
            let message = error.to_string();
            assert!(
                message.contains("\"shared\"") && message.contains("is a subscription"),
                "{message}"
            );
        }
        other => panic!("a relay ran a subscription's row: {other:?}"),
    }
    assert_eq!(stored_position(&roles.admin, "shared").await, 5);

    let delivered = Recording::default();
    let relay = outbox
        .relay(relay_config("r"), delivered.clone(), no_keys)
        .await
        .expect("a relay");
    let (state, done) = relay.wait_for(PATIENCE, |s| s.position.get() >= 5).await;
    assert!(done, "{state:?}");
    relay.shutdown().await;
    match outbox.subscribe(JobConfig::new("r"), Seen::default()).await {
        Err(Error::KindMismatch {
            stored, requested, ..
        }) => assert_eq!((stored.as_str(), requested), ("relay", "subscription")),
        other => panic!("a subscription ran a relay's row: {other:?}"),
    }
    assert_eq!(stored_position(&roles.admin, "r").await, 5);

    // A row from before kinds and roles were recorded: no role but the owner takes it for
    // itself; an operator assigns it, and then its role runs it.
    sqlx::query("UPDATE ordo.subscriptions SET kind = NULL, role = NULL WHERE name = 'shared'")
        .execute(&roles.admin)
        .await
        .expect("make the row an old one");
    match outbox
        .subscribe(JobConfig::new("shared"), seen.clone())
        .await
    {
        Err(error @ Error::Unadopted { .. }) => {
            let message = error.to_string();
            let adopt = format!("ordo subscriptions adopt shared --role {}", roles.writer);
            assert!(message.contains(&adopt), "{message}");
        }
        other => panic!("the writer took an old row for itself: {other:?}"),
    }
    let operator = roles.pool_as(&roles.operator, 1).await;
    ordo::admin::adopt_subscription(&operator, "shared", &roles.writer)
        .await
        .expect("an operator assigns the old row to the writer");
    operator.close().await;
    let shared = outbox
        .subscribe(JobConfig::new("shared"), seen.clone())
        .await
        .expect("the writer runs the row assigned to it");
    let adopted: (Option<String>, Option<String>) =
        sqlx::query_as("SELECT kind, role FROM ordo.subscriptions WHERE name = 'shared'")
            .fetch_one(&roles.admin)
            .await
            .expect("the adopted row");
    assert_eq!(
        adopted,
        (Some("subscription".into()), Some(roles.writer.clone()))
    );
    publish(&outbox, 2, 1).await;
    let (state, done) = shared.wait_for(PATIENCE, |s| s.position.get() >= 6).await;
    assert!(done, "{state:?}");
    assert_eq!(seen.sequences(), (1..=6).collect::<Vec<u64>>());
    shared.shutdown().await;
    outbox.shutdown().await;
    writer.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_does_its_part_of_a_deployment() {
    let roles = Roles::new(1_000_000).await;
    // The publisher publishes, with its sequencer off.
    let publisher = roles.pool_as(&roles.publisher, 4).await;
    let web = Outbox::<Note>::new(publisher.clone(), OutboxConfig::default().sequencer(false))
        .await
        .expect("a publisher's outbox");
    for n in 0..5 {
        let mut tx = web.begin().await.expect("begin");
        tx.publish_all([Note { writer: n, n: 0 }, Note { writer: n, n: 1 }])
            .expect("publish");
        tx.commit().await.expect("a publisher commits");
    }
    // What a publisher may not do: fold, or run a subscription.
    let folded = sqlx::query("SELECT * FROM ordo.append_commit_log(0, 0)")
        .execute(&publisher)
        .await;
    assert!(denied(folded), "a publisher folded");
    match web.subscribe(JobConfig::new("web"), Seen::default()).await {
        Err(Error::Database(error)) => {
            assert!(denied::<()>(Err(error)), "a publisher subscribed")
        }
        other => panic!("a publisher subscribed: {other:?}"),
    }

    // The folding process folds.
    let sequencer = roles.pool_as(&roles.sequencer, 4).await;
    let fold = Outbox::<Note>::new(sequencer.clone(), OutboxConfig::default())
        .await
        .expect("a sequencer's outbox");
    assert!(commit_head_reaches(&roles.admin, 10).await, "the fold");

    // The consumer runs a subscription on the commit lane and a relay.
    let consumer = roles.pool_as(&roles.consumer, 6).await;
    let worker = Outbox::<Note>::new(consumer.clone(), OutboxConfig::default().sequencer(false))
        .await
        .expect("a consumer's outbox");
    let seen = Seen::default();
    let subscription = worker
        .subscribe(
            JobConfig::new("worker").ordering(Ordering::Commit),
            seen.clone(),
        )
        .await
        .expect("a consumer subscribes");
    let delivered = Recording::default();
    let relay = worker
        .relay(relay_config("worker-relay"), delivered.clone(), no_keys)
        .await
        .expect("a consumer relays");
    let (state, done) = subscription
        .wait_for(PATIENCE, |s| s.position.get() >= 10)
        .await;
    assert!(done, "{state:?}");
    let (state, done) = relay.wait_for(PATIENCE, |s| s.position.get() >= 10).await;
    assert!(done, "{state:?}");
    assert_eq!(seen.sequences(), (1..=10).collect::<Vec<u64>>());
    let mut relayed = delivered.positions();
    relayed.sort_unstable();
    assert_eq!(relayed, (1..=10).collect::<Vec<u64>>());

    // The operator administers the consumer's subscription; the reader watches.
    let operator = roles.pool_as(&roles.operator, 1).await;
    ordo::admin::pause_subscription(&operator, "worker")
        .await
        .expect("an operator pauses");
    ordo::admin::resume_subscription(&operator, "worker")
        .await
        .expect("an operator resumes");
    let reader = roles.pool_as(&roles.reader, 2).await;
    let status = ordo::admin::status(&reader)
        .await
        .expect("a reader's status");
    assert_eq!(status.commit_head.get(), 10);
    assert_eq!(status.subscriptions.len(), 2, "{status:?}");

    subscription.shutdown().await;
    relay.shutdown().await;
    worker.shutdown().await;
    fold.shutdown().await;
    web.shutdown().await;
    check_log(&roles.admin, &ORDO)
        .await
        .expect("the commit log");
    for pool in [publisher, sequencer, consumer, operator, reader] {
        pool.close().await;
    }
}

#[cfg(all(feature = "cli", feature = "nats"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordo_relay_run_refuses_a_subscriptions_row_and_says_so() {
    use std::process::{Command, Stdio};

    let roles = Roles::new(1_000_000).await;
    let (writer, outbox, _) = writer_with_a_subscription_at_five(&roles, "orders").await;
    outbox.shutdown().await;

    // The same role, so only the kind stands in the way.
    let mut child = Command::new(env!("CARGO_BIN_EXE_ordo"))
        .args([
            "relay",
            "run",
            "orders",
            "--sink",
            "nats",
            "--url",
            "nats://127.0.0.1:4222",
            "--subject-prefix",
            "ordo-test-least-privilege",
            "--key-from",
            "none",
            "--batch-size",
            "20",
            "--lease",
            "2s",
            "--batch-deadline",
            "600ms",
            "--per-event-budget",
            "25ms",
            "--backoff-initial",
            "5ms",
            "--backoff-max",
            "50ms",
        ])
        .env(
            "DATABASE_URL",
            common::roles::url_as(&roles.url, &roles.writer),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ordo relay run");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("poll ordo").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ordo relay run took the subscription's row over, and runs");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("ordo's output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "\"orders\" in ordo.subscriptions is a subscription, and a relay may not run it"
        ),
        "{stderr}"
    );
    assert_eq!(stored_position(&roles.admin, "orders").await, 5);
    writer.close().await;
}
