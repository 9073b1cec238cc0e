//! Operations: `status` names the transaction holding a lane, reports lag per lane and per
//! subscription, and renders for people and for Prometheus.

use crate::common;

use std::time::Duration;

use common::{Note, TestDb, eventually};
use ordo::{JobConfig, LagClock, Outbox, OutboxConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_the_writer_holding_a_gap_with_its_pid_and_age() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");

    // A writer inserts and holds its transaction open; a later one commits above it.
    let mut held = db.pool.begin().await.expect("begin");
    let held_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *held)
        .await
        .expect("pid");
    sqlx::query("SET application_name = 'held-writer'")
        .execute(&mut *held)
        .await
        .expect("name");
    sqlx::query(r#"INSERT INTO ordo.events (payload) VALUES ('{"writer": 1, "n": 1}')"#)
        .execute(&mut *held)
        .await
        .expect("held insert");
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(Note { writer: 2, n: 2 }).expect("publish");
    tx.commit().await.expect("commit");
    // Once the wait is long enough to count as a stall, status reports it.
    let reported = eventually(Duration::from_secs(10), || {
        let outbox = outbox.clone();
        async move { !outbox.status().await.expect("status").stalls.is_empty() }
    })
    .await;
    assert!(reported, "a stall is reported");
    let status = outbox.status().await.expect("status");
    assert_eq!(status.insert_frontier.get(), 0);
    assert_eq!(status.committed_head.get(), 2);
    assert_eq!(
        status.insert_lane.events, 1,
        "one committed event waits behind the hole"
    );
    assert_eq!(
        status.lag_clock,
        LagClock::RecordedAt,
        "the test server does not track commit timestamps"
    );
    let stall = status
        .stalls
        .iter()
        .find(|s| s.lane == ordo::Ordering::Insert)
        .expect("an insert-lane stall");
    assert_eq!(stall.waiting_on.map(|s| s.get()), Some(1));
    let holder = stall.holder.as_ref().expect("the holder is named");
    assert_eq!(holder.pid, held_pid);
    assert_eq!(holder.application_name, "held-writer");
    assert_eq!(holder.state, "idle in transaction");
    assert!(
        holder.transaction_seconds.unwrap_or(0.0) >= 0.2,
        "its transaction age: {holder:?}"
    );
    assert!(
        holder.query.contains("INSERT INTO ordo.events"),
        "its last query: {}",
        holder.query
    );

    let table = ordo::admin::status_table(&status);
    assert!(
        table.contains(&format!("holder: pid {held_pid}")),
        "{table}"
    );
    let text = ordo::admin::prometheus_text(&status);
    assert!(
        text.contains(&format!(
            "ordo_stall_seconds{{lane=\"insert\",holder_pid=\"{held_pid}\"}}"
        )),
        "{text}"
    );
    assert!(
        text.contains("ordo_lane_lag_events{lane=\"insert\"} 1"),
        "{text}"
    );

    // The probe left nothing behind, and once the writer commits the stall is gone.
    held.commit().await.expect("commit the held writer");
    let cleared = eventually(Duration::from_secs(10), || async {
        let status = outbox.status().await.expect("status");
        status.stalls.is_empty()
            && status.insert_frontier.get() == 2
            && status.commit_head.get() == 2
    })
    .await;
    assert!(cleared, "no stall once the holder commits");
    let placeholders: i64 =
        sqlx::query_scalar("SELECT count(*) FROM ordo.events WHERE payload IS NULL")
            .fetch_one(&db.pool)
            .await
            .expect("count");
    assert_eq!(placeholders, 0, "the probe's placeholder was rolled back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_each_subscription_lag_and_oldest_unprocessed_age() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    // A subscription row that exists but has no runner: it falls behind.
    let handle = outbox
        .subscribe(JobConfig::new("idle"), Idle)
        .await
        .expect("subscribe");
    handle.shutdown().await;
    for n in 0..4 {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish(Note { writer: 0, n }).expect("publish");
        tx.commit().await.expect("commit");
    }
    let aged = eventually(Duration::from_secs(10), || {
        let outbox = outbox.clone();
        async move {
            let status = outbox.status().await.expect("status");
            status
                .subscriptions
                .iter()
                .any(|s| s.oldest_unprocessed_seconds.unwrap_or(0.0) >= 0.3)
        }
    })
    .await;
    assert!(aged, "the oldest unprocessed event ages");
    let status = outbox.status().await.expect("status");
    let sub = status
        .subscriptions
        .iter()
        .find(|s| s.name == "idle")
        .expect("listed");
    assert_eq!(
        (sub.position.get(), sub.lag, sub.status.as_str()),
        (0, 4, "active")
    );
    assert!(
        sub.oldest_unprocessed_seconds.unwrap_or(0.0) >= 0.3,
        "{sub:?}"
    );
    assert!(status.stalls.is_empty(), "{:?}", status.stalls);
    let json = serde_json::to_value(&status).expect("serialise");
    assert_eq!(json["subscriptions"][0]["lag"], 4);
}

struct Idle;

impl ordo::Subscriber<Note> for Idle {
    async fn handle(
        &self,
        _tx: &mut sqlx::PgConnection,
        _event: &ordo::Delivery<Note>,
    ) -> Result<(), ordo::HandlerError> {
        Err("this subscription is not meant to run".into())
    }
}

/// A login role that may only read the `ordo` schema, as a monitoring tool would use. Roles are
/// cluster-wide: each test makes its own and drops it, even when the test fails.
struct ReadOnlyRole {
    name: String,
    url: String,
}

impl ReadOnlyRole {
    async fn new(db: &TestDb) -> ReadOnlyRole {
        let name = format!(
            "ordo_monitor_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        for sql in [
            format!("CREATE ROLE {name} LOGIN"),
            format!("GRANT USAGE ON SCHEMA ordo TO {name}"),
            format!("GRANT SELECT ON ALL TABLES IN SCHEMA ordo TO {name}"),
            format!("GRANT SELECT ON ALL SEQUENCES IN SCHEMA ordo TO {name}"),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&db.pool)
                .await
                .expect("create the read-only role");
        }
        let url = db.url.replacen("://postgres@", &format!("://{name}@"), 1);
        assert_ne!(
            url, db.url,
            "the test URL names the postgres user: {}",
            db.url
        );
        ReadOnlyRole { name, url }
    }

    async fn pool(&self) -> sqlx::PgPool {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect(&self.url)
            .await
            .expect("connect as the read-only role")
    }
}

impl Drop for ReadOnlyRole {
    fn drop(&mut self) {
        let name = self.name.clone();
        let url = common::with_database(
            common::server_url(),
            self.url.rsplit('/').next().unwrap_or("postgres"),
        );
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime to drop the role");
            runtime.block_on(async move {
                if let Ok(admin) = sqlx::PgPool::connect(&url).await {
                    for sql in [
                        format!("DROP OWNED BY {name}"),
                        format!("DROP ROLE IF EXISTS {name}"),
                    ] {
                        let _ = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&admin).await;
                    }
                    admin.close().await;
                }
            });
        });
        let _ = dropped.join();
    }
}

/// A session that draws the next sequence the way ordo's writers do (transaction id first)
/// and then sits idle in its transaction without writing its row.
async fn draw_and_idle(db: &TestDb, application: &str) -> (sqlx::PgConnection, i32) {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SET application_name = '{application}'"
    )))
    .execute(&mut conn)
    .await
    .expect("name");
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut conn)
        .await
        .expect("pid");
    for sql in [
        "BEGIN",
        "SELECT pg_current_xact_id()::text",
        "SELECT nextval('ordo.events_sequence')",
    ] {
        sqlx::query(sql).execute(&mut conn).await.expect(sql);
    }
    (conn, pid)
}

async fn commit_plain_event(pool: &sqlx::PgPool) {
    sqlx::query(r#"INSERT INTO ordo.events (payload) VALUES ('{"writer": 9, "n": 9}')"#)
        .execute(pool)
        .await
        .expect("a committed event above the hole");
}

async fn insert_stall(pool: &sqlx::PgPool) -> Option<ordo::Stall> {
    let status = ordo::admin::status(pool).await.expect("status");
    status
        .stalls
        .into_iter()
        .find(|s| s.lane == ordo::Ordering::Insert)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_an_idle_transaction_holding_a_drawn_sequence_even_for_a_read_only_role() {
    let db = TestDb::new().await;
    // No outbox runs: status reads the database alone, as `ordo status` does from elsewhere.
    let (mut held, held_pid) = draw_and_idle(&db, "drew-not-written").await;
    commit_plain_event(&db.pool).await;
    let role = ReadOnlyRole::new(&db).await;
    let monitor = role.pool().await;

    let stalled = eventually(Duration::from_secs(10), || async {
        insert_stall(&monitor).await.is_some()
    })
    .await;
    assert!(stalled, "the stall is reported to the read-only role");
    for (who, pool) in [("read-only role", &monitor), ("owner", &db.pool)] {
        let stall = insert_stall(pool).await.expect("still stalled");
        assert_eq!(stall.waiting_on.map(|s| s.get()), Some(1), "{who}");
        let holder = stall
            .holder
            .as_ref()
            .unwrap_or_else(|| panic!("{who}: the holder is named: {stall:?}"));
        assert_eq!(holder.pid, held_pid, "{who}");
        assert_eq!(holder.application_name, "drew-not-written", "{who}");
        assert!(stall.suspects.is_empty(), "{who}: {stall:?}");
        assert!(
            stall.reason.contains(&format!("pid {held_pid}")),
            "{stall:?}"
        );
    }
    let status = ordo::admin::status(&monitor).await.expect("status");
    let table = ordo::admin::status_table(&status);
    assert!(
        table.contains(&format!(
            "holder: pid {held_pid} application \"drew-not-written\""
        )),
        "{table}"
    );
    assert!(table.contains("pg_read_all_stats"), "{table}");
    let owner = insert_stall(&db.pool).await.expect("stalled");
    assert_eq!(
        owner.holder.map(|h| h.state),
        Some("idle in transaction".to_owned())
    );

    // Status wrote nothing, and once the holder has gone it says so instead of guessing.
    sqlx::query("ROLLBACK")
        .execute(&mut held)
        .await
        .expect("rollback");
    let placeholders: i64 =
        sqlx::query_scalar("SELECT count(*) FROM ordo.events WHERE payload IS NULL")
            .fetch_one(&db.pool)
            .await
            .expect("count");
    assert_eq!(placeholders, 0, "status never writes");
    let stall = insert_stall(&monitor)
        .await
        .expect("nobody resolves it here");
    assert!(
        stall.holder.is_none() && stall.suspects.is_empty(),
        "{stall:?}"
    );
    assert!(stall.reason.contains("ended"), "{}", stall.reason);
    monitor.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_every_candidate_and_never_ordos_own_placeholder_write() {
    let db = TestDb::new().await;
    let config = OutboxConfig::default()
        .gap_grace(Duration::from_millis(20))
        .gap_fill_timeout(Duration::from_millis(300));
    let outbox = Outbox::<Note>::new(db.pool.clone(), config)
        .await
        .expect("outbox");
    // Sequence 1 drawn and not written; sequence 2 written and not committed; 3 committed.
    let (mut first, first_pid) = draw_and_idle(&db, "first-writer").await;
    let mut second = db.pool.begin().await.expect("begin");
    let second_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *second)
        .await
        .expect("pid");
    sqlx::query(r#"INSERT INTO ordo.events (payload) VALUES ('{"writer": 2, "n": 2}')"#)
        .execute(&mut *second)
        .await
        .expect("held insert");
    commit_plain_event(&db.pool).await;
    // The lane gives up on the proof and fills: a placeholder at 1 (uncommitted), then it
    // waits on the writer of 2.
    let filling = eventually(Duration::from_secs(20), || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND query LIKE '%fill_placeholders%')",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap_or(false)
    })
    .await;
    assert!(filling, "the lane's fill waits on the writer of sequence 2");
    let fill_pid: i32 = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
         AND wait_event_type = 'Lock' AND query LIKE '%fill_placeholders%'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("the fill's pid");

    let stall = insert_stall(&db.pool).await.expect("a stall at sequence 1");
    assert!(
        stall.holder.is_none(),
        "two transactions could hold it; status must not pick one: {stall:?}"
    );
    let mut pids: Vec<i32> = stall.suspects.iter().map(|b| b.pid).collect();
    pids.sort_unstable();
    let mut expected = vec![first_pid, second_pid];
    expected.sort_unstable();
    assert_eq!(pids, expected, "{stall:?}");
    assert!(!pids.contains(&fill_pid), "ordo's own fill is never blamed");
    assert!(stall.reason.contains("one of the 2"), "{}", stall.reason);

    sqlx::query("ROLLBACK")
        .execute(&mut first)
        .await
        .expect("rollback");
    second.rollback().await.expect("rollback");
    let cleared = eventually(Duration::from_secs(10), || async {
        outbox.insert_frontier().get() == 3
    })
    .await;
    assert!(cleared, "the lane moves on once both have ended");
    outbox.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_a_prepared_transaction_holding_a_sequence() {
    let db = TestDb::new().await;
    let slots: String = sqlx::query_scalar("SHOW max_prepared_transactions")
        .fetch_one(&db.pool)
        .await
        .expect("show");
    if slots == "0" {
        eprintln!(
            "SKIPPED status_names_a_prepared_transaction_holding_a_sequence: \
             max_prepared_transactions is 0 on this server, so no transaction can be prepared"
        );
        return;
    }
    let gid = format!("ordo-test-{}", uuid::Uuid::new_v4().simple());
    let (mut conn, _) = draw_and_idle(&db, "preparer").await;
    sqlx::query(sqlx::AssertSqlSafe(format!("PREPARE TRANSACTION '{gid}'")))
        .execute(&mut conn)
        .await
        .expect("prepare");
    commit_plain_event(&db.pool).await;
    // Nothing may panic while the transaction is prepared: it would outlive the test (and
    // keep its database from being dropped).
    let stalled = eventually(Duration::from_secs(10), || async {
        ordo::admin::status(&db.pool)
            .await
            .map(|s| !s.stalls.is_empty())
            .unwrap_or(true)
    })
    .await;
    let status = ordo::admin::status(&db.pool).await;
    sqlx::query(sqlx::AssertSqlSafe(format!("ROLLBACK PREPARED '{gid}'")))
        .execute(&db.pool)
        .await
        .expect("rollback prepared");
    let status = status.expect("status");
    let table = ordo::admin::status_table(&status);
    let stall = status
        .stalls
        .into_iter()
        .find(|s| s.lane == ordo::Ordering::Insert);
    assert!(stalled, "a stall is reported");
    let stall = stall.expect("a stall");
    assert_eq!(
        stall
            .prepared
            .iter()
            .map(|p| p.gid.as_str())
            .collect::<Vec<_>>(),
        vec![gid.as_str()],
        "{stall:?}"
    );
    assert!(stall.reason.contains(&gid), "{}", stall.reason);
    assert!(
        table.contains(&format!("prepared transaction: gid \"{gid}\"")),
        "{table}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_show_control_characters_escaped_never_raw() {
    let db = TestDb::new().await;
    let name = "evil\u{1b}[2J\u{9b}31m\u{202e}name";
    let error = "payload said \u{1b}]0;owned\u{7}\nsecond line\r";
    sqlx::query(
        "INSERT INTO ordo.subscriptions (name, lane, status, attempts, last_error) \
         VALUES ($1, 'insert', 'halted', 3, $2)",
    )
    .bind(name)
    .bind(error)
    .execute(&db.pool)
    .await
    .expect("a subscription row");
    let status = ordo::admin::status(&db.pool).await.expect("status");
    let rows = ordo::admin::list_subscriptions(&db.pool)
        .await
        .expect("list");
    for table in [
        ordo::admin::status_table(&status),
        ordo::admin::subscriptions_table(&rows),
    ] {
        assert!(
            !table
                .chars()
                .any(|c| matches!(c, '\u{1b}' | '\u{9b}' | '\u{7}' | '\r' | '\u{202e}')),
            "{table:?}"
        );
        assert!(
            table.contains(r"evil\u{1b}[2J\u{9b}31m\u{202e}name"),
            "{table}"
        );
        assert!(
            table.contains(r"\u{1b}]0;owned\u{7}\nsecond line\r"),
            "{table}"
        );
    }
    let text = ordo::admin::prometheus_text(&status);
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{9b}'),
        "{text:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unmigrated_database_says_to_run_ordo_migrate() {
    let db = TestDb::new().await;
    sqlx::query("DROP SCHEMA ordo CASCADE")
        .execute(&db.pool)
        .await
        .expect("drop the schema");
    let errors = [
        ordo::admin::status(&db.pool).await.expect_err("status"),
        Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
            .await
            .err()
            .expect("Outbox::new"),
    ];
    for error in errors {
        assert!(
            matches!(error, ordo::Error::NotMigrated { .. }),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(message.contains("ordo migrate"), "{message}");
        assert!(message.contains("ordo::migrate(&pool)"), "{message}");
        assert!(!message.contains(" at line "), "{message}");
    }
    ordo::migrate(&db.pool).await.expect("migrate");
    ordo::admin::status(&db.pool)
        .await
        .expect("status once migrated");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_migrated_by_a_newer_ordo_is_refused_naming_both_versions() {
    let db = TestDb::new().await;
    let known = ordo::migrator()
        .iter()
        .map(|m| m.version)
        .max()
        .expect("migrations");
    let future = 99_991_231_000_000_i64;
    sqlx::query(
        "INSERT INTO ordo._sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES ($1, 'from a newer ordo', true, '\\x00', 0)",
    )
    .bind(future)
    .execute(&db.pool)
    .await
    .expect("record a newer migration");
    let errors = [
        Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
            .await
            .err()
            .expect("Outbox::new refuses"),
        ordo::migrate(&db.pool).await.expect_err("migrate refuses"),
    ];
    for error in errors {
        match &error {
            ordo::Error::SchemaTooNew { database, known: k } => {
                assert_eq!((*database, *k), (future, known));
            }
            other => panic!("expected SchemaTooNew, got {other:?}"),
        }
        let message = error.to_string();
        assert!(
            message.contains(&future.to_string()) && message.contains(&known.to_string()),
            "{message}"
        );
    }
}

/// Records the level and target of every event.
#[derive(Clone, Default)]
struct Recorded(std::sync::Arc<std::sync::Mutex<Vec<(tracing::Level, String, String)>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Recorded {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(
                &mut self,
                _field: &tracing::field::Field,
                value: &dyn std::fmt::Debug,
            ) {
                self.0.push_str(&format!("{value:?} "));
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        if let Ok(mut events) = self.0.lock() {
            events.push((
                *event.metadata().level(),
                event.metadata().target().to_owned(),
                message.0,
            ));
        }
    }
}

// One thread: the pool's connections run on it, where the recording subscriber is installed.
#[tokio::test(flavor = "current_thread")]
async fn migrating_an_up_to_date_schema_logs_nothing_above_debug() {
    use tracing_subscriber::layer::SubscriberExt;
    let db = TestDb::new().await;
    let recorded = Recorded::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(recorded.clone()));
    ordo::migrate(&db.pool).await.expect("migrate again");
    let events = recorded.0.lock().expect("events").clone();
    let loud: Vec<_> = events
        .iter()
        .filter(|(level, _, _)| *level <= tracing::Level::INFO)
        .collect();
    assert!(loud.is_empty(), "logged above DEBUG: {loud:?}");
    assert!(
        events
            .iter()
            .any(|(level, target, _)| *level == tracing::Level::DEBUG && target == "ordo::migrate"),
        "a debug event says the schema is up to date: {events:?}"
    );
}
