//! Least-privilege roles: a writer that is neither owner nor superuser runs the whole outbox
//! (publishing, both lanes, a subscription, status) on partitions an operator made, and cannot
//! forge `sequence` or `commit_xid`; a reader watches but cannot publish; a forged row above
//! the head (as the owner, whom grants do not restrict) is reported, not filled up to; and a
//! plain insert has its transaction id before it draws its sequence.

mod common;

use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::invariants::{ORDO, check_log};
use common::roles::{Roles, denied, denied_ordo, exec, head, quote};
use common::{Note, TestDb, eventually};
use futures::StreamExt;
use ordo::{
    Delivery, Error, Grants, HandlerError, JobConfig, Outbox, OutboxConfig, RetentionConfig, Start,
    Subscriber,
};
use sqlx::PgConnection;

const PATIENCE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_cannot_forge_sequence_or_commit_xid_and_fills_only_drawn_holes() {
    let roles = Roles::new(1_000_000).await;
    let writer = roles.pool_as(&roles.writer, 2).await;
    let reader = roles.pool_as(&roles.reader, 2).await;

    // Publishing by plain SQL works; the defaults stamp everything else.
    sqlx::query("INSERT INTO ordo.events (payload) VALUES ('{\"writer\": 1, \"n\": 1}')")
        .execute(&writer)
        .await
        .expect("a writer publishes by plain SQL");
    let top = head(&writer).await;

    let forged_sequence = sqlx::query(
        "INSERT INTO ordo.events (sequence, payload) VALUES ($1, '{\"writer\": 1, \"n\": 2}')",
    )
    .bind(top + 200)
    .execute(&writer)
    .await;
    assert!(denied(forged_sequence), "a writer set sequence");
    let forged_xid = sqlx::query(
        "INSERT INTO ordo.events (commit_xid, payload) VALUES (1, '{\"writer\": 1, \"n\": 3}')",
    )
    .execute(&writer)
    .await;
    assert!(denied(forged_xid), "a writer set commit_xid");
    for sql in [
        "UPDATE ordo.events SET commit_xid = 1",
        "UPDATE ordo.events SET sequence = sequence + 1000",
        "DELETE FROM ordo.events",
        "SELECT setval('ordo.events_sequence', 1000)",
        "UPDATE ordo.commit_chunks SET group_last = group_last",
        "DELETE FROM ordo.commit_chunks",
        "UPDATE ordo.sequencer_state SET singleton = true",
        "CREATE TABLE ordo.events_9000001 PARTITION OF ordo.events FOR VALUES FROM (9000001) TO (9000002)",
    ] {
        let result = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&writer).await;
        assert!(
            matches!(&result, Err(sqlx::Error::Database(e)) if matches!(e.code().as_deref(), Some("42501") | Some("42P17"))),
            "a writer ran {sql}: {result:?}"
        );
    }

    // The placeholder function: nothing above the head, never over a row.
    let filled: i64 = sqlx::query_scalar("SELECT ordo.fill_placeholders($1, $2)")
        .bind(top + 1)
        .bind(top + 200)
        .fetch_one(&writer)
        .await
        .expect("fill above the head");
    assert_eq!(filled, 0, "placeholders written above the head");
    let filled: i64 = sqlx::query_scalar("SELECT ordo.fill_placeholders(1, $1)")
        .bind(top)
        .fetch_one(&writer)
        .await
        .expect("fill over rows");
    assert_eq!(filled, 0, "a real row was overwritten");
    // A drawn, abandoned sequence is filled.
    let hole: i64 = sqlx::query_scalar("SELECT nextval('ordo.events_sequence')")
        .fetch_one(&writer)
        .await
        .expect("draw a sequence");
    let filled: i64 = sqlx::query_scalar("SELECT ordo.fill_placeholders($1, $1 + 100)")
        .bind(hole)
        .fetch_one(&writer)
        .await
        .expect("fill a hole");
    assert_eq!(filled, 1);
    let (real, placeholders, above): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE payload IS NOT NULL), count(*) FILTER (WHERE payload IS NULL),
                count(*) FILTER (WHERE sequence > $1)
         FROM ordo.events",
    )
    .bind(hole)
    .fetch_one(&roles.admin)
    .await
    .expect("counts");
    assert_eq!((real, placeholders, above), (1, 1, 0));

    // A reader may do neither.
    let published = sqlx::query("INSERT INTO ordo.events (payload) VALUES ('{}')")
        .execute(&reader)
        .await;
    assert!(denied(published), "a reader published");
    let filled = sqlx::query("SELECT ordo.fill_placeholders(1, 1)")
        .execute(&reader)
        .await;
    assert!(denied(filled), "a reader wrote a placeholder");
    writer.close().await;
    reader.close().await;
}

/// Counts what it handles; its checkpoint is what the test watches.
struct Count(Arc<AtomicU64>);

impl Subscriber<Note> for Count {
    async fn handle(
        &self,
        _tx: &mut PgConnection,
        _event: &Delivery<Note>,
    ) -> Result<(), HandlerError> {
        self.0.fetch_add(1, AtomicOrdering::SeqCst);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_runs_the_whole_outbox_on_partitions_an_operator_made() {
    // Partitions of 10 sequences: the migration makes room up to 30; the events below need
    // the operator's partitions.
    let roles = Roles::new(10).await;
    let operator = roles.pool_as(&roles.operator, 2).await;
    let report = ordo::admin::run_retention(&operator, &RetentionConfig::new().ahead(15))
        .await
        .expect("an operator makes partitions");
    assert!(report.covered_until > 120, "{report:?}");

    let writer = roles.pool_as(&roles.writer, 6).await;
    let outbox = Outbox::<Note>::new(writer.clone(), OutboxConfig::default())
        .await
        .expect("a writer starts an outbox");
    let mut inserted = outbox.listen_inserted(Start::Beginning);
    let mut committed = outbox.listen_committed(Start::Beginning);
    let handled = Arc::new(AtomicU64::new(0));
    let subscription = outbox
        .subscribe(JobConfig::new("roles"), Count(Arc::clone(&handled)))
        .await
        .expect("a writer subscribes");

    let mut expected = 0u64;
    for n in 0..20 {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish_all((0..3).map(|k| Note { writer: n, n: k }))
            .expect("publish");
        tx.commit().await.expect("commit");
        expected += 3;
        if n == 10 {
            // A rolled-back publish leaves holes, resolved through the placeholder function.
            let mut tx = writer.begin().await.expect("begin");
            outbox
                .publish_in(
                    &mut tx,
                    [Note { writer: 99, n: 0 }, Note { writer: 99, n: 1 }],
                )
                .await
                .expect("publish_in");
            tx.rollback().await.expect("rollback");
            sqlx::query("INSERT INTO ordo.events (payload) VALUES ('{\"writer\": 98, \"n\": 0}')")
                .execute(&writer)
                .await
                .expect("plain SQL publish");
            expected += 1;
        }
    }

    let mut last = 0;
    for _ in 0..expected {
        let event = tokio::time::timeout(PATIENCE, inserted.next())
            .await
            .expect("the insert lane delivers")
            .expect("open")
            .expect("an event");
        assert!(event.sequence.get() > last, "insert lane out of order");
        last = event.sequence.get();
    }
    for position in 1..=expected {
        let item = tokio::time::timeout(PATIENCE, committed.next())
            .await
            .expect("the commit lane delivers")
            .expect("open")
            .expect("an event");
        assert_eq!(item.commit_sequence.get(), position);
    }
    let (state, settled) = subscription
        .wait_for(PATIENCE, |s| s.position.get() >= last)
        .await;
    assert!(
        settled,
        "the subscription checkpointed to {last}: {state:?}"
    );
    assert_eq!(handled.load(AtomicOrdering::SeqCst), expected);
    assert!(
        common::invariants::log_reaches(&roles.admin, expected).await,
        "the log holds what the listener heard"
    );

    let status = outbox.status().await.expect("a writer reads status");
    assert_eq!(status.commit_head.get(), expected);
    assert_eq!(status.insert_frontier.get(), last);
    assert!(status.rows_above_head.is_empty());
    assert_eq!(status.subscriptions.len(), 1);
    assert_eq!(status.subscriptions[0].lag, 0, "{status:?}");

    subscription.shutdown().await;
    outbox.shutdown().await;
    let (placeholders, partitions): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM ordo.events WHERE payload IS NULL),
                (SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                 WHERE i.inhparent = 'ordo.events'::regclass
                   AND c.relowner = (SELECT oid FROM pg_roles WHERE rolname = $1))",
    )
    .bind(&roles.operator)
    .fetch_one(&roles.admin)
    .await
    .expect("counts");
    assert!(placeholders >= 2, "the rolled-back holes were filled");
    assert!(
        partitions >= 3,
        "events landed in the operator's partitions"
    );
    check_log(&roles.admin, &ORDO).await.expect("commit log");
    writer.close().await;
    operator.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_runs_status_and_listens_with_the_sequencer_off_but_cannot_publish() {
    let roles = Roles::new(1_000_000).await;
    let writer_pool = roles.pool_as(&roles.writer, 4).await;
    let writer = Outbox::<Note>::new(writer_pool.clone(), OutboxConfig::default())
        .await
        .expect("writer outbox");
    let reader_pool = roles.pool_as(&roles.reader, 4).await;
    let reader = Outbox::<Note>::new(reader_pool.clone(), OutboxConfig::new().sequencer(false))
        .await
        .expect("a reader starts an outbox with the sequencer off");
    let mut inserted = reader.listen_inserted(Start::Beginning);
    let mut committed = reader.listen_committed(Start::Beginning);

    for n in 0..5 {
        let mut tx = writer.begin().await.expect("begin");
        tx.publish_all([Note { writer: n, n: 0 }, Note { writer: n, n: 1 }])
            .expect("publish");
        tx.commit().await.expect("commit");
    }
    for _ in 0..10 {
        tokio::time::timeout(PATIENCE, inserted.next())
            .await
            .expect("the reader's insert lane delivers")
            .expect("open")
            .expect("an event");
    }
    for position in 1..=10 {
        let item = tokio::time::timeout(PATIENCE, committed.next())
            .await
            .expect("the reader's commit lane delivers")
            .expect("open")
            .expect("an event");
        assert_eq!(item.commit_sequence.get(), position);
    }
    let status = ordo::admin::status(&reader_pool)
        .await
        .expect("a reader reads status");
    assert_eq!(status.commit_head.get(), 10);

    let mut tx = reader.begin().await.expect("begin");
    tx.publish(Note { writer: 7, n: 7 }).expect("buffer");
    assert!(denied_ordo(tx.commit().await), "a reader published");

    reader.shutdown().await;
    writer.shutdown().await;
    reader_pool.close().await;
    writer_pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readers_status_reports_a_stall_it_may_not_probe() {
    let roles = Roles::new(1_000_000).await;
    let writer = roles.pool_as(&roles.writer, 2).await;
    let reader = roles.pool_as(&roles.reader, 2).await;
    // A writer draws a sequence and holds its transaction open without writing the row; an
    // event commits above it.
    let mut holder = writer.begin().await.expect("begin");
    let holder_pid: i32 = sqlx::query_scalar(
        "SELECT pg_backend_pid() FROM (SELECT pg_current_xact_id(), nextval('ordo.events_sequence')) AS drawn",
    )
    .fetch_one(&mut *holder)
    .await
    .expect("draw");
    sqlx::query("INSERT INTO ordo.events (payload) VALUES ('{\"writer\": 1, \"n\": 1}')")
        .execute(&writer)
        .await
        .expect("publish above the hole");
    // Status never writes (a reader may not): it names the only transaction that has drawn an
    // event sequence and not ended.
    let stalled = eventually(PATIENCE, || async {
        let status = ordo::admin::status(&reader)
            .await
            .expect("a reader reads status");
        status.stalls.iter().any(|stall| {
            stall.lane == ordo::Ordering::Insert
                && stall.holder.as_ref().is_some_and(|h| h.pid == holder_pid)
        })
    })
    .await;
    assert!(stalled, "the stall on sequence 1 was not reported");
    holder.rollback().await.expect("rollback");
    writer.close().await;
    reader.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_are_idempotent_bind_odd_names_and_refuse_unrestrictable_roles() {
    let mut roles = Roles::new(1_000_000).await;
    let grants = Grants::writer(&roles.writer).and(Grants::reader(&roles.reader));
    ordo::admin::grant(&roles.admin, &grants)
        .await
        .expect("again");

    // A name that would break a statement built by string formatting.
    let odd = format!("{} \"x\"; DROP TABLE ordo.events; --", roles.writer);
    roles.adopt(&odd);
    exec(&roles.admin, &format!("CREATE ROLE {} LOGIN", quote(&odd))).await;
    ordo::admin::grant(&roles.admin, &Grants::writer(&odd))
        .await
        .expect("grant to an odd name");
    let (payload, sequence, xid): (bool, bool, bool) = sqlx::query_as(
        "SELECT has_column_privilege($1, 'ordo.events', 'payload', 'INSERT'),
                has_column_privilege($1, 'ordo.events', 'sequence', 'INSERT'),
                has_column_privilege($1, 'ordo.events', 'commit_xid', 'INSERT')",
    )
    .bind(&odd)
    .fetch_one(&roles.admin)
    .await
    .expect("privileges");
    assert_eq!((payload, sequence, xid), (true, false, false));

    // A writer that had table-level INSERT loses it: column privileges would restrict nothing.
    exec(
        &roles.admin,
        &format!("GRANT INSERT ON ordo.events TO {}", quote(&odd)),
    )
    .await;
    ordo::admin::grant(&roles.admin, &Grants::writer(&odd))
        .await
        .expect("grant again");
    let sequence: bool =
        sqlx::query_scalar("SELECT has_column_privilege($1, 'ordo.events', 'sequence', 'INSERT')")
            .bind(&odd)
            .fetch_one(&roles.admin)
            .await
            .expect("privileges");
    assert!(!sequence, "a table-level INSERT survived the writer grant");

    for (grants, role) in [
        (Grants::writer(&roles.owner), roles.owner.clone()),
        (Grants::reader("postgres"), "postgres".to_owned()),
        (
            Grants::writer(format!("{}_missing", roles.writer)),
            format!("{}_missing", roles.writer),
        ),
    ] {
        match ordo::admin::grant(&roles.admin, &grants).await {
            Err(Error::Grant { role: named, .. }) => assert_eq!(named, role),
            other => panic!("granting to {role} was not refused: {other:?}"),
        }
    }

    // The operator is a member of the owner, which is what makes partitions possible.
    let member: bool = sqlx::query_scalar("SELECT pg_has_role($1, $2, 'MEMBER')")
        .bind(&roles.operator)
        .bind(&roles.owner)
        .fetch_one(&roles.admin)
        .await
        .expect("membership");
    assert!(member);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_is_refused_while_a_superuser_owns_the_schema() {
    let db = TestDb::new().await;
    match ordo::admin::grant(&db.pool, &Grants::operator("postgres")).await {
        Err(Error::Grant { kind, reason, .. }) => {
            assert_eq!(kind, "operator");
            assert!(reason.contains("superuser"), "{reason}");
        }
        other => panic!("an operator of a superuser-owned schema: {other:?}"),
    }
}

/// WARN events of this test binary, as text (the lane's report is checked through them).
fn warnings() -> &'static Mutex<Vec<String>> {
    static WARNINGS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    WARNINGS.get_or_init(|| {
        use tracing_subscriber::layer::SubscriberExt;
        let _ =
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Recorder));
        Mutex::new(Vec::new())
    })
}

struct Recorder;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Recorder {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _context: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if *event.metadata().level() != tracing::Level::WARN {
            return;
        }
        struct Text(String);
        impl tracing::field::Visit for Text {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!("{}={value:?} ", field.name()));
            }
        }
        let mut text = Text(String::new());
        event.record(&mut text);
        if let Ok(mut warnings) = warnings().lock() {
            warnings.push(text.0);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_row_above_the_head_is_reported_not_filled_up_to() {
    let _ = warnings();
    let db = TestDb::new().await;
    let outbox = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let mut inserted = outbox.listen_inserted(Start::Beginning);
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish_all([Note { writer: 1, n: 0 }, Note { writer: 1, n: 1 }])
        .expect("publish");
    tx.commit().await.expect("commit");
    for _ in 0..2 {
        inserted.next().await.expect("open").expect("event");
    }

    // As the owner, whom column privileges do not restrict.
    let top = head(&db.pool).await;
    let forged = top + 200;
    sqlx::query(
        "INSERT INTO ordo.events (sequence, commit_xid, payload) VALUES ($1, 1, '{\"writer\": 0, \"n\": 0}')",
    )
    .bind(forged)
    .execute(&db.pool)
    .await
    .expect("forge a row");
    // Another writer's publish (plain SQL: not handed to this process's lane) makes the lane
    // look at the table above what it knows, where it meets the forged row.
    sqlx::query("INSERT INTO ordo.events (payload) VALUES ('{\"writer\": 3, \"n\": 0}')")
        .execute(&db.pool)
        .await
        .expect("plain SQL publish");
    let event = tokio::time::timeout(PATIENCE, inserted.next())
        .await
        .expect("delivered")
        .expect("open")
        .expect("event");
    assert_eq!(event.payload, Note { writer: 3, n: 0 });

    let named = format!("sequence {forged}");
    let reported = eventually(PATIENCE, || async {
        warnings()
            .lock()
            .map(|w| w.iter().any(|line| line.contains(&named)))
            .unwrap_or(false)
    })
    .await;
    assert!(
        reported,
        "the insert lane did not report the row at {forged}"
    );
    let placeholders: i64 =
        sqlx::query_scalar("SELECT count(*) FROM ordo.events WHERE payload IS NULL")
            .fetch_one(&db.pool)
            .await
            .expect("placeholders");
    assert_eq!(placeholders, 0, "placeholders written up to a forged row");

    // Publishing goes on: no placeholder took the sequences writers draw next.
    for n in 0..5 {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish(Note { writer: 2, n }).expect("publish");
        tx.commit().await.expect("a publish after the forged row");
        let event = tokio::time::timeout(PATIENCE, inserted.next())
            .await
            .expect("delivered")
            .expect("open")
            .expect("event");
        assert_eq!(event.payload, Note { writer: 2, n });
    }

    let status = outbox.status().await.expect("status");
    assert_eq!(
        status
            .rows_above_head
            .iter()
            .map(|s| s.get() as i64)
            .collect::<Vec<_>>(),
        vec![forged]
    );
    assert!(ordo::admin::status_table(&status).contains("rows above the sequence head"));

    // The operator deletes the row and writers draw past its sequence: the real event there is
    // delivered, not the forged row the lane once read.
    sqlx::query("DELETE FROM ordo.events WHERE sequence = $1")
        .bind(forged)
        .execute(&db.pool)
        .await
        .expect("delete the forged row");
    sqlx::query("SELECT setval('ordo.events_sequence', $1 - 1)")
        .bind(forged)
        .execute(&db.pool)
        .await
        .expect("move the head to below the forged sequence");
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(Note { writer: 4, n: 0 }).expect("publish");
    tx.commit()
        .await
        .expect("the publish at the forged sequence");
    // Everything between the old head and the forged sequence is a hole to fill.
    let event = tokio::time::timeout(PATIENCE, inserted.next())
        .await
        .expect("delivered")
        .expect("open")
        .expect("event");
    assert_eq!(event.sequence.get() as i64, forged);
    assert_eq!(event.payload, Note { writer: 4, n: 0 });
    outbox.shutdown().await;
}

/// The backend's xid while it waits, blocked, to draw its sequence: `None` means it drew (or
/// tried to draw) a sequence before it had a transaction id.
async fn xid_while_drawing(db: &TestDb, publish: impl Future<Output = ()> + Send + 'static) {
    // ALTER SEQUENCE holds a lock that nextval waits on, until this transaction ends.
    let mut lock = db.pool.begin().await.expect("begin");
    sqlx::query("ALTER SEQUENCE ordo.events_sequence CACHE 1")
        .execute(&mut *lock)
        .await
        .expect("lock the sequence");
    let publishing = tokio::spawn(publish);
    // The waiting insert's backend_xid (None: it had none while waiting to draw).
    let seen: Arc<Mutex<Option<Option<String>>>> = Arc::new(Mutex::new(None));
    let blocked = eventually(PATIENCE, || {
        let pool = db.pool.clone();
        let seen = Arc::clone(&seen);
        async move {
            let row: Option<(Option<String>,)> = sqlx::query_as(
                "SELECT backend_xid::text FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()
                   AND wait_event_type = 'Lock' AND query ILIKE '%INSERT INTO ordo.events%'",
            )
            .fetch_optional(&pool)
            .await
            .expect("pg_stat_activity");
            let found = row.is_some();
            if let (Some((xid,)), Ok(mut seen)) = (row, seen.lock()) {
                *seen = Some(xid);
            }
            found
        }
    })
    .await;
    lock.rollback().await.expect("unlock");
    publishing.await.expect("the publish ends");
    assert!(blocked, "the insert never waited on the sequence");
    let xid = seen.lock().ok().and_then(|seen| seen.clone()).flatten();
    assert!(
        xid.is_some(),
        "the insert drew its sequence before it had a transaction id"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_inserts_and_publishes_have_their_xid_before_they_draw_a_sequence() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    xid_while_drawing(&db, async move {
        sqlx::query("INSERT INTO ordo.events (payload) VALUES ('{\"writer\": 1, \"n\": 1}')")
            .execute(&pool)
            .await
            .expect("plain insert");
    })
    .await;

    let outbox = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let publisher = outbox.clone();
    xid_while_drawing(&db, async move {
        let mut tx = publisher.begin().await.expect("begin");
        tx.publish_all([Note { writer: 2, n: 1 }, Note { writer: 2, n: 2 }])
            .expect("publish");
        tx.commit().await.expect("commit");
    })
    .await;
    outbox.shutdown().await;
}

#[cfg(feature = "cli")]
mod cli {
    use super::*;

    const ORDO_BIN: &str = env!("CARGO_BIN_EXE_ordo");

    fn ordo(url: &str, args: &[&str]) -> std::process::Output {
        std::process::Command::new(ORDO_BIN)
            .args(args)
            .env("DATABASE_URL", url)
            .output()
            .expect("run ordo")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ordo_grant_grants_each_role_and_names_a_missing_one() {
        let mut roles = Roles::new(1_000_000).await;
        let (writer, reader) = (
            format!("{}_cli", roles.writer),
            format!("{}_cli", roles.reader),
        );
        for role in [&writer, &reader] {
            roles.adopt(role);
            exec(&roles.admin, &format!("CREATE ROLE {} LOGIN", quote(role))).await;
        }
        let admin_url = roles.url.clone();
        let done = ordo(
            &admin_url,
            &["grant", "--writer", &writer, "--reader", &reader],
        );
        assert!(
            done.status.success(),
            "{}",
            String::from_utf8_lossy(&done.stderr)
        );
        let (w_payload, w_sequence, r_select, r_insert): (bool, bool, bool, bool) = sqlx::query_as(
            "SELECT has_column_privilege($1, 'ordo.events', 'payload', 'INSERT'),
                        has_column_privilege($1, 'ordo.events', 'sequence', 'INSERT'),
                        has_table_privilege($2, 'ordo.events', 'SELECT'),
                        has_table_privilege($2, 'ordo.events', 'INSERT')",
        )
        .bind(&writer)
        .bind(&reader)
        .fetch_one(&roles.admin)
        .await
        .expect("privileges");
        assert_eq!(
            (w_payload, w_sequence, r_select, r_insert),
            (true, false, true, false)
        );

        let missing = format!("{writer}_missing");
        let refused = ordo(&admin_url, &["grant", "--writer", &missing]);
        assert!(!refused.status.success());
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(stderr.contains(&missing), "{stderr}");
        let nothing = ordo(&admin_url, &["grant"]);
        assert!(!nothing.status.success(), "ordo grant without a role");
    }
}

/// Secret keys: an operator names them (a writer may not); a writer's outbox removes them from
/// the events every reader passed through `ordo.scrub_secrets` alone, with no right to update
/// `ordo.events`; a reader sees which keys are secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_names_secret_keys_and_a_writer_scrubs_without_updating_events() {
    let roles = Roles::new(1_000_000).await;
    let (operator, writer, reader) = (
        roles.pool_as(&roles.operator, 2).await,
        roles.pool_as(&roles.writer, 6).await,
        roles.pool_as(&roles.reader, 2).await,
    );
    assert!(denied_ordo(
        ordo::admin::add_secret_keys(&writer, None, &["pin"]).await
    ));
    ordo::admin::add_secret_keys(&operator, None, &["pin"])
        .await
        .expect("an operator names a secret key");
    assert_eq!(
        ordo::admin::list_secret_keys(&reader)
            .await
            .expect("a reader lists them")
            .len(),
        1
    );
    assert!(denied(
        sqlx::query("UPDATE ordo.events SET payload = '{}'")
            .execute(&writer)
            .await
    ));
    assert!(denied_ordo(ordo::admin::scrub_secrets(&reader).await));

    let config = OutboxConfig::default().maintenance_interval(Duration::from_millis(100));
    let outbox = Outbox::<serde_json::Value>::new(writer.clone(), config)
        .await
        .expect("a writer starts an outbox");
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(serde_json::json!({"n": 1, "pin": 1234}))
        .expect("publish");
    tx.commit().await.expect("commit");
    let scrubbed = eventually(PATIENCE, || async {
        let payload: serde_json::Value =
            sqlx::query_scalar("SELECT payload FROM ordo.events WHERE payload IS NOT NULL")
                .fetch_one(&roles.admin)
                .await
                .expect("payload");
        payload == serde_json::json!({"n": 1})
    })
    .await;
    assert!(scrubbed, "the writer's maintainer scrubs");
    outbox.shutdown().await;
}

/// The role that runs relays (a writer) stores its relay's sink state: a webhook relay of the
/// writer's to a port where nothing listens shows `sink down` in a reader's `admin::status`
/// (migration `20261205000200_relay_sink_down`; the writer's table-level UPDATE covers it).
#[cfg(feature = "http")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_stores_its_relays_sink_state_and_a_reader_sees_it() {
    let roles = Roles::new(1_000_000).await;
    let writer = roles.pool_as(&roles.writer, 4).await;
    let outbox = Outbox::<Note>::new(writer.clone(), OutboxConfig::default())
        .await
        .expect("a writer starts an outbox");
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address").port()
    };
    let sink = ordo::relay::http::WebhookSink::builder(
        format!("http://127.0.0.1:{port}/in"),
        b"a-webhook-secret-of-32-bytes-len".to_vec(),
    )
    .build()
    .expect("sink");
    let relay = outbox
        .relay(
            ordo::relay::RelayConfig::new("roles-relay"),
            sink,
            |_: &ordo::Envelope<Note>| ordo::Keys::none(),
        )
        .await
        .expect("a writer runs a relay");
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(Note { writer: 0, n: 0 }).expect("publish");
    tx.commit().await.expect("commit");
    let reader = roles.pool_as(&roles.reader, 2).await;
    let down = eventually(PATIENCE, || async {
        ordo::admin::status(&reader)
            .await
            .expect("a reader's status")
            .subscriptions
            .iter()
            .any(|sub| sub.name == "roles-relay" && sub.sink_down.is_some())
    })
    .await;
    assert!(down, "the writer's relay never stored its sink state");
    relay.shutdown().await;
    outbox.shutdown().await;
}
