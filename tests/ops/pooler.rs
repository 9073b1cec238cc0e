//! ordo behind a real PgBouncer (Debian's package, started by each test on a port of its own).
//!
//! In transaction mode the application publishes through the pooler while the background
//! parts run on a direct pool (`OutboxConfig::background_pool`): both lanes and a subscription
//! must be exact, with rollbacks, multi-event transactions and `publish_in`. Every part that
//! needs a session refuses a transaction-mode pool with its one-line explanation, and a
//! prepared-statement clash says what it means. In session mode everything runs through it.
//! A watermark inbox runs through a transaction-mode pooler by itself; a row-mode inbox refuses.

use crate::common;

use std::collections::BTreeSet;
use std::str::FromStr;
use std::time::Duration;

use common::inbox::{all_effects, effects, effects_table};
use common::pgbouncer::{PgBouncer, PoolMode};
use common::subscribers::{
    PATIENCE, Project, assert_exactly_once, projection_table, wait_projected,
};
use common::{Note, TestDb};
use futures::StreamExt;
use ordo::inbox::{Inbox, InboxConfig, InboxHandler, InboxMessage, InboxMode, Receipt};
use ordo::{Error, HandlerError, JobConfig, Ordering, Outbox, OutboxConfig, Start};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use std::sync::atomic::{AtomicBool, AtomicU32};

const WRITERS: u32 = 4;
const TRANSACTIONS: u32 = 60;

async fn pool_on(url: &str, size: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(PgConnectOptions::from_str(url).expect("a valid URL"))
        .await
        .expect("connect")
}

/// What one writer's transaction `t` does: 0 rolls back, 1 or 2 events committed.
fn events_of(t: u32) -> u32 {
    match t % 6 {
        5 => 0,
        0 => 2,
        _ => 1,
    }
}

/// One writer through the pooled pool: domain row and events in one transaction, unnamed
/// statements for its own SQL; every sixth transaction rolls back, every seventh publishes with
/// `publish_in` in a transaction it owns.
async fn write(outbox: Outbox<Note>, pooled: PgPool, writer: u32) {
    for t in 0..TRANSACTIONS {
        let id = writer * 1_000 + t;
        let notes: Vec<Note> = (0..events_of(t).max(1))
            .map(|k| Note { writer: id, n: k })
            .collect();
        if t % 7 == 3 && events_of(t) > 0 {
            let mut tx = pooled.begin().await.expect("begin");
            domain_row(&mut tx, id).await;
            outbox.publish_in(&mut tx, notes).await.expect("publish_in");
            tx.commit().await.expect("commit");
            continue;
        }
        let mut tx = outbox.begin().await.expect("begin");
        domain_row(&mut tx, id).await;
        if t == 0 {
            // A latest value in the same pooled transaction: its upsert is unnamed too.
            tx.publish_latest(&format!("pooler.writer.{writer}"), &id)
                .await
                .expect("publish a latest value");
        }
        tx.publish_all(notes).expect("publish");
        if events_of(t) == 0 {
            tx.rollback().await.expect("rollback");
        } else {
            tx.commit().await.expect("commit");
        }
    }
}

async fn domain_row(conn: &mut PgConnection, id: u32) {
    // Through a transaction-mode pooler the application's own statements are unnamed too.
    sqlx::query("INSERT INTO orders (id) VALUES ($1)")
        .persistent(false)
        .bind(id as i64)
        .execute(conn)
        .await
        .expect("domain row");
}

/// (writer, n) of every event that must be published.
fn expected() -> BTreeSet<(u32, u32)> {
    (0..WRITERS)
        .flat_map(|w| (0..TRANSACTIONS).map(move |t| (w, t)))
        .flat_map(|(w, t)| (0..events_of(t)).map(move |k| (w * 1_000 + t, k)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_through_a_transaction_pooler_keeps_both_lanes_and_a_subscription_exact() {
    let db = TestDb::new().await;
    projection_table(&db.pool).await;
    sqlx::query("CREATE TABLE orders (id BIGINT PRIMARY KEY)")
        .execute(&db.pool)
        .await
        .expect("orders table");
    let bouncer = PgBouncer::start(PoolMode::Transaction, 4).await;
    let pooled = pool_on(&bouncer.url(&db.url), 4).await;
    assert!(
        !ordo::admin::keeps_sessions(&pooled).await.expect("probe"),
        "PgBouncer in transaction mode must be told apart from a session"
    );
    assert!(ordo::admin::keeps_sessions(&db.pool).await.expect("probe"));

    let config = OutboxConfig::default().background_pool(db.another_pool(6).await);
    let outbox = Outbox::<Note>::new(pooled.clone(), config)
        .await
        .expect("an outbox publishing through the pooler");
    let mut inserted = outbox.listen_inserted(Start::Beginning);
    let mut committed = outbox.listen_committed(Start::Beginning);
    let subscription = outbox
        .subscribe(
            JobConfig::new("through-pooler").ordering(Ordering::Commit),
            Project { fail_rate: 0.0 },
        )
        .await
        .expect("subscribe");

    let writers: Vec<_> = (0..WRITERS)
        .map(|w| tokio::spawn(write(outbox.clone(), pooled.clone(), w)))
        .collect();
    for writer in writers {
        writer.await.expect("writer");
    }

    let expected = expected();
    let total = expected.len();
    let mut seen = BTreeSet::new();
    let mut last = 0;
    for _ in 0..total {
        let event = tokio::time::timeout(PATIENCE, inserted.next())
            .await
            .expect("the insert lane delivers every event")
            .expect("the stream is open")
            .expect("an event");
        assert!(event.sequence.get() > last, "the insert lane went back");
        last = event.sequence.get();
        assert!(
            seen.insert((event.payload.writer, event.payload.n)),
            "the insert lane repeated {:?}",
            (event.payload.writer, event.payload.n)
        );
    }
    assert_eq!(seen, expected, "the insert lane's events");

    let mut seen = BTreeSet::new();
    for position in 1..=total as u64 {
        let event = tokio::time::timeout(PATIENCE, committed.next())
            .await
            .expect("the commit lane delivers every event")
            .expect("the stream is open")
            .expect("an event");
        assert_eq!(
            event.commit_sequence.get(),
            position,
            "the commit lane is dense"
        );
        seen.insert((event.event.payload.writer, event.event.payload.n));
    }
    assert_eq!(seen, expected, "the commit lane's events");
    assert!(
        common::invariants::log_reaches(&db.pool, total as u64).await,
        "the log holds what the listener heard"
    );
    common::invariants::check_log(&db.pool, &common::invariants::ORDO)
        .await
        .expect("the commit log's invariants");

    assert!(
        wait_projected(&db.pool, total as i64).await,
        "the subscription handles every event"
    );
    assert_exactly_once(&db.pool).await;
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&db.pool)
        .await
        .expect("orders");
    for writer in 0..WRITERS {
        let latest = outbox
            .latest_value::<u32>(&format!("pooler.writer.{writer}"))
            .await
            .expect("read a latest value")
            .expect("published");
        assert_eq!(*latest.payload, writer * 1_000);
    }
    let committed_transactions = (0..TRANSACTIONS).filter(|&t| events_of(t) > 0).count();
    assert_eq!(orders, (committed_transactions as u32 * WRITERS) as i64);

    subscription.shutdown().await;
    outbox.shutdown().await;
    pooled.close().await;
}

/// The text of an error, checked to be one line that names the pooler and `fix`.
fn assert_one_line(error: &Error, fix: &str) {
    let text = error.to_string();
    assert!(
        matches!(error, Error::TransactionPooler { .. }),
        "not a pooler refusal: {text}"
    );
    assert!(!text.contains('\n'), "one line: {text}");
    assert!(text.contains("transaction-mode pooler"), "{text}");
    assert!(text.contains(fix), "names the fix ({fix}): {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_part_that_needs_a_session_refuses_a_transaction_pooler_in_one_line() {
    let db = TestDb::new().await;
    // One server connection: every client shares it, so a clash of named statements is sure.
    let bouncer = PgBouncer::start(PoolMode::Transaction, 1).await;
    let url = bouncer.url(&db.url);
    let pooled = pool_on(&url, 2).await;

    let refused = Outbox::<Note>::new(pooled.clone(), OutboxConfig::default()).await;
    assert_one_line(
        &refused.err().expect("refused"),
        "OutboxConfig::background_pool",
    );
    let refused = Outbox::<Note>::new(
        db.pool.clone(),
        OutboxConfig::default().background_pool(pooled.clone()),
    )
    .await;
    let error = refused.err().expect("refused");
    assert_one_line(&error, "server itself or to a session-mode pool");
    assert!(
        error
            .to_string()
            .starts_with("OutboxConfig::background_pool")
    );
    let refused = ordo::migrate(&pooled).await;
    assert_one_line(&refused.expect_err("refused"), "migrate on a connection");

    // What a prepared-statement clash means, said where the error is shown.
    let mut first = PgConnection::connect(&url).await.expect("connect");
    let mut second = PgConnection::connect(&url).await.expect("connect");
    let statement = "SELECT $1::int";
    sqlx::query(statement)
        .bind(1)
        .execute(&mut first)
        .await
        .expect("the first client's statement");
    let clash = sqlx::query(statement)
        .bind(2)
        .execute(&mut second)
        .await
        .expect_err("the second client's statement of the same name clashes");
    let text = Error::Database(clash).to_string();
    assert!(text.contains("42P05"), "{text}");
    assert!(text.contains("transaction-mode pooler"), "{text}");
    assert!(!text.contains('\n'), "{text}");

    #[cfg(feature = "cli")]
    {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_ordo"))
            .arg("status")
            .env("DATABASE_URL", &url)
            .output()
            .expect("run ordo");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains("transaction-mode pooler"), "{stderr}");
        assert!(stderr.contains("DATABASE_URL"), "names the fix: {stderr}");
        assert!(!stderr.contains("sqlx_s_"), "{stderr}");
    }
    pooled.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_runs_through_a_session_mode_pooler() {
    let db = TestDb::new().await;
    let bouncer = PgBouncer::start(PoolMode::Session, 20).await;
    let url = bouncer.url(&db.url);
    let pooled = pool_on(&url, 4).await;
    assert!(ordo::admin::keeps_sessions(&pooled).await.expect("probe"));
    ordo::migrate(&pooled).await.expect("migrate through it");
    let outbox = Outbox::<Note>::new(pooled.clone(), OutboxConfig::default())
        .await
        .expect("an outbox through a session pooler");
    let mut committed = outbox.listen_committed(Start::Now);
    for t in 0..20 {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish(Note { writer: t, n: 0 }).expect("publish");
        tx.commit().await.expect("commit");
    }
    for t in 0..20 {
        let event = tokio::time::timeout(PATIENCE, committed.next())
            .await
            .expect("the commit lane delivers")
            .expect("open")
            .expect("an event");
        assert_eq!(event.event.payload.writer, t);
    }
    #[cfg(feature = "cli")]
    {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_ordo"))
            .arg("status")
            .env("DATABASE_URL", &url)
            .output()
            .expect("run ordo");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    outbox.shutdown().await;
    pooled.close().await;
}

/// An inbox handler whose own statement is unnamed, as a transaction-mode pooler needs; its
/// first call for `fail_once` fails after writing its effect (which the rollback must undo).
struct UnnamedEffects {
    fail_once: String,
    failed: AtomicBool,
    calls: AtomicU32,
}

impl InboxHandler for UnnamedEffects {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        message: &InboxMessage,
    ) -> Result<(), HandlerError> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        sqlx::query("INSERT INTO effects (message_id, payload) VALUES ($1, $2)")
            .persistent(false)
            .bind(&message.id)
            .bind(&message.payload)
            .execute(&mut *tx)
            .await?;
        if message.id == self.fail_once
            && !self.failed.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return Err("planned failure".into());
        }
        Ok(())
    }
}

const INBOX_POSITIONS: u64 = 30;

/// Delivers positions 1 to [`INBOX_POSITIONS`] of `source` in order, each until the inbox
/// settles it (`Busy`, `Gap` and `Retry` are redeliveries); returns how many were `Handled`.
async fn deliver_all(inbox: Inbox, handler: std::sync::Arc<UnnamedEffects>) -> u32 {
    let mut handled = 0;
    for position in 1..=INBOX_POSITIONS {
        let message = InboxMessage::new(format!("m{position}"), format!("{{\"p\":{position}}}"))
            .with_source("orders", position);
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let receipt = inbox
                .receive(&message, &*handler)
                .await
                .expect("receive through the pooler");
            if receipt == Receipt::Handled {
                handled += 1;
            }
            if receipt.settled() {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "position {position} never settled: {receipt:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    handled
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watermark_inbox_runs_through_a_transaction_pooler_and_a_row_mode_inbox_refuses() {
    let db = TestDb::new().await;
    effects_table(&db.pool).await;
    // Two server connections for four client connections: a named statement of one client
    // would meet another's of the same name, or miss its own, within a few messages.
    let bouncer = PgBouncer::start(PoolMode::Transaction, 2).await;
    let pooled = pool_on(&bouncer.url(&db.url), 4).await;

    let inbox = Inbox::new(
        pooled.clone(),
        InboxConfig::new("pooled").mode(InboxMode::Watermark),
    )
    .expect("a watermark inbox");
    let handler = std::sync::Arc::new(UnnamedEffects {
        fail_once: "m7".to_owned(),
        failed: AtomicBool::new(false),
        calls: AtomicU32::new(0),
    });
    // Two receivers deliver every message: one handles it, the other hears Duplicate (or
    // Busy while the first holds the mark).
    let first = tokio::spawn(deliver_all(inbox.clone(), std::sync::Arc::clone(&handler)));
    let second = tokio::spawn(deliver_all(inbox.clone(), std::sync::Arc::clone(&handler)));
    let handled = first.await.expect("first receiver") + second.await.expect("second receiver");
    assert_eq!(
        handled as u64, INBOX_POSITIONS,
        "each position handled once"
    );
    for position in 1..=INBOX_POSITIONS {
        assert_eq!(
            effects(&db.pool, &format!("m{position}")).await,
            1,
            "position {position}'s effect committed once"
        );
    }
    assert_eq!(all_effects(&db.pool).await, INBOX_POSITIONS as i64);
    assert_eq!(
        handler.calls.load(std::sync::atomic::Ordering::SeqCst) as u64,
        INBOX_POSITIONS + 1,
        "one failed attempt (m7), retried once"
    );
    let mark: i64 = sqlx::query_scalar(
        "SELECT position FROM ordo.inbox_watermarks WHERE consumer = 'pooled' AND source = 'orders'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("the mark");
    assert_eq!(mark, INBOX_POSITIONS as i64);
    inbox.purge().await.expect("purge through the pooler");

    // Row mode takes a session advisory lock per message: refused, in one line, naming the fix.
    let rows = Inbox::new(pooled.clone(), InboxConfig::new("rows")).expect("a row-mode inbox");
    let message = InboxMessage::new("r1", "{}");
    let refused = rows
        .receive(&message, &*handler)
        .await
        .expect_err("row mode refuses a transaction pooler");
    assert_one_line(&refused, "InboxMode::Watermark");
    let refused = inbox
        .run_pending(&*handler, 10)
        .await
        .expect_err("run_pending takes row locks too");
    assert_one_line(&refused, "InboxMode::Watermark");
    // A broker adapter refuses it when it starts, before it consumes anything, instead of
    // having every message redelivered for ever.
    #[cfg(feature = "nats")]
    {
        let adapter = ordo::inbox::NatsInbox::builder("nats://127.0.0.1:1", "none", "none")
            .build()
            .expect("an adapter");
        let refused = adapter
            .run(&rows, &*handler, std::future::pending::<()>())
            .await
            .expect_err("the adapter refuses a row-mode inbox through the pooler");
        assert_one_line(&refused, "InboxMode::Watermark");
    }
    assert_eq!(effects(&db.pool, "r1").await, 0);
    pooled.close().await;
}
