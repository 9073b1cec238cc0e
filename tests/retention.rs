//! Retention: partitions are created ahead and dropped in lock-step (events with their log
//! rows), never below what a subscription still needs, never splitting a transaction; the log
//! stays dense above the new floor; reading below it is a clear error.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Note, TestDb, eventually};
use futures::StreamExt;
use ordo::admin::run_retention;
use ordo::{
    Delivery, Error, HandlerError, JobConfig, Outbox, OutboxConfig, RetentionConfig, Start,
};
use sqlx::{PgConnection, PgPool};

struct Counts;

impl ordo::Subscriber<Note> for Counts {
    async fn handle(
        &self,
        _tx: &mut PgConnection,
        _event: &Delivery<Note>,
    ) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// The log above the floor is dense and holds exactly the remaining real events, each group
/// whole.
async fn check_log_after_retention(pool: &PgPool) {
    let (floor, head, rows, min, max): (i64, i64, i64, Option<i64>, Option<i64>) = sqlx::query_as(
        "SELECT p.commit_floor, s.last_commit_seq, (SELECT count(*) FROM ordo.commit_log),
                (SELECT min(commit_seq) FROM ordo.commit_log), (SELECT max(commit_seq) FROM ordo.commit_log)
         FROM ordo.partitioning p, ordo.sequencer_state s",
    )
    .fetch_one(pool)
    .await
    .expect("log state");
    assert_eq!(rows, head - floor, "dense above the floor");
    if rows > 0 {
        assert_eq!((min, max), (Some(floor + 1), Some(head)));
    }
    let (real, unlogged, split): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM ordo.events WHERE payload IS NOT NULL),
                (SELECT count(*) FROM ordo.events e WHERE e.payload IS NOT NULL
                   AND NOT EXISTS (SELECT 1 FROM ordo.commit_log l WHERE l.sequence = e.sequence)),
                (SELECT count(*) FROM ordo.commit_log l WHERE NOT EXISTS (SELECT 1 FROM ordo.events e WHERE e.sequence = l.sequence))",
    )
    .fetch_one(pool)
    .await
    .expect("completeness");
    assert_eq!(
        (real, unlogged, split),
        (rows, 0, 0),
        "log and events dropped together"
    );
    let first_group_whole: bool = sqlx::query_scalar(
        "SELECT coalesce(bool_and(g.n = (SELECT count(*) FROM ordo.events e WHERE e.commit_xid = g.xid)), true)
         FROM (SELECT e.commit_xid AS xid, count(*) AS n FROM ordo.commit_log l JOIN ordo.events e USING (sequence)
               GROUP BY e.commit_xid) g",
    )
    .fetch_one(pool)
    .await
    .expect("groups");
    assert!(first_group_whole, "every remaining group is whole");
}

async fn partition_names(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = 'ordo.events'::regclass ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .expect("partitions")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_partitions_survive_while_a_slow_subscription_needs_them_and_go_after() {
    let db = TestDb::with_partition_size(Some(100)).await;
    let config = OutboxConfig::default().maintenance_interval(Duration::from_millis(200));
    let outbox = Outbox::<Note>::new(db.pool.clone(), config)
        .await
        .expect("outbox");
    // Room for the burst below, made before it (the maintainer reacts within 250 ms, slower
    // than this test writes).
    run_retention(&db.pool, &RetentionConfig::new().ahead(6))
        .await
        .expect("partitions ahead");
    write_510_events_one_transaction_straddling_401(&db, &outbox).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            outbox.commit_head().get() == 510
        })
        .await
    );
    // The outbox's maintainer created partitions ahead of the head.
    assert!(
        eventually(Duration::from_secs(10), || async {
            partition_names(&db.pool)
                .await
                .contains(&"events_701".to_owned())
        })
        .await,
        "partitions ahead: {:?}",
        partition_names(&db.pool).await
    );

    // A slow subscription sits at 150.
    let slow = outbox
        .subscribe(JobConfig::new("slow"), Counts)
        .await
        .expect("subscribe");
    slow.shutdown().await;
    sqlx::query("UPDATE ordo.subscriptions SET position = 150 WHERE name = 'slow'")
        .execute(&db.pool)
        .await
        .expect("position");
    let keep_nothing = RetentionConfig::new().keep(Duration::ZERO);
    let report = run_retention(&db.pool, &keep_nothing)
        .await
        .expect("retention");
    assert_eq!(report.dropped, vec!["events_p0".to_owned()], "{report:#?}");
    assert!(report.needed_by.contains("slow"), "{}", report.needed_by);
    assert_eq!((report.events_floor, report.commit_floor), (101, 100));
    check_log_after_retention(&db.pool).await;
    let kept = &report.partitions[1];
    assert!(!kept.drop && kept.reason.contains("slow"), "{kept:?}");

    reading_below_the_floor_is_a_clear_error(&outbox).await;
    once_passed_they_go_but_a_straddled_partition(&db, &keep_nothing).await;

    // The lanes and the sequencer keep going above the floor.
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(Note { writer: 7, n: 7 }).expect("publish");
    tx.commit().await.expect("commit");
    assert!(
        eventually(Duration::from_secs(10), || async {
            outbox.commit_head().get() == 511
        })
        .await
    );
    check_log_after_retention(&db.pool).await;
}

/// 39 transactions of 10: sequences 1..=390, groups never cross a multiple of 100. One
/// transaction straddles 401: 391..=395, then (after ten others) 406..=410. Then 20
/// transactions of 5: up to 510.
async fn write_510_events_one_transaction_straddling_401(db: &TestDb, outbox: &Outbox<Note>) {
    for n in 0..39u32 {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish_all((0..10).map(|k| Note { writer: n, n: k }))
            .expect("publish");
        tx.commit().await.expect("commit");
    }
    let mut long = db.pool.begin().await.expect("begin");
    outbox
        .publish_in(&mut long, (0..5).map(|k| Note { writer: 99, n: k }))
        .await
        .expect("first half");
    for n in 0..10u32 {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish(Note {
            writer: 100 + n,
            n: 0,
        })
        .expect("publish");
        tx.commit().await.expect("commit");
    }
    outbox
        .publish_in(&mut long, (5..10).map(|k| Note { writer: 99, n: k }))
        .await
        .expect("second half");
    long.commit().await.expect("commit");
    for n in 0..20u32 {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish_all((0..5).map(|k| Note {
            writer: 200 + n,
            n: k,
        }))
        .expect("publish");
        tx.commit().await.expect("commit");
    }
}

/// Reading below the floor (101) is a clear error, on both lanes; from the floor, it reads.
async fn reading_below_the_floor_is_a_clear_error(outbox: &Outbox<Note>) {
    let first = outbox
        .listen_inserted(Start::Beginning)
        .next()
        .await
        .expect("an item");
    assert!(
        matches!(
            first,
            Err(Error::BelowRetentionFloor {
                lane: ordo::Ordering::Insert,
                requested: 1,
                floor: 101
            })
        ),
        "{first:?}"
    );
    let first = outbox
        .listen_committed(Start::Beginning)
        .next()
        .await
        .expect("an item");
    assert!(
        matches!(
            first,
            Err(Error::BelowRetentionFloor {
                lane: ordo::Ordering::Commit,
                ..
            })
        ),
        "{first:?}"
    );
    let from_floor = outbox
        .listen_inserted(Start::After(ordo::EventSequence::new(100)))
        .next()
        .await;
    assert_eq!(
        from_floor
            .expect("an item")
            .expect("an event")
            .sequence
            .get(),
        101
    );
}

/// Once the subscription has passed them, the old partitions go, except where a transaction
/// straddles, and that transaction is still whole.
async fn once_passed_they_go_but_a_straddled_partition(
    db: &TestDb,
    keep_nothing: &RetentionConfig,
) {
    sqlx::query("UPDATE ordo.subscriptions SET position = 510 WHERE name = 'slow'")
        .execute(&db.pool)
        .await
        .expect("position");
    let report = run_retention(&db.pool, keep_nothing)
        .await
        .expect("retention");
    assert_eq!(
        report.dropped,
        vec!["events_101".to_owned(), "events_201".to_owned()],
        "{report:#?}"
    );
    let straddled = report
        .partitions
        .iter()
        .find(|p| p.name == "events_301")
        .expect("listed");
    assert!(
        !straddled.drop && straddled.reason.contains("both sides of 401"),
        "{straddled:?}"
    );
    let after = report
        .partitions
        .iter()
        .find(|p| p.name == "events_401")
        .expect("listed");
    assert!(
        !after.drop,
        "nothing above a kept partition goes: {after:?}"
    );
    assert_eq!(report.events_floor, 301);
    check_log_after_retention(&db.pool).await;
    // The straddling transaction is still whole: its ten events.
    let whole: i64 =
        sqlx::query_scalar("SELECT count(*) FROM ordo.events WHERE payload->>'writer' = '99'")
            .fetch_one(&db.pool)
            .await
            .expect("count");
    assert_eq!(whole, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_database_migrates_to_partitions_without_recreation() {
    // A database at the unpartitioned schema (the first three migrations), with history.
    let name = format!("ordo_test_{}", uuid::Uuid::new_v4().simple());
    let admin = PgPool::connect(common::server_url()).await.expect("admin");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&admin)
        .await
        .expect("create");
    let url = common::with_database(common::server_url(), &name);
    let pool = PgPool::connect(&url).await.expect("pool");
    ordo::migrator()
        .run_to(20261129000003, &pool)
        .await
        .expect("migrate to the unpartitioned schema");
    sqlx::query(
        "INSERT INTO ordo.events (payload) SELECT jsonb_build_object('writer', g, 'n', 0) FROM generate_series(1, 250) g",
    )
    .execute(&pool)
    .await
    .expect("history");
    ordo::migrate(&pool).await.expect("migrate forward");
    let (events, partitioned): (i64, bool) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM ordo.events), (SELECT relkind = 'p' FROM pg_class WHERE oid = 'ordo.events'::regclass)",
    )
    .fetch_one(&pool)
    .await
    .expect("after");
    assert_eq!((events, partitioned), (250, true));
    let outbox = Outbox::<Note>::new(pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(Note { writer: 1, n: 1 }).expect("publish");
    tx.commit().await.expect("commit");
    assert!(
        eventually(Duration::from_secs(20), || async {
            outbox.commit_head().get() == 251
        })
        .await
    );
    outbox.shutdown().await;
    pool.close().await;
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE {name} WITH (FORCE)"
    )))
    .execute(&admin)
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_maintenance_gives_way_to_a_long_transaction_instead_of_queueing_writers() {
    let db = TestDb::with_partition_size(Some(100)).await;
    // A long transaction holds ordo.events (it wrote an event and has not committed).
    let mut long = db.pool.begin().await.expect("begin");
    sqlx::query(r#"INSERT INTO ordo.events (payload) VALUES ('{"writer": 1, "n": 1}')"#)
        .execute(&mut *long)
        .await
        .expect("insert");
    // Creating partitions needs an exclusive lock on the parent: each try gives up quickly
    // (lock timeout) rather than wait, which would queue every writer behind it; the run gives
    // up once its deadline has passed.
    let config = RetentionConfig::new()
        .ahead(5)
        .retry_for(Duration::from_secs(1));
    let pool = db.pool.clone();
    let run = tokio::spawn(async move { run_retention(&pool, &config).await });
    // Writers are never queued for long behind it: others commit while it tries.
    for n in 0..5 {
        tokio::time::timeout(
            Duration::from_secs(10),
            sqlx::query("INSERT INTO ordo.events (payload) VALUES (jsonb_build_object('writer', 2, 'n', $1::int))")
                .bind(n)
                .execute(&db.pool),
        )
        .await
        .expect("a writer is not queued behind the maintenance")
        .expect("insert");
    }
    let run = tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("the run ends at its deadline")
        .expect("the run did not panic");
    match run {
        Err(Error::Database(sqlx::Error::Database(error))) => {
            assert_eq!(
                error.code().as_deref(),
                Some("55P03"),
                "lock_not_available: {error}"
            )
        }
        other => panic!("expected a lock timeout, got {other:?}"),
    }
    long.commit().await.expect("commit");
    let report = run_retention(&db.pool, &RetentionConfig::new().ahead(5))
        .await
        .expect("retention");
    assert!(
        !report.created.is_empty(),
        "created once the long transaction ended"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_waits_out_a_busy_table_within_its_deadline_instead_of_giving_up() {
    let db = TestDb::with_partition_size(Some(100)).await;
    let mut busy = db.pool.begin().await.expect("begin");
    sqlx::query(r#"INSERT INTO ordo.events (payload) VALUES ('{"writer": 1, "n": 1}')"#)
        .execute(&mut *busy)
        .await
        .expect("insert");
    let pool = db.pool.clone();
    let mut run =
        tokio::spawn(async move { run_retention(&pool, &RetentionConfig::new().ahead(4)).await });
    // Many lock timeouts pass while the table is busy; the run keeps trying (it used to give up
    // after three).
    let early = tokio::time::timeout(Duration::from_millis(1500), &mut run).await;
    assert!(
        early.is_err(),
        "the run ended while the table was still busy: {early:?}"
    );
    busy.commit().await.expect("commit");
    let report = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the run ends once the table is free")
        .expect("no panic")
        .expect("retention succeeds once the table is free");
    assert_eq!(report.created.len(), 2, "{report:#?}");
    assert_eq!(report.partitions_ahead, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_is_dropped_only_once_every_event_in_it_committed_longer_ago_than_keep() {
    let db = TestDb::with_partition_size(Some(100)).await;
    // Seals are recorded by the runs below only (the three partitions the migration made hold
    // every event of this test).
    let config = OutboxConfig::default().partition_maintenance(false);
    let outbox = Outbox::<Note>::new(db.pool.clone(), config)
        .await
        .expect("outbox");
    // A transaction starts early (its `recorded_at` is its start)...
    let mut long = db.pool.begin().await.expect("begin");
    let _: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut *long)
        .await
        .expect("started");
    // ...others publish sequences 1..=99 meanwhile...
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish_all((0..99).map(|n| Note { writer: 1, n }))
        .expect("publish");
    tx.commit().await.expect("commit");
    // ...and it publishes last, as the docs advise, once it is a few seconds old: sequence 100,
    // the last of the first partition.
    assert!(
        eventually(Duration::from_secs(10), || async {
            long_age(&db.pool).await > 3.0
        })
        .await
    );
    let sequences = outbox
        .publish_in(&mut long, [Note { writer: 2, n: 0 }])
        .await
        .expect("publish last");
    assert_eq!(sequences[0].get(), 100);
    long.commit().await.expect("commit");
    // The head moves into the next partition, and every lane passes the first one.
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish_all((0..50).map(|n| Note { writer: 3, n }))
        .expect("publish");
    tx.commit().await.expect("commit");
    assert!(
        eventually(Duration::from_secs(20), || async {
            outbox.commit_head().get() == 150
        })
        .await
    );

    // `keep` is shorter than the long transaction's age since its start, longer than its age
    // since its commit: the partition stays.
    let keep = RetentionConfig::new().keep(Duration::from_secs(2));
    let report = run_retention(&db.pool, &keep).await.expect("retention");
    assert!(report.dropped.is_empty(), "{report:#?}");
    let first = &report.partitions[0];
    assert!(
        !first.drop && first.reason.contains("within retention"),
        "{first:?}"
    );
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM ordo.events WHERE sequence <= 100")
        .fetch_one(&db.pool)
        .await
        .expect("count");
    assert_eq!(events, 100, "nothing younger than keep was dropped");

    // Once the partition has been sealed longer than `keep`, it goes.
    let last = std::sync::Mutex::new(None);
    assert!(
        eventually(Duration::from_secs(30), || async {
            let report = run_retention(&db.pool, &keep).await.expect("retention");
            let done = report.dropped == vec!["events_p0".to_owned()];
            *last.lock().expect("not poisoned") = Some(report);
            done
        })
        .await,
        "{last:#?}"
    );
    check_log_after_retention(&db.pool).await;
    outbox.shutdown().await;
}

/// How long the oldest open transaction in this database has run, in seconds.
async fn long_age(pool: &PgPool) -> f64 {
    sqlx::query_scalar(
        "SELECT coalesce(max(date_part('epoch', clock_timestamp() - xact_start)), 0)::float8
         FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_one(pool)
    .await
    .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_refuses_a_pool_of_one_connection_naming_the_setting_and_the_minimum() {
    let db = TestDb::new().await;
    let pool = db.another_pool(1).await;
    let refused = tokio::time::timeout(
        Duration::from_secs(20),
        Outbox::<Note>::new(pool, OutboxConfig::default()),
    )
    .await
    .expect("refused at once, not stuck");
    match refused {
        Err(Error::InvalidConfig { setting, reason }) => {
            assert!(setting.contains("max_connections"), "{setting}");
            assert!(
                reason.contains(&format!("at least {}", ordo::MIN_POOL_CONNECTIONS)),
                "{reason}"
            );
        }
        Err(other) => panic!("expected InvalidConfig, got {other}"),
        Ok(_) => panic!("a pool of one connection was accepted"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_on_the_smallest_pool_publishes_and_delivers_on_both_lanes() {
    const EVENTS: usize = 30;
    let db = TestDb::new().await;
    let pool = db.another_pool(ordo::MIN_POOL_CONNECTIONS).await;
    let run = async {
        let outbox = Outbox::<Note>::new(pool.clone(), OutboxConfig::default())
            .await
            .expect("outbox");
        let mut inserted = outbox.listen_inserted(Start::Beginning);
        let mut committed = outbox.listen_committed(Start::Beginning);
        let subscription = outbox
            .subscribe(JobConfig::new("small-pool"), Counts)
            .await
            .expect("subscribe");
        for n in 0..EVENTS as u32 {
            let mut tx = outbox.begin().await.expect("begin");
            tx.publish(Note { writer: 1, n }).expect("publish");
            tx.commit().await.expect("commit");
        }
        for n in 0..EVENTS as u32 {
            let event = inserted.next().await.expect("item").expect("event");
            assert_eq!(event.payload.n, n);
            let event = committed.next().await.expect("item").expect("event");
            assert_eq!(event.event.payload.n, n);
        }
        assert!(
            eventually(Duration::from_secs(30), || async {
                ordo::admin::list_subscriptions(&pool)
                    .await
                    .is_ok_and(|rows| rows.iter().any(|r| r.position.get() == EVENTS as u64))
            })
            .await,
            "the subscription handled every event"
        );
        subscription.shutdown().await;
        outbox.shutdown().await;
    };
    // Not a timing assert: a generous bound that only a stall (the pool waiting out its
    // acquire timeout, or for ever) exceeds.
    tokio::time::timeout(Duration::from_secs(25), run)
        .await
        .expect("publishing and delivery on a pool of the minimum size must not stall");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_never_fail_for_want_of_a_partition_and_retention_folds_the_overflow_back() {
    let db = TestDb::with_partition_size(Some(100)).await;
    // No maintainer creates partitions: the migration's three cover sequences 1..=300.
    let config = OutboxConfig::default().partition_maintenance(false);
    let outbox = Outbox::<Note>::new(db.pool.clone(), config)
        .await
        .expect("outbox");
    let mut inserted = outbox.listen_inserted(Start::Beginning);
    let mut committed = outbox.listen_committed(Start::Beginning);
    // 400 events, half through the outbox, half by plain SQL, in transactions of ten.
    for n in 0..20u32 {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish_all((0..10).map(|k| Note { writer: n, n: k }))
            .expect("publish");
        tx.commit()
            .await
            .expect("an outbox write past the partitions succeeds");
        sqlx::query(
            "INSERT INTO ordo.events (payload)
             SELECT jsonb_build_object('writer', 1000 + $1::int, 'n', g) FROM generate_series(0, 9) AS g",
        )
        .bind(n as i32)
        .execute(&db.pool)
        .await
        .expect("a plain-SQL write past the partitions succeeds");
    }
    let plan = ordo::admin::plan_retention(&db.pool, &RetentionConfig::new())
        .await
        .expect("plan");
    assert_eq!(
        (plan.default_rows, plan.partitions_ahead),
        (100, 0),
        "{plan:#?}"
    );
    assert!(
        plan.warning
            .as_deref()
            .is_some_and(|w| w.contains("events_default")),
        "{plan:#?}"
    );

    // Both lanes deliver everything, each once, in order.
    let mut delivered = Vec::new();
    for _ in 0..400 {
        let event = inserted.next().await.expect("item").expect("event");
        delivered.push(event.sequence.get());
    }
    assert_eq!(delivered, (1..=400).collect::<Vec<_>>());
    let mut logged = std::collections::HashSet::new();
    for expected in 1..=400u64 {
        let item = committed.next().await.expect("item").expect("event");
        assert_eq!(item.commit_sequence.get(), expected);
        assert!(logged.insert(item.event.sequence.get()), "repeated");
    }

    // Retention folds the default partitions' rows into a range partition pair and goes on.
    let report = run_retention(&db.pool, &RetentionConfig::new())
        .await
        .expect("retention");
    assert_eq!(report.folded, vec!["events_301".to_owned()], "{report:#?}");
    assert_eq!(report.default_rows, 0, "{report:#?}");
    assert!(
        report.partitions_ahead >= 2 && report.warning.is_none(),
        "{report:#?}"
    );
    // The log is not partitioned (chunks); its entries for the folded events stay as they are.
    let placed: (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM ordo.events_301),
                (SELECT count(*) FROM ordo.commit_log WHERE sequence BETWEEN 301 AND 400),
                (SELECT count(*) FROM ordo.events_default)",
    )
    .fetch_one(&db.pool)
    .await
    .expect("placement");
    assert_eq!(placed, (100, 100, 0));
    let names = partition_names(&db.pool).await;
    assert!(names.contains(&"events_401".to_owned()), "{names:?}");

    // Nothing lost or repeated, and the lanes go on past the fold.
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish_all((0..10).map(|k| Note { writer: 77, n: k }))
        .expect("publish");
    tx.commit().await.expect("commit");
    for expected in 401..=410u64 {
        let event = inserted.next().await.expect("item").expect("event");
        assert_eq!(event.sequence.get(), expected);
        let item = committed.next().await.expect("item").expect("event");
        assert_eq!(item.commit_sequence.get(), expected);
    }
    let (events, distinct): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT sequence) FROM ordo.events")
            .fetch_one(&db.pool)
            .await
            .expect("count");
    assert_eq!((events, distinct), (410, 410));
    assert!(
        common::invariants::log_reaches(&db.pool, 410).await,
        "the log holds what the listener heard"
    );
    common::invariants::check_log(&db.pool, &common::invariants::ORDO)
        .await
        .expect("the commit log's invariants");
    outbox.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_many_partitions_ahead_holds_a_writer_for_one_step_at_most_not_the_run() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let db = TestDb::with_partition_size(Some(100)).await;
    let refused = run_retention(&db.pool, &RetentionConfig::new().ahead(ordo::MAX_AHEAD + 1)).await;
    assert!(
        matches!(&refused, Err(Error::InvalidConfig { setting, .. }) if setting.contains("ahead")),
        "{refused:?}"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (pool, stop) = (db.pool.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut longest = Duration::ZERO;
            let mut writes = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let began = tokio::time::Instant::now();
                sqlx::query(
                    r#"INSERT INTO ordo.events (payload) VALUES ('{"writer": 1, "n": 0}')"#,
                )
                .execute(&pool)
                .await
                .expect("insert");
                longest = longest.max(began.elapsed());
                writes += 1;
            }
            (longest, writes)
        })
    };
    assert!(
        eventually(Duration::from_secs(10), || async {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM ordo.events")
                .fetch_one(&db.pool)
                .await
                .is_ok_and(|n| n > 0)
        })
        .await
    );
    let began = tokio::time::Instant::now();
    let report = run_retention(&db.pool, &RetentionConfig::new().ahead(ordo::MAX_AHEAD))
        .await
        .expect("retention");
    let run = began.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (longest, writes) = writer.await.expect("writer");
    assert!(report.created.len() >= 90, "{}", report.created.len());
    assert!(writes > 1, "the writer kept writing during the run");
    // Structural, not a micro-timing: one transaction for the whole run held the writer for
    // nearly all of it; one per partition holds it for a step.
    assert!(
        longest < run / 2,
        "a single insert waited {longest:?} during a run of {run:?}"
    );
}

/// Counts the maintainer's warnings that its role may not run DDL, and its quiet retries.
#[derive(Default)]
struct DeniedLog {
    warnings: std::sync::atomic::AtomicUsize,
    retries: std::sync::atomic::AtomicUsize,
}

struct DeniedLayer(Arc<DeniedLog>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for DeniedLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        let counter = if message.0.contains("may not create or drop partitions") {
            &self.0.warnings
        } else if message.0.contains("still not allowed") {
            &self.0.retries
        } else {
            return;
        };
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_whose_role_may_not_create_partitions_says_so_once_and_keeps_delivering() {
    use std::sync::atomic::Ordering::Relaxed;
    use tracing_subscriber::layer::SubscriberExt;
    let log = Arc::new(DeniedLog::default());
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(DeniedLayer(Arc::clone(&log))),
    )
    .expect("the only global subscriber of this binary");

    let db = TestDb::with_partition_size(Some(100)).await;
    // An application role: it may read and write ordo's tables (the partitioned parents, not
    // their partitions, not the seals), not own them.
    let role = format!("ordo_app_{}", uuid::Uuid::new_v4().simple());
    for statement in [
        format!("CREATE ROLE {role} LOGIN"),
        // The writer role of docs/operations.md: everything an Outbox needs, no DDL.
        format!("SELECT ordo.grant_writer('{role}')"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(&db.pool)
            .await
            .expect("the application role");
    }
    let options: sqlx::postgres::PgConnectOptions = db.url.parse().expect("url");
    let app_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options.username(&role))
        .await
        .expect("connect as the application role");
    let config = OutboxConfig::default().maintenance_interval(Duration::from_millis(200));
    let outbox = Outbox::<Note>::new(app_pool.clone(), config)
        .await
        .expect("outbox");
    let mut committed = outbox.listen_committed(Start::Beginning);
    // Past the three partitions the migration made: the maintainer tries, is refused, and
    // the writes land in the default partition.
    for n in 0..40u32 {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish_all((0..10).map(|k| Note { writer: n, n: k }))
            .expect("publish");
        tx.commit().await.expect("commit");
    }
    for expected in 1..=400u64 {
        let item = committed.next().await.expect("item").expect("event");
        assert_eq!(item.commit_sequence.get(), expected);
    }
    assert!(
        eventually(Duration::from_secs(10), || async {
            log.warnings.load(Relaxed) > 0
        })
        .await,
        "the maintainer says its role may not create partitions"
    );
    // Several refused runs later, it has not said it again.
    assert!(
        eventually(Duration::from_secs(20), || async {
            log.retries.load(Relaxed) >= 3
        })
        .await,
        "the maintainer goes on trying at its interval"
    );
    assert_eq!(log.warnings.load(Relaxed), 1);
    let report = ordo::admin::plan_retention(&app_pool, &RetentionConfig::new())
        .await
        .expect("plan");
    assert_eq!(report.default_rows, 100, "{report:#?}");
    assert!(report.warning.is_some(), "{report:#?}");

    // An operator role folds them; nothing is lost.
    let folded = run_retention(&db.pool, &RetentionConfig::new())
        .await
        .expect("retention as the owner");
    assert_eq!(folded.folded, vec!["events_301".to_owned()], "{folded:#?}");
    outbox.shutdown().await;
    app_pool.close().await;
    let owned = format!("DROP OWNED BY {role}");
    let _ = sqlx::query(sqlx::AssertSqlSafe(owned))
        .execute(&db.pool)
        .await;
    drop(db);
    let admin = PgPool::connect(common::server_url()).await.expect("admin");
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP ROLE IF EXISTS {role}")))
        .execute(&admin)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_partition_trims_the_log_chunk_that_straddles_it() {
    let db = TestDb::with_partition_size(Some(100)).await;
    // 120 single-event transactions while nobody folds...
    let writer = Outbox::<Note>::new(
        db.pool.clone(),
        OutboxConfig::default()
            .sequencer(false)
            .partition_maintenance(false),
    )
    .await
    .expect("writer");
    for n in 0..120 {
        let mut tx = writer.begin().await.expect("begin");
        tx.publish(Note { writer: 1, n }).expect("publish");
        tx.commit().await.expect("commit");
    }
    writer.shutdown().await;
    // ...then one fold appends them all: one chunk, sequences 1..=120, across the partition
    // boundary at 101.
    let folder = Outbox::<Note>::new(
        db.pool.clone(),
        OutboxConfig::default().partition_maintenance(false),
    )
    .await
    .expect("folder");
    assert!(
        eventually(Duration::from_secs(20), || async {
            folder.commit_head().get() == 120
        })
        .await
    );
    let chunks: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT first_commit_seq, last_commit_seq FROM ordo.commit_chunks ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .expect("chunks");
    assert_eq!(chunks, vec![(1, 120)], "one append, one chunk");

    let keep = RetentionConfig::new().keep(Duration::from_millis(1));
    let dropped = eventually(Duration::from_secs(30), || async {
        let report = run_retention(&db.pool, &keep).await.expect("retention");
        report.dropped.contains(&"events_p0".to_owned())
    })
    .await;
    assert!(dropped, "the first partition was not dropped");
    // The chunk was trimmed, not deleted: the log holds exactly 101..=120.
    let chunks: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT first_commit_seq, last_commit_seq FROM ordo.commit_chunks ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .expect("chunks");
    assert_eq!(chunks, vec![(101, 120)]);
    check_log_after_retention(&db.pool).await;
    // A commit-lane listener from the floor reads the rest, densely, and one below it is refused.
    let mut lane = folder.listen_committed(Start::After(ordo::CommitSequence::new(100)));
    for expected in 101..=120u64 {
        let item = tokio::time::timeout(Duration::from_secs(20), lane.next())
            .await
            .expect("delivered")
            .expect("open")
            .expect("an entry");
        assert_eq!(item.commit_sequence.get(), expected);
        assert_eq!(item.event.sequence.get(), expected);
    }
    let mut below = folder.listen_committed(Start::After(ordo::CommitSequence::new(50)));
    let refused = tokio::time::timeout(Duration::from_secs(20), below.next())
        .await
        .expect("answered")
        .expect("open");
    assert!(
        matches!(refused, Err(ordo::Error::BelowRetentionFloor { .. })),
        "{refused:?}"
    );
    folder.shutdown().await;
}
