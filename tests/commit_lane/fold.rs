//! The commit-ordered lane: the sequencer's fold under concurrent sequencers, restarts, kills,
//! savepoints and large groups, and the commit-lane listener's density.

use crate::common;

use std::time::Duration;

use common::invariants::{ORDO, check_log, commit_position_of_xid, counts};
use common::lost::{ends_with_rewind, goes_on_from_the_server, lose_by_hand, stays_stopped};
use common::tcp_fault::{Fault, TcpFault};
use common::{Note, TestDb, eventually};
use futures::StreamExt;
use ordo::{
    CommitSequence, Delivery, HandlerError, JobConfig, OnRewind, Ordering, Outbox, OutboxConfig,
    Start, Subscriber,
};
use rand::Rng;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::time::timeout;

const PATIENCE: Duration = Duration::from_secs(30);

async fn outbox_on(pool: &PgPool, config: OutboxConfig) -> Outbox<Note> {
    Outbox::new(pool.clone(), config)
        .await
        .expect("start the outbox")
}

/// Records each event it handles, at its position, in the handler's transaction.
struct Recorder;

impl Subscriber<Note> for Recorder {
    async fn handle(
        &self,
        tx: &mut sqlx::PgConnection,
        event: &Delivery<Note>,
    ) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO handled (position, payload) VALUES ($1, $2)")
            .bind(i64::try_from(event.position().get()).unwrap_or(i64::MAX))
            .bind(sqlx::types::Json(&event.event().payload))
            .execute(tx)
            .await?;
        Ok(())
    }
}

/// Waits until every real event is logged, then checks the invariants.
async fn quiesce_and_check(pool: &PgPool) {
    let caught_up = eventually(PATIENCE, || async {
        let (real, logged) = counts(pool).await;
        logged >= real
    })
    .await;
    let (real, logged) = counts(pool).await;
    assert!(
        caught_up,
        "the log did not catch up: {logged} rows for {real} events"
    );
    if let Err(broken) = check_log(pool, &ORDO).await {
        panic!("commit log invariant broken: {broken}");
    }
}

/// 8 writers, 1 to 4 events a transaction, a quarter rolled back, some publishing through
/// savepoints that are rolled back.
async fn write_burst(outbox: &Outbox<Note>, transactions_per_writer: u32) {
    let mut writers = Vec::new();
    for writer in 0..8u32 {
        let outbox = outbox.clone();
        writers.push(tokio::spawn(async move {
            for n in 0..transactions_per_writer {
                let (events, fate) = {
                    let mut rng = rand::rng();
                    (rng.random_range(1..=4u32), rng.random_range(0..4u32))
                };
                let mut tx = outbox.begin().await.expect("begin");
                tx.publish_all((0..events).map(|k| Note {
                    writer,
                    n: n * 10 + k,
                }))
                .expect("publish");
                if fate == 0 {
                    tx.rollback().await.expect("rollback");
                } else {
                    tx.commit().await.expect("commit");
                }
            }
        }));
    }
    for writer in writers {
        writer.await.expect("writer");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_sequencers_on_their_own_pools_log_each_event_exactly_once() {
    let db = TestDb::new().await;
    let mut sequencers = Vec::new();
    for _ in 0..4 {
        let pool = db.another_pool(4).await;
        sequencers.push(outbox_on(&pool, OutboxConfig::default().fold_batch(7)).await);
    }
    let writer = outbox_on(&db.pool, OutboxConfig::default().sequencer(false)).await;
    write_burst(&writer, 40).await;
    quiesce_and_check(&db.pool).await;
    for outbox in &sequencers {
        outbox.shutdown().await;
    }
}

/// The wrong CAS, kept as a test double: a guard on the log (`NOT EXISTS`) instead of a column
/// of the locked state row. It reads its statement's snapshot, so concurrent folds both pass it.
/// Four of them over the same burst must break the same invariants the real sequencer keeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_not_exists_guard_instead_of_the_state_row_cas_duplicates_groups() {
    let db = TestDb::new().await;
    sqlx::raw_sql(
        "CREATE TABLE naive_log (commit_seq BIGINT, sequence BIGINT, group_last BOOLEAN);
         CREATE TABLE naive_state (last_commit_seq BIGINT NOT NULL DEFAULT 0);
         INSERT INTO naive_state DEFAULT VALUES;",
    )
    .execute(&db.pool)
    .await
    .expect("naive tables");
    let writer = outbox_on(&db.pool, OutboxConfig::default().sequencer(false)).await;
    for n in 0..50u32 {
        let mut tx = writer.begin().await.expect("begin");
        tx.publish_all((0..4).map(|k| Note {
            writer: 0,
            n: n * 10 + k,
        }))
        .expect("publish");
        tx.commit().await.expect("commit");
    }
    let groups: Vec<i64> = sqlx::query_scalar(
        "SELECT commit_xid FROM ordo.events GROUP BY commit_xid ORDER BY min(sequence)",
    )
    .fetch_all(&db.pool)
    .await
    .expect("groups");
    let mut folders = Vec::new();
    for _ in 0..4 {
        let pool = db.another_pool(1).await;
        let groups = groups.clone();
        folders.push(tokio::spawn(async move {
            for xid in groups {
                sqlx::query(
                    "INSERT INTO naive_log (commit_seq, sequence, group_last)
                     SELECT (SELECT coalesce(max(commit_seq), 0) FROM naive_log) + row_number() OVER (ORDER BY sequence),
                            sequence, sequence = max(sequence) OVER ()
                     FROM ordo.events, pg_sleep(0.002)
                     WHERE commit_xid = $1
                       AND NOT EXISTS (SELECT 1 FROM naive_log l JOIN ordo.events e USING (sequence) WHERE e.commit_xid = $1)",
                )
                .bind(xid)
                .execute(&pool)
                .await
                .expect("naive append");
            }
            sqlx::query("UPDATE naive_state SET last_commit_seq = (SELECT coalesce(max(commit_seq), 0) FROM naive_log)")
                .execute(&pool)
                .await
                .expect("naive state");
        }));
    }
    for folder in folders {
        folder.await.expect("naive folder");
    }
    let tables = common::invariants::LogTables {
        log: "naive_log",
        state: "naive_state",
    };
    let verdict = check_log(&db.pool, &tables).await;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM naive_log")
        .fetch_one(&db.pool)
        .await
        .expect("rows");
    assert!(
        verdict.is_err(),
        "the NOT EXISTS guard should break the invariants; it wrote {rows} rows for 200 events"
    );
    assert!(
        rows > 200,
        "expected duplicated groups, got {rows} rows for 200 events"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restart_with_a_group_straddling_the_cursor_skips_its_logged_members() {
    let db = TestDb::new().await;
    let first = outbox_on(
        &db.pool,
        OutboxConfig::default().gap_grace(Duration::from_millis(10)),
    )
    .await;
    let insert = |n: u32| {
        sqlx::AssertSqlSafe(format!(
            r#"INSERT INTO ordo.events (payload) VALUES ('{{"writer": 0, "n": {n}}}')"#
        ))
    };
    // A takes 1, C takes 2 and stays open, A takes 3 and commits: the frontier stops at 1, the
    // fold logs A = {1, 3} whole and its cursor stops at 1, so 3 is logged above the cursor.
    let mut a = db.pool.begin().await.expect("begin a");
    sqlx::query(insert(1)).execute(&mut *a).await.expect("a1");
    let mut c = db.pool.begin().await.expect("begin c");
    sqlx::query(insert(2)).execute(&mut *c).await.expect("c2");
    sqlx::query(insert(3)).execute(&mut *a).await.expect("a3");
    a.commit().await.expect("commit a");
    let straddling = eventually(PATIENCE, || async {
        let (head, through, above): (i64, i64, i64) = sqlx::query_as(
            "SELECT last_commit_seq, logged_through_sequence,
                    (SELECT count(*) FROM ordo.commit_log l WHERE l.sequence > s.logged_through_sequence)
             FROM ordo.sequencer_state s",
        )
        .fetch_one(&db.pool)
        .await
        .expect("state");
        head == 2 && through == 1 && above == 1
    })
    .await;
    assert!(straddling, "expected A logged whole with the cursor at 1");
    first.shutdown().await;

    // Restart several sequencers at once on that state while more groups arrive.
    let mut peers = Vec::new();
    for _ in 0..3 {
        let pool = db.another_pool(3).await;
        peers.push(outbox_on(&pool, OutboxConfig::default().fold_batch(2)).await);
    }
    c.commit().await.expect("commit c");
    write_burst(&peers[0], 10).await;
    quiesce_and_check(&db.pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_spanning_many_pages_is_logged_contiguously() {
    let db = TestDb::new().await;
    let config = OutboxConfig::default()
        .page_size(25)
        .cache_capacity(32)
        .fold_batch(10);
    let outbox = outbox_on(&db.pool, config).await;
    // The long transaction publishes its first event early, then 200 others commit, then it
    // publishes its second: its group spans 201 sequences, eight pages.
    let mut long = db.pool.begin().await.expect("begin");
    let first = outbox
        .publish_in(&mut long, [Note { writer: 1, n: 0 }])
        .await
        .expect("first");
    for n in 0..20u32 {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish_all((0..10).map(|k| Note {
            writer: 2,
            n: n * 10 + k,
        }))
        .expect("publish");
        tx.commit().await.expect("commit");
    }
    let last = outbox
        .publish_in(&mut long, [Note { writer: 1, n: 1 }])
        .await
        .expect("last");
    long.commit().await.expect("commit");
    assert!(last[0].get() - first[0].get() > 200);
    quiesce_and_check(&db.pool).await;
    let first_two: Vec<i64> = sqlx::query_scalar(
        "SELECT sequence FROM ordo.commit_log WHERE commit_seq <= 2 ORDER BY commit_seq",
    )
    .fetch_all(&db.pool)
    .await
    .expect("log head");
    assert_eq!(first_two, vec![first[0].get() as i64, last[0].get() as i64]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_with_no_insert_lane_listener_still_folds() {
    let db = TestDb::new().await;
    let outbox = outbox_on(&db.pool, OutboxConfig::default()).await;
    let mut committed = outbox.listen_committed(Start::Beginning);
    for n in 0..10u32 {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish_all([Note { writer: 0, n }, Note { writer: 1, n }])
            .expect("publish");
        tx.commit().await.expect("commit");
    }
    for expected in 1..=20u64 {
        let item = timeout(PATIENCE, committed.next())
            .await
            .expect("in time")
            .expect("open")
            .expect("event");
        assert_eq!(item.commit_sequence, CommitSequence::new(expected));
        assert_eq!(item.boundary, expected % 2 == 0);
    }
    quiesce_and_check(&db.pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn savepoint_rollbacks_inside_a_committed_transaction_log_only_surviving_rows() {
    let db = TestDb::new().await;
    let outbox = outbox_on(
        &db.pool,
        OutboxConfig::default().gap_grace(Duration::from_millis(10)),
    )
    .await;
    let mut committed = outbox.listen_committed(Start::Beginning);
    sqlx::raw_sql(
        r#"BEGIN;
           INSERT INTO ordo.events (payload) VALUES ('{"writer": 0, "n": 1}');
           SAVEPOINT s;
           INSERT INTO ordo.events (payload) VALUES ('{"writer": 0, "n": 2}');
           ROLLBACK TO SAVEPOINT s;
           SAVEPOINT t;
           INSERT INTO ordo.events (payload) VALUES ('{"writer": 0, "n": 3}');
           RELEASE SAVEPOINT t;
           COMMIT;"#,
    )
    .execute(&db.pool)
    .await
    .expect("savepoint transaction");
    let mut got = Vec::new();
    for _ in 0..2 {
        let item = timeout(PATIENCE, committed.next())
            .await
            .expect("in time")
            .expect("open")
            .expect("event");
        got.push((item.event.payload.n, item.boundary));
    }
    assert_eq!(got, vec![(1, false), (3, true)]);
    quiesce_and_check(&db.pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transaction_that_read_a_committed_row_lands_after_it() {
    let db = TestDb::new().await;
    sqlx::query("CREATE TABLE chain (link INT PRIMARY KEY, author INT NOT NULL)")
        .execute(&db.pool)
        .await
        .expect("chain table");
    let outbox = outbox_on(&db.pool, OutboxConfig::default()).await;
    // Four chains; each link's transaction starts early, waits until it can read the previous
    // link's committed row, then writes its own and publishes.
    let mut chains = Vec::new();
    for chain in 0..4u32 {
        let outbox = outbox.clone();
        let pool = db.pool.clone();
        chains.push(tokio::spawn(async move {
            let mut xids = Vec::new();
            for step in 0..15u32 {
                let link = (chain * 100 + step) as i32;
                let mut tx = outbox.begin().await.expect("begin");
                if step > 0 {
                    let seen: i64 =
                        sqlx::query_scalar("SELECT count(*) FROM chain WHERE link = $1")
                            .bind(link - 1)
                            .fetch_one(&mut *tx)
                            .await
                            .expect("read the previous link");
                    assert_eq!(seen, 1, "the previous link is committed");
                }
                sqlx::query("INSERT INTO chain (link, author) VALUES ($1, $2)")
                    .bind(link)
                    .bind(chain as i32)
                    .execute(&mut *tx)
                    .await
                    .expect("write link");
                tx.publish(Note {
                    writer: chain,
                    n: step,
                })
                .expect("publish");
                let sequences = tx.commit().await.expect("commit");
                let xid: i64 =
                    sqlx::query_scalar("SELECT commit_xid FROM ordo.events WHERE sequence = $1")
                        .bind(sequences[0].get() as i64)
                        .fetch_one(&pool)
                        .await
                        .expect("xid");
                xids.push(xid);
            }
            xids
        }));
    }
    let mut all = Vec::new();
    for chain in chains {
        all.push(chain.await.expect("chain"));
    }
    quiesce_and_check(&db.pool).await;
    for xids in all {
        let mut previous = 0;
        for xid in xids {
            let position = commit_position_of_xid(&db.pool, xid).await;
            assert!(position > previous, "a link landed before the link it read");
            previous = position;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sequencers_killed_at_random_points_leave_the_invariants_true() {
    let db = TestDb::new().await;
    let writer = outbox_on(&db.pool, OutboxConfig::default().sequencer(false)).await;
    let survivor_pool = db.another_pool(3).await;
    let writing = {
        let writer = writer.clone();
        tokio::spawn(async move { write_burst(&writer, 60).await })
    };
    // Each victim runs on its own runtime and pool; dropping the runtime drops every task at
    // whatever await it is in, and closes its connections mid-statement: a killed process.
    for round in 0..12u64 {
        let url = db.url.clone();
        let lifetime = Duration::from_millis(rand::rng().random_range(5..120));
        std::thread::spawn(move || {
            let runtime = common::victim_runtime();
            runtime.block_on(async {
                let pool = PgPool::connect(&url).await.expect("victim pool");
                let config = OutboxConfig::default().fold_batch(1 + (round as usize % 5));
                let _victim = Outbox::<Note>::new(pool, config)
                    .await
                    .expect("victim outbox");
                tokio::time::sleep(lifetime).await;
            });
            runtime.shutdown_background();
        })
        .join()
        .expect("victim thread");
    }
    writing.await.expect("writers");
    // A survivor finishes the fold from whatever the victims left.
    let survivor = outbox_on(&survivor_pool, OutboxConfig::default()).await;
    quiesce_and_check(&db.pool).await;
    survivor.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_lane_listener_is_dense_across_backfill_and_live_delivery() {
    let db = TestDb::new().await;
    let config = OutboxConfig::default().cache_capacity(32).page_size(20);
    let outbox = outbox_on(&db.pool, config.clone()).await;
    write_burst(&outbox, 10).await;
    quiesce_and_check(&db.pool).await;
    let (_, logged) = counts(&db.pool).await;
    // A listener in a process without a sequencer, from the beginning: backfill, then live.
    let reader = outbox_on(&db.another_pool(3).await, config.sequencer(false)).await;
    let mut stream = reader.listen_committed(Start::Beginning);
    let mut expected = 1u64;
    let mut last_min_sequence = 0u64;
    let mut group_open = false;
    let total = logged as u64 + 8;
    let live = tokio::spawn({
        let outbox = outbox.clone();
        async move {
            for n in 0..4u32 {
                let mut tx = outbox.begin().await.expect("begin");
                tx.publish_all([
                    Note { writer: 9, n },
                    Note {
                        writer: 9,
                        n: n + 100,
                    },
                ])
                .expect("publish");
                tx.commit().await.expect("commit");
            }
        }
    });
    while expected <= total {
        let item = timeout(PATIENCE, stream.next())
            .await
            .expect("in time")
            .expect("open")
            .expect("event");
        assert_eq!(
            item.commit_sequence,
            CommitSequence::new(expected),
            "dense, +1 each time"
        );
        if !group_open {
            assert!(
                item.event.sequence.get() > last_min_sequence,
                "group minimums increase"
            );
            last_min_sequence = item.event.sequence.get();
        }
        group_open = !item.boundary;
        expected += 1;
    }
    live.await.expect("live writer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_of_100000_events_is_logged_as_one_contiguous_group() {
    let db = TestDb::new().await;
    let outbox = outbox_on(&db.pool, OutboxConfig::default()).await;
    let mut before = outbox.begin().await.expect("begin");
    before.publish(Note { writer: 0, n: 0 }).expect("publish");
    before.commit().await.expect("commit");
    let mut big = outbox.begin().await.expect("begin");
    big.publish_all((0..100_000u32).map(|n| Note { writer: 1, n }))
        .expect("publish");
    big.commit().await.expect("commit the big transaction");
    let mut after = outbox.begin().await.expect("begin");
    after.publish(Note { writer: 2, n: 0 }).expect("publish");
    after.commit().await.expect("commit");

    let done = eventually(Duration::from_secs(120), || async {
        outbox.commit_head().get() == 100_002
    })
    .await;
    assert!(done, "folded: head {}", outbox.commit_head());
    let (first, last, boundaries): (i64, i64, i64) = sqlx::query_as(
        "SELECT min(l.commit_seq), max(l.commit_seq), count(*) FILTER (WHERE l.group_last)
         FROM ordo.commit_log l JOIN ordo.events e USING (sequence) WHERE e.payload->>'writer' = '1'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("the big group");
    assert_eq!((first, last, boundaries), (2, 100_001, 1));
    quiesce_and_check(&db.pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_forging_the_commit_xid_of_a_logged_transaction_is_left_out_not_logged_twice() {
    let db = TestDb::new().await;
    let outbox = outbox_on(&db.pool, OutboxConfig::default()).await;
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish_all([Note { writer: 1, n: 0 }, Note { writer: 1, n: 1 }])
        .expect("publish");
    tx.commit().await.expect("commit");
    write_burst(&outbox, 5).await;
    quiesce_and_check(&db.pool).await;
    // Writer 1's transaction is complete in the log and the cursor is past it; a row written by
    // hand now claims to belong to it.
    let xid: i64 =
        sqlx::query_scalar("SELECT commit_xid FROM ordo.events WHERE payload->>'writer' = '1'")
            .fetch_one(&db.pool)
            .await
            .expect("xid");
    let forged: i64 = sqlx::query_scalar(
        r#"INSERT INTO ordo.events (commit_xid, payload) VALUES ($1, '{"writer": 1, "n": 2}')
           RETURNING sequence"#,
    )
    .bind(xid)
    .fetch_one(&db.pool)
    .await
    .expect("forge");
    write_burst(&outbox, 5).await;
    let (real, _) = counts(&db.pool).await;
    let caught_up = eventually(PATIENCE, || async {
        let (_, logged) = counts(&db.pool).await;
        logged >= real - 1
    })
    .await;
    assert!(
        caught_up,
        "the log did not catch up with the legitimate events"
    );
    let (forged_logged, writer_one): (i64, Vec<i64>) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM ordo.commit_log WHERE sequence = $1),
                (SELECT array_agg(l.commit_seq ORDER BY l.commit_seq) FROM ordo.commit_log l
                 JOIN ordo.events e USING (sequence) WHERE e.commit_xid = $2)",
    )
    .bind(forged)
    .bind(xid)
    .fetch_one(&db.pool)
    .await
    .expect("log");
    assert_eq!(forged_logged, 0, "the forged row was logged");
    assert_eq!(
        writer_one.len(),
        2,
        "the forged transaction's group changed: {writer_one:?}"
    );
    assert_eq!(
        writer_one[1],
        writer_one[0] + 1,
        "the group is not contiguous"
    );
    let (real, logged) = counts(&db.pool).await;
    assert_eq!(logged, real - 1, "every legitimate event is logged once");
}

/// A fold that catches up on a backlog writes chunks of up to 1,024 entries, large enough (from
/// about 250) to be compressed on insert; they are compressed with lz4 where the server has it
/// (migration `20261204000100_commit_chunks_lz4.sql`: pglz took a sixth of such an append's
/// time), and the log reads the same either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catching_up_fold_stores_its_full_chunks_with_lz4_where_the_server_has_it() {
    let db = TestDb::new().await;
    // 3,000 single-event transactions, committed one by one before any sequencer runs (a
    // procedure may COMMIT when its CALL is a statement of its own).
    let mut conn = db.pool.acquire().await.expect("a connection");
    sqlx::raw_sql(
        r#"CREATE PROCEDURE pg_temp.backlog(n int) LANGUAGE plpgsql AS $$
           BEGIN
               FOR i IN 1..n LOOP
                   INSERT INTO ordo.events (payload) VALUES (jsonb_build_object('writer', 0, 'n', i));
                   COMMIT;
               END LOOP;
           END $$"#,
    )
    .execute(&mut *conn)
    .await
    .expect("the procedure");
    sqlx::raw_sql("CALL pg_temp.backlog(3000)")
        .execute(&mut *conn)
        .await
        .expect("the backlog");
    drop(conn);
    let outbox = outbox_on(&db.pool, OutboxConfig::default()).await;
    quiesce_and_check(&db.pool).await;
    drop(outbox);

    // Whether the server has lz4: the setting refuses a method the server was built without
    // (set for this transaction only, rolled back).
    let mut probe = db.pool.begin().await.expect("begin");
    let lz4 = sqlx::raw_sql("SET LOCAL default_toast_compression = 'lz4'")
        .execute(&mut *probe)
        .await
        .is_ok();
    probe.rollback().await.expect("rollback");
    let methods: Vec<(Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT pg_column_compression(sequences), pg_column_compression(group_last)
         FROM ordo.commit_chunks WHERE cardinality(sequences) >= 300",
    )
    .fetch_all(&db.pool)
    .await
    .expect("chunks");
    // Appends of a page (2,000 groups) at a time: chunks of 1,024 and 976 entries, then the rest.
    assert!(
        !methods.is_empty(),
        "the catch-up wrote no chunk of 300 entries or more"
    );
    let expected = if lz4 { "lz4" } else { "pglz" };
    for (sequences, group_last) in methods {
        assert_eq!(sequences.as_deref(), Some(expected), "sequences");
        // 1,024 booleans (1 kB) stay below the threshold unless they compress well; when
        // compressed, it is with the column's method.
        if let Some(method) = group_last {
            assert_eq!(method, expected, "group_last");
        }
    }
}

/// Sequencers catching up on the same backlog read their next batch while their append runs;
/// racing each other, their appends are refused while such a read is in flight or done (the
/// read is dropped, or the reader goes back over it). Three processes start at once on a
/// backlog with rollbacks and multi-event groups, writers go on meanwhile, and two processes
/// stop mid-catch-up: every event is still logged exactly once, groups contiguous.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sequencers_racing_through_a_backlog_with_reads_ahead_log_each_event_once() {
    let db = TestDb::new().await;
    let writer = outbox_on(&db.pool, OutboxConfig::default().sequencer(false)).await;
    write_burst(&writer, 150).await;
    let mut sequencers = Vec::new();
    for _ in 0..3 {
        let pool = db.another_pool(4).await;
        // Small batches: many appends, each with a read ahead while the backlog lasts.
        sequencers.push(outbox_on(&pool, OutboxConfig::default().fold_batch(50)).await);
    }
    let more = tokio::spawn({
        let writer = writer.clone();
        async move { write_burst(&writer, 40).await }
    });
    // Two of them stop mid-catch-up: the one left must have kept its reader where the log is.
    tokio::time::sleep(Duration::from_millis(50)).await;
    for stopped in sequencers.drain(1..) {
        stopped.shutdown().await;
    }
    more.await.expect("writers");
    quiesce_and_check(&db.pool).await;
    for outbox in &sequencers {
        outbox.shutdown().await;
    }
}

/// The one peer that wins an append over a read ahead stops right after: nothing else folds the
/// range the read covered. A holds the state row locked (the peer's transaction) while a
/// sequencer catching up on a backlog appends its first batch and reads the next one meanwhile;
/// the peer then logs the first group alone and never appends again. The refused sequencer must
/// read the range of its dropped read again: had its reader stayed past it, its next append
/// would move the cursor over events no process logged (without the seek back, 350 of the 400
/// events were logged). The read is given half a second to finish while the append waits: one
/// still running at the refusal is dropped, which this test would not tell from a seek back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_append_reads_again_what_it_read_ahead_when_the_winner_stops() {
    let db = TestDb::new().await;
    let writer = outbox_on(&db.pool, OutboxConfig::default().sequencer(false)).await;
    for n in 0..400u32 {
        let mut tx = writer.begin().await.expect("begin");
        tx.publish(Note { writer: 0, n }).expect("publish");
        tx.commit().await.expect("commit");
    }
    let mut peer = db.pool.begin().await.expect("begin the peer");
    sqlx::query("SELECT 1 FROM ordo.sequencer_state WHERE singleton FOR UPDATE")
        .execute(&mut *peer)
        .await
        .expect("lock the state row");
    let pool = db.another_pool(4).await;
    let folder = outbox_on(&pool, OutboxConfig::default().fold_batch(50)).await;
    // Its append waits on the peer's lock; its read of the next batch does not.
    let waiting = eventually(PATIENCE, || async {
        let waits: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&db.pool)
        .await
        .expect("lock waits");
        waits > 0
    })
    .await;
    assert!(
        waiting,
        "the sequencer's append never waited on the state row"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The peer logs the first group and stops.
    let first: i64 =
        sqlx::query_scalar("SELECT min(sequence) FROM ordo.events WHERE commit_xid IS NOT NULL")
            .fetch_one(&mut *peer)
            .await
            .expect("first event");
    sqlx::query(
        "INSERT INTO ordo.commit_chunks
             (first_commit_seq, last_commit_seq, min_sequence, max_sequence, sequences, group_last)
         VALUES (1, 1, $1, $1, ARRAY[$1], ARRAY[true])",
    )
    .bind(first)
    .execute(&mut *peer)
    .await
    .expect("the peer's chunk");
    sqlx::query(
        "UPDATE ordo.sequencer_state SET last_commit_seq = 1, logged_through_sequence = $1
         WHERE singleton",
    )
    .bind(first)
    .execute(&mut *peer)
    .await
    .expect("the peer's cursor");
    peer.commit().await.expect("the peer's append");
    quiesce_and_check(&db.pool).await;
    folder.shutdown().await;
    writer.shutdown().await;
}

/// What a server that went back leaves, made in one transaction on this server: the last
/// append gone and the state row back where it was before it; with `events`, the events it
/// logged gone too. Without: a crash that lost the sequencer's last appends (they commit
/// asynchronously). With: a failover to a standby that missed the last transactions. The
/// events sequence is not reset: PostgreSQL logs it 32 values ahead, so a small loss leaves it
/// above every lost event, where the insert lane's check cannot see the loss. Returns the lost
/// positions.
async fn lose_the_last_append<'e>(db: impl sqlx::PgExecutor<'e>, events: bool) -> (i64, i64) {
    sqlx::query_as(
        "WITH lost AS (
             DELETE FROM ordo.commit_chunks
             WHERE first_commit_seq = (SELECT max(first_commit_seq) FROM ordo.commit_chunks)
             RETURNING first_commit_seq, last_commit_seq, min_sequence, sequences),
         gone AS (
             DELETE FROM ordo.events AS e USING lost
             WHERE $1 AND e.sequence = ANY (lost.sequences))
         UPDATE ordo.sequencer_state AS s
         SET last_commit_seq = lost.first_commit_seq - 1,
             logged_through_sequence = lost.min_sequence - 1
         FROM lost
         RETURNING lost.first_commit_seq, lost.last_commit_seq",
    )
    .bind(events)
    .fetch_one(db)
    .await
    .expect("lose the last append")
}

/// A folding outbox, one that does not fold, and one that does not fold whose log cache holds
/// the fewest entries it may (16), each with a commit-lane listener past the thirty
/// single-event transactions the first published.
async fn thirty_folded_and_followed(db: &TestDb) -> [(Outbox<Note>, ordo::CommitStream<Note>); 3] {
    let folder = outbox_on(&db.pool, OutboxConfig::default()).await;
    let mut folded = folder.listen_committed(Start::Beginning);
    let follow = |config: OutboxConfig| async move {
        let follower = outbox_on(&db.pool, config.sequencer(false)).await;
        let followed = follower.listen_committed(Start::Beginning);
        (follower, followed)
    };
    let (follower, mut followed) = follow(OutboxConfig::default()).await;
    let (forgetful, mut forgot) = follow(OutboxConfig::default().cache_capacity(16)).await;
    for n in 0..30u32 {
        commit_one(&folder, Note { writer: 1, n }).await;
    }
    for stream in [&mut folded, &mut followed, &mut forgot] {
        let mut seen = 0u64;
        while seen < 30 {
            seen = next_event(stream).await.commit_sequence.get();
        }
    }
    [(folder, folded), (follower, followed), (forgetful, forgot)]
}

/// An outbox that folded ten single-event transactions, and its commit-lane listener past
/// all ten.
async fn ten_folded(db: &TestDb) -> (Outbox<Note>, ordo::CommitStream<Note>) {
    ten_folded_on(&db.pool, OutboxConfig::default()).await
}

/// [`ten_folded`] on `pool`, with `config`.
async fn ten_folded_on(
    pool: &PgPool,
    config: OutboxConfig,
) -> (Outbox<Note>, ordo::CommitStream<Note>) {
    let outbox = outbox_on(pool, config).await;
    let mut stream = outbox.listen_committed(Start::Beginning);
    for n in 0..10u32 {
        commit_one(&outbox, Note { writer: 1, n }).await;
    }
    let mut seen = 0u64;
    while seen < 10 {
        seen = next_event(&mut stream).await.commit_sequence.get();
    }
    // The listener may have them before their append (`early_commit_listeners`): the tests
    // lose what the log holds, so it must hold all ten.
    let logged = common::invariants::log_reaches(pool, 10).await;
    assert!(logged, "the log holds the ten");
    (outbox, stream)
}

/// Commits one transaction publishing `note`.
async fn commit_one(outbox: &Outbox<Note>, note: Note) {
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(note).expect("publish");
    tx.commit().await.expect("commit");
}

/// Commits a transaction after the last append (from `from` on) was lost with its events. It
/// would be given a position the listener already passed, and be skipped by it: the
/// sequencer's append is refused, it reads the log again and finds its head below what it had
/// seen, and the listener ends with the rewind.
async fn a_commit_finds_the_log_went_back(
    outbox: &Outbox<Note>,
    stream: &mut ordo::CommitStream<Note>,
    from: i64,
) {
    commit_one(outbox, Note { writer: 2, n: 0 }).await;
    ends_with_rewind(
        "the listener",
        stream,
        &format!("commit log went back below position {from}"),
        from,
        PATIENCE,
    )
    .await;
}

/// The listener's next event (not an error), in time.
async fn next_event(stream: &mut ordo::CommitStream<Note>) -> ordo::CommitOrderedEnvelope<Note> {
    timeout(PATIENCE, stream.next())
        .await
        .expect("in time")
        .expect("open")
        .expect("an event, not an error")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_a_crash_lost_are_appended_again_and_the_outbox_goes_on() {
    let db = TestDb::new().await;
    let (outbox, mut stream) = ten_folded(&db).await;
    let (from, through) = lose_the_last_append(&db.pool, false).await;
    assert!(from >= 1 && through == 10, "lost {from}..={through}");

    // The fold appends the lost entries again, to the same events, then the new one after
    // them: the listener, past position 10, gets the new event at 11, and nothing stops.
    commit_one(&outbox, Note { writer: 2, n: 0 }).await;
    let item = next_event(&mut stream).await;
    assert_eq!(item.commit_sequence.get(), 11);
    assert_eq!(item.event.payload, Note { writer: 2, n: 0 });
    quiesce_and_check(&db.pool).await;
    // The outbox goes on.
    commit_one(&outbox, Note { writer: 2, n: 1 }).await;
    assert_eq!(next_event(&mut stream).await.commit_sequence.get(), 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_that_went_back_ends_the_listeners_and_the_outbox_goes_on_from_what_the_server_holds()
{
    let db = TestDb::new().await;
    let (outbox, mut stream) = ten_folded(&db).await;
    // A latest-value stream ends with the rewind too: a lost value's version may be given
    // again to another value.
    let mut rates = outbox.latest::<u32>(["rate"]).expect("a latest stream");
    outbox
        .publish_latest("rate", &1u32)
        .await
        .expect("publish a latest value");
    let first = timeout(PATIENCE, rates.next()).await.expect("in time");
    assert!(
        matches!(first, Some(Ok(ref latest)) if *latest.payload == 1),
        "{first:?}"
    );
    // A subscription past every position, in this process: it must go on from what the
    // server stores for it, onto the new lanes, without a restart.
    sqlx::query("CREATE TABLE handled (position bigint PRIMARY KEY, payload jsonb NOT NULL)")
        .execute(&db.pool)
        .await
        .expect("the subscription's table");
    let subscription = outbox
        .subscribe(
            JobConfig::new("past-the-rewind").ordering(Ordering::Commit),
            Recorder,
        )
        .await
        .expect("subscribe");
    let (_, caught_up) = subscription
        .wait_for(PATIENCE, |status| status.position.get() >= 10)
        .await;
    assert!(caught_up, "the subscription handles the ten");
    let (from, through) = lose_the_last_append(&db.pool, true).await;
    assert!(from >= 1 && through == 10, "lost {from}..={through}");
    // The subscription's checkpoint and its writes went back with the loss, as a standby's
    // would: they committed after the lost events.
    sqlx::query(
        "WITH mark AS (UPDATE ordo.subscriptions SET position = $1 WHERE name = 'past-the-rewind') \
         DELETE FROM handled WHERE position > $1",
    )
    .bind(from - 1)
    .execute(&db.pool)
    .await
    .expect("the checkpoint the server holds");

    // The listener ends, and the outbox starts again from the server.
    a_commit_finds_the_log_went_back(&outbox, &mut stream, from).await;
    let ended = timeout(PATIENCE, rates.next()).await.expect("in time");
    assert!(
        matches!(ended, Some(Err(ordo::Error::ServerRewound { .. }))),
        "the latest stream ends with the rewind: {ended:?}"
    );
    assert!(rates.next().await.is_none(), "then it is over");
    goes_on_from_the_server("the outbox", &outbox, &db.pool, from, true, PATIENCE).await;
    let mut rates = outbox.latest::<u32>(["rate"]).expect("a new latest stream");
    let current = timeout(PATIENCE, rates.next()).await.expect("in time");
    assert!(
        matches!(current, Some(Ok(ref latest)) if *latest.payload == 1),
        "{current:?}"
    );
    // The subscription handled the server's events from the rewound position on, each once.
    let handled = eventually(PATIENCE, || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM handled WHERE payload = '{\"writer\": 9, \"n\": 0}')",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap_or(false)
    })
    .await;
    assert!(handled, "the subscription goes on past the rewind");
    let differ: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (
             SELECT l.commit_seq, e.payload FROM ordo.commit_log AS l
             JOIN ordo.events AS e ON e.sequence = l.sequence
             WHERE l.commit_seq >= $1
               AND l.commit_seq <= (SELECT max(position) FROM handled)
             EXCEPT
             SELECT position, payload FROM handled WHERE position >= $1) AS missing",
    )
    .bind(from)
    .fetch_one(&db.pool)
    .await
    .expect("compare");
    assert_eq!(
        differ, 0,
        "from the rewind on, the subscription handled what the server holds at each position"
    );
    subscription.shutdown().await;
    quiesce_and_check(&db.pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_shut_down_while_it_starts_again_after_a_rewind_stays_shut_down() {
    let db = TestDb::new().await;
    let (outbox, mut stream) = ten_folded(&db).await;
    let (from, _) = lose_the_last_append(&db.pool, true).await;
    // The listener ends when the old lanes stop; the new ones start right after. A shutdown
    // then lands while they start: they must not run after it returns.
    a_commit_finds_the_log_went_back(&outbox, &mut stream, from).await;
    outbox.shutdown().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..3 {
        let begun = outbox.begin().await;
        assert!(
            matches!(
                begun,
                Err(ordo::Error::Shutdown | ordo::Error::ServerRewound { .. })
            ),
            "the outbox stays shut down: {:?}",
            begun.map(|_| "a transaction")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Nor does anything of theirs: no LISTEN connection is left.
    let closed = eventually(PATIENCE, || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name = 'ordo.listen'",
        )
        .fetch_one(&db.pool)
        .await
        .map(|left| left == 0)
        .unwrap_or(false)
    })
    .await;
    assert!(closed, "a LISTEN connection outlived the shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_that_cannot_reach_the_server_as_it_starts_again_after_a_rewind_retries_until_it_can()
 {
    let db = TestDb::new().await;
    // The outbox reaches the server through a proxy that the test cuts.
    let options: PgConnectOptions = db.url.parse().expect("the test database's URL");
    let server = tokio::net::lookup_host((options.get_host(), options.get_port()))
        .await
        .expect("resolve the server")
        .next()
        .expect("an address");
    let front = TcpFault::start(server).await;
    let through_front = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(2))
        .connect_with(
            options
                .host(&front.addr().ip().to_string())
                .port(front.addr().port()),
        )
        .await
        .expect("a pool through the proxy");
    let (outbox, mut stream) = ten_folded_on(&through_front, OutboxConfig::default()).await;
    let (from, _) = lose_the_last_append(&db.pool, true).await;
    // The listener ends as the old lanes stop; the new ones start right after, and find the
    // server cut off: they try again until it answers.
    a_commit_finds_the_log_went_back(&outbox, &mut stream, from).await;
    front.set(Fault::Cut);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(
        outbox.begin().await.is_err(),
        "no transaction while the server is cut off"
    );
    front.set(Fault::Pass);
    goes_on_from_the_server("the outbox", &outbox, &db.pool, from, true, PATIENCE).await;
    outbox.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_that_went_back_stops_an_outbox_told_to_stop() {
    let db = TestDb::new().await;
    let config = OutboxConfig::default().on_rewind(OnRewind::Stop);
    let (outbox, mut stream) = ten_folded_on(&db.pool, config).await;
    let (from, _) = lose_the_last_append(&db.pool, true).await;
    a_commit_finds_the_log_went_back(&outbox, &mut stream, from).await;
    stays_stopped("the outbox", &outbox).await;
    // No consumer starts on lanes the server went back under.
    let refused = outbox
        .subscribe(JobConfig::new("after-the-rewind"), Recorder)
        .await;
    assert!(
        matches!(refused, Err(ordo::Error::ServerRewound { .. })),
        "a subscription is refused: {refused:?}"
    );
    // It stays so: nothing starts the lanes again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stays_stopped("the outbox, later", &outbox).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_history_that_gave_seen_positions_to_other_events_ends_every_listener_and_each_process_goes_on()
 {
    let db = TestDb::new().await;
    let outboxes = thirty_folded_and_followed(&db).await;
    // A peer on the promoted server folds past position 10 before either process reads the
    // head again: with more events than the last append held, the promoted head is past 10,
    // and neither ever reads a head below what it saw. The last append's events are gone, and
    // its positions hold the promoted server's events.
    let from = lose_by_hand(&db.pool, true, 10, 32, Some(99)).await;
    assert!((1..=10).contains(&from), "the appends lost began at {from}");
    for (index, (outbox, mut stream)) in outboxes.into_iter().enumerate() {
        let which = [
            "the folding process",
            "the process that does not fold",
            "a process whose cache holds 16 entries",
        ][index];
        let text = ends_with_rewind(
            which,
            &mut stream,
            &format!("position {from}"),
            from,
            PATIENCE,
        )
        .await;
        if index == 2 {
            // It returned positions whose events it no longer holds: a newer history gave
            // them again, so they cannot be taken as the same.
            assert!(
                text.contains("newer server history") && text.contains("cannot check"),
                "{which}: says why: {text}"
            );
        }
        goes_on_from_the_server(which, &outbox, &db.pool, from, true, PATIENCE).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_history_that_appended_the_same_events_again_stops_nothing() {
    let db = TestDb::new().await;
    let [
        (folder, mut folded),
        (follower, mut followed),
        (forgetful, mut forgot),
    ] = thirty_folded_and_followed(&db).await;
    // The standby had every event but not the last append (appends commit asynchronously):
    // the promoted server folds the same events to the same positions again, then its own at 31.
    let from = lose_by_hand(&db.pool, false, 30, 1, Some(99)).await;
    assert!((1..=30).contains(&from), "the last append began at {from}");
    let mut streams = vec![&mut folded, &mut followed];
    // The process with the smallest cache holds every position lost (15 to 30) unless the last
    // append was wider than that: it then checks them too.
    let forgetful_checks = from >= 15;
    if forgetful_checks {
        streams.push(&mut forgot);
    }
    for stream in &mut streams {
        let item = next_event(stream).await;
        assert_eq!(item.commit_sequence.get(), 31);
        assert_eq!(item.event.payload, Note { writer: 3, n: 0 });
    }
    commit_one(&folder, Note { writer: 2, n: 0 }).await;
    for stream in &mut streams {
        assert_eq!(next_event(stream).await.commit_sequence.get(), 32);
    }
    if forgetful_checks {
        assert!(
            forgetful.begin().await.is_ok(),
            "the forgetful follower goes on"
        );
    }
    assert!(follower.begin().await.is_ok(), "the follower goes on");
    quiesce_and_check(&db.pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_resuming_below_the_head_reads_the_stored_head_before_its_caches() {
    let db = TestDb::new().await;
    let folder = outbox_on(&db.pool, OutboxConfig::default()).await;
    // A process that does not fold and reads the head only when its insert lane moves (its
    // idle resync a minute away): nothing in it reads the log's head unprompted.
    let quiet = OutboxConfig::default()
        .sequencer(false)
        .resync_interval(Duration::from_secs(60));
    let follower = outbox_on(&db.pool, quiet).await;
    let mut followed = follower.listen_committed(Start::Beginning);
    for n in 0..10u32 {
        commit_one(&folder, Note { writer: 1, n }).await;
    }
    let mut seen = 0u64;
    while seen < 10 {
        seen = next_event(&mut followed).await.commit_sequence.get();
    }
    folder.shutdown().await;
    // The last appends and their events lost, as a failover to a standby that lacked them
    // leaves them; the follower's caches still hold them.
    let (from, _) = lose_the_last_append(&db.pool, true).await;
    // What a relay or a subscription does after a claim: read on from its stored position,
    // below the head this process knows. It must not be handed the lost events from the
    // caches as the positions' events.
    let stored = CommitSequence::new(u64::try_from(from - 1).expect("a position"));
    let mut resumed = follower.listen_committed(Start::After(stored));
    let first = timeout(PATIENCE, resumed.next())
        .await
        .expect("in time")
        .expect("open");
    match first {
        Err(ordo::Error::ServerRewound { what }) => assert!(
            what.contains(&format!("position {from}")),
            "names the position: {what}"
        ),
        Err(other) => panic!("another error: {other}"),
        Ok(item) => panic!(
            "a lost event was served from the caches at position {}",
            item.commit_sequence
        ),
    }
}
