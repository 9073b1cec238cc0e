//! Retention: partitions are created ahead and dropped in lock-step (events with their log
//! rows), never below what a subscription still needs, never splitting a transaction; the log
//! stays dense above the new floor; reading below it is a clear error.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Note, TestDb, eventually};
use futures::StreamExt;
use ordo::{
    Envelope, Error, HandlerError, JobConfig, Outbox, OutboxConfig, RetentionConfig, Start,
    run_retention,
};
use sqlx::{PgConnection, PgPool};

struct Counts;

impl ordo::Subscriber<Note> for Counts {
    async fn handle(
        &self,
        _tx: &mut PgConnection,
        _event: &Arc<Envelope<Note>>,
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
    // 39 transactions of 10: sequences 1..=390, groups never cross a multiple of 100.
    for n in 0..39u32 {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish_all((0..10).map(|k| Note { writer: n, n: k }))
            .expect("publish");
        tx.commit().await.expect("commit");
    }
    // One transaction straddles 401: 391..=395, then (after ten others) 406..=410.
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

    // Reading below the floor is a clear error, on both lanes.
    let first = outbox
        .listen_inserted(Start::Beginning)
        .next()
        .await
        .expect("an item");
    assert!(
        matches!(
            first,
            Err(Error::BelowRetentionFloor {
                lane: "insert",
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
            Err(Error::BelowRetentionFloor { lane: "commit", .. })
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

    // Once the subscription has passed them, they go, except where a transaction straddles.
    sqlx::query("UPDATE ordo.subscriptions SET position = 510 WHERE name = 'slow'")
        .execute(&db.pool)
        .await
        .expect("position");
    let report = run_retention(&db.pool, &keep_nothing)
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
    // Creating partitions needs an exclusive lock on the parent: the maintainer gives up
    // quickly (lock timeout) rather than wait, which would queue every writer behind it.
    let run = tokio::time::timeout(
        Duration::from_secs(20),
        run_retention(&db.pool, &RetentionConfig::new().ahead(5)),
    )
    .await
    .expect("the maintainer does not wait for the long transaction");
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
    // Writers were never queued behind it: another one commits while the long one is open.
    sqlx::query(r#"INSERT INTO ordo.events (payload) VALUES ('{"writer": 2, "n": 2}')"#)
        .execute(&db.pool)
        .await
        .expect("a writer is not blocked");
    long.commit().await.expect("commit");
    let report = run_retention(&db.pool, &RetentionConfig::new().ahead(5))
        .await
        .expect("retention");
    assert!(
        !report.created.is_empty(),
        "created once the long transaction ended"
    );
}
