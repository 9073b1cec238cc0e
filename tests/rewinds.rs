//! A database that goes back in time on the same server history (2026-12-07): a restore from
//! `pg_dump`, and a data-directory snapshot rolled back. Under a running relay (to NATS
//! JetStream) and a watermark inbox downstream, the outbox detects the rewind and begins a new
//! server history where positions are given again; the relay sends it, and the inbox reports
//! the rewind and takes every new event instead of dropping it as a duplicate. Both sides name
//! the positions lost, in a log line and a metric.
#![cfg(all(feature = "nats", feature = "cli"))]

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use common::brokers::{NATS_ADDR, TestStream};
use common::cluster::Cluster;
use common::logs::Recorder;
use common::relays::config;
use common::{TestDb, eventually};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use ordo::inbox::{Inbox, InboxConfig, InboxHandler, InboxMessage, InboxMode, NatsInbox};
use ordo::relay::nats::NatsSink;
use ordo::{Error, HandlerError, Keys, Outbox, OutboxConfig, SubscriptionHandle};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool};

const PATIENCE: Duration = Duration::from_secs(90);
const SOURCE: &str = "orders-db";
const CONSUMER: &str = "b-projection";

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Note {
    n: u32,
}

/// One projection row per handled message (no unique key: a second run is a second row).
struct Project;

impl InboxHandler for Project {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        message: &InboxMessage,
    ) -> Result<(), HandlerError> {
        let position = message
            .position
            .ok_or("a watermark message has a position")?;
        sqlx::query("INSERT INTO projection (position, event_id) VALUES ($1, $2)")
            .bind(i64::try_from(position)?)
            .bind(&message.id)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

/// What this binary logs and counts, recorded once for both tests, which run one at a time.
struct Seen {
    logs: Recorder,
    metrics: Snapshotter,
    one_at_a_time: tokio::sync::Mutex<()>,
}

fn seen() -> &'static Seen {
    static SEEN: OnceLock<Seen> = OnceLock::new();
    SEEN.get_or_init(|| {
        use tracing_subscriber::layer::SubscriberExt;
        let logs = Recorder::default();
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(logs.clone()))
            .expect("the only subscriber of this binary");
        let recorder = DebuggingRecorder::new();
        let metrics = recorder.snapshotter();
        metrics::set_global_recorder(recorder).expect("the only recorder of this binary");
        Seen {
            logs,
            metrics,
            one_at_a_time: tokio::sync::Mutex::new(()),
        }
    })
}

/// Forgets what was counted so far (a snapshot resets the counters).
fn reset_counts() {
    let _ = seen().metrics.snapshot();
}

/// The sending side: an outbox and its relay to a stream, one key (commit order).
struct Sender {
    outbox: Outbox<Note>,
    _relay: SubscriptionHandle,
}

impl Sender {
    async fn start(pool: PgPool, stream: &TestStream) -> Sender {
        let outbox = Outbox::<Note>::new(pool, OutboxConfig::default())
            .await
            .expect("outbox");
        let sink = NatsSink::builder(NATS_ADDR)
            .subject_prefix(&stream.prefix)
            .build()
            .expect("sink");
        let relay = outbox
            .relay(config("a-to-nats").source(SOURCE), sink, |_| {
                Keys::one("all")
            })
            .await
            .expect("relay");
        Sender {
            outbox,
            _relay: relay,
        }
    }

    /// Publishes notes `from..to`, one transaction each, waiting out a restart of the lanes
    /// (a rewind: `begin` refuses until the new lanes run) and the database being away.
    async fn publish(&self, from: u32, to: u32) {
        for n in from..to {
            let deadline = tokio::time::Instant::now() + PATIENCE;
            loop {
                let attempt = async {
                    let mut tx = self.outbox.begin().await?;
                    tx.publish(Note { n })?;
                    tx.commit().await
                };
                match attempt.await {
                    Ok(_) => break,
                    Err(error) if tokio::time::Instant::now() < deadline => {
                        if !matches!(error, Error::ServerRewound { .. }) {
                            eprintln!("publish {n}: {error}; trying again");
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(error) => panic!("publish {n}: {error}"),
                }
            }
        }
    }
}

/// The receiving side: an inbox in watermark mode behind a NATS adapter, and its projection.
struct Receiver {
    pool: PgPool,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Receiver {
    async fn start(pool: PgPool, stream: &TestStream) -> Receiver {
        sqlx::query("CREATE TABLE projection (position BIGINT NOT NULL, event_id TEXT NOT NULL)")
            .execute(&pool)
            .await
            .expect("projection table");
        let inbox = Inbox::new(
            pool.clone(),
            InboxConfig::new(CONSUMER).mode(InboxMode::Watermark),
        )
        .expect("inbox");
        let adapter = NatsInbox::builder(
            format!("nats://{NATS_ADDR}"),
            stream.name.as_str(),
            CONSUMER,
        )
        .ack_wait(Duration::from_secs(2))
        .redelivery(
            ordo::inbox::Redelivery::default()
                .busy(Duration::from_millis(50))
                .gap(Duration::from_millis(50))
                .retry_backoff(Duration::from_millis(50), Duration::from_millis(200)),
        )
        .build()
        .expect("adapter");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = adapter
                .run(&inbox, &Project, async move {
                    let _ = stopped.await;
                })
                .await;
        });
        Receiver { pool, _stop: stop }
    }

    async fn rows(&self) -> Vec<(i64, String)> {
        sqlx::query_as("SELECT position, event_id FROM projection ORDER BY position, event_id")
            .fetch_all(&self.pool)
            .await
            .expect("read the projection")
    }

    async fn has(&self, rows: usize) -> bool {
        eventually(PATIENCE, || async { self.rows().await.len() >= rows }).await
    }
}

/// The ids of the events `pool`'s database holds.
async fn stored_ids(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar("SELECT id::text FROM ordo.events WHERE commit_xid IS NOT NULL ORDER BY id")
        .fetch_all(pool)
        .await
        .expect("stored ids")
}

/// Waits until an outbox began a history after a rewind; returns (from, lost_through).
async fn rewind_history(pool: &PgPool) -> (i64, Option<i64>) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let found = sqlx::query_as::<_, (i64, Option<i64>)>(
            "SELECT from_commit_seq, lost_through FROM ordo.commit_histories WHERE cause = 'rewind'",
        )
        .fetch_optional(pool)
        .await;
        if let Ok(Some(found)) = found {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the outbox begins a new history after the rewind"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What both sides must show after 10 events, a point to go back to, 10 more events handled
/// downstream, the rewind, and 10 new events: every new event handled once, the lost ones
/// handled before (positions 11 to 20), the rewind reported on both sides with its positions.
async fn check_both_sides(a: &PgPool, receiver: &Receiver, before: &[(i64, String)]) {
    let (from, lost_through) = rewind_history(a).await;
    assert_eq!(
        from, 11,
        "the new history begins at the first position given again"
    );
    assert_eq!(
        lost_through,
        Some(20),
        "the sender names the positions lost"
    );
    assert!(
        receiver.has(30).await,
        "{:?}",
        ordo::inbox::list_watermarks(&receiver.pool, None).await
    );
    let rows = receiver.rows().await;
    let ids: std::collections::BTreeSet<&String> = rows.iter().map(|(_, id)| id).collect();
    assert_eq!(ids.len(), rows.len(), "a message handled twice: {rows:?}");
    for id in stored_ids(a).await {
        assert!(
            ids.contains(&id),
            "event {id} of the sender's database was not handled"
        );
    }
    let lost: Vec<&(i64, String)> = before.iter().filter(|(p, _)| *p > 10).collect();
    assert_eq!(lost.len(), 10);
    let marks = ordo::inbox::list_watermarks(&receiver.pool, Some(CONSUMER))
        .await
        .expect("marks");
    let rewind = marks
        .iter()
        .find_map(|mark| mark.rewind.clone())
        .expect("the inbox records the rewind");
    assert_eq!((rewind.from, rewind.through), (11, 20));
    assert_eq!(marks.iter().map(|mark| mark.position).max(), Some(20));
    // Both sides say so in a log line and a metric.
    let logs = seen().logs.events();
    let sender_line = logs.iter().any(|event| {
        event.level == tracing::Level::ERROR
            && event.fields.contains("lost_from=11")
            && event.fields.contains("lost_through=20")
            && event.fields.contains("lost_since=")
    });
    let inbox_line = logs.iter().any(|event| {
        event.level == tracing::Level::ERROR
            && event.fields.contains("lost_from=11")
            && event.fields.contains("lost_through=20")
            && event.fields.contains(CONSUMER)
    });
    assert!(
        sender_line && inbox_line,
        "both sides log the rewind: {logs:?}"
    );
}

/// Metrics counted since the last call, by name.
fn rewound_counts() -> (u64, u64) {
    let snapshot: Vec<_> = seen().metrics.snapshot().into_vec();
    let sum = |name: &str| -> u64 {
        snapshot
            .iter()
            .filter(|(key, ..)| key.key().name() == name)
            .map(|(.., value)| match value {
                DebugValue::Counter(count) => *count,
                _ => 0,
            })
            .sum()
    };
    (
        sum(ordo::metrics::SERVER_REWOUND_POSITIONS),
        sum(ordo::metrics::INBOX_REWOUND_POSITIONS),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_from_a_dump_under_a_running_relay_is_a_new_history_the_inbox_takes() {
    let _one = seen().one_at_a_time.lock().await;
    reset_counts();
    let a = TestDb::new().await;
    let b = TestDb::new().await;
    let stream = TestStream::new().await;
    let receiver = Receiver::start(b.pool.clone(), &stream).await;
    let sender = Sender::start(a.another_pool(6).await, &stream).await;
    sender.publish(0, 10).await;
    assert!(receiver.has(10).await);
    let dump = std::env::temp_dir().join(format!("ordo-rewind-{}.dump", uuid::Uuid::new_v4()));
    let dumped = std::process::Command::new("pg_dump")
        .args(["-Fc", "-d", &a.url, "-f", &dump.to_string_lossy()])
        .status()
        .expect("pg_dump");
    assert!(dumped.success(), "pg_dump");
    sender.publish(10, 20).await;
    assert!(receiver.has(20).await);
    let before = receiver.rows().await;

    // The restore: into a database of its own, which then takes the old one's name.
    let (server, name) = a.url.rsplit_once('/').expect("a database URL");
    let admin = PgPool::connect(&format!("{server}/postgres"))
        .await
        .expect("admin");
    let restored = format!("{name}_restored");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {restored}")))
        .execute(&admin)
        .await
        .expect("create the restore's database");
    let status = std::process::Command::new("pg_restore")
        .args([
            "-d",
            &format!("{server}/{restored}"),
            &dump.to_string_lossy(),
        ])
        .status()
        .expect("pg_restore");
    assert!(status.success(), "pg_restore");
    let _ = std::fs::remove_file(&dump);
    a.pool.close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE {name} WITH (FORCE)"
    )))
    .execute(&admin)
    .await
    .expect("drop the database");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE {restored} RENAME TO {name}"
    )))
    .execute(&admin)
    .await
    .expect("rename the restored database");
    admin.close().await;

    let a_pool = a.another_pool(2).await;
    let (from, _) = rewind_history(&a_pool).await;
    assert_eq!(from, 11);
    sender.publish(100, 110).await;
    check_both_sides(&a_pool, &receiver, &before).await;
    let (sender_count, inbox_count) = rewound_counts();
    assert_eq!(
        (sender_count, inbox_count),
        (10, 10),
        "the positions counted on both sides"
    );
    sender.outbox.shutdown().await;
    a_pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_snapshot_rolled_back_under_a_running_relay_is_a_new_history_the_inbox_takes() {
    let _one = seen().one_at_a_time.lock().await;
    reset_counts();
    let Some(cluster) = Cluster::create("ordo_rewind_snap", 5511, &[]) else {
        return;
    };
    let setup = PgPool::connect(&cluster.url()).await.expect("the cluster");
    ordo::migrate(&setup).await.expect("migrate");
    setup.close().await;
    let a_pool = PgPoolOptions::new()
        .max_connections(6)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&cluster.url())
        .await
        .expect("the sender's pool");
    let b = TestDb::new().await;
    let stream = TestStream::new().await;
    let receiver = Receiver::start(b.pool.clone(), &stream).await;
    let sender = Sender::start(a_pool.clone(), &stream).await;
    sender.publish(0, 10).await;
    assert!(receiver.has(10).await);
    let snapshot = cluster.snapshot();
    sender.publish(10, 20).await;
    assert!(receiver.has(20).await);
    let before = receiver.rows().await;

    cluster.roll_back_to(&snapshot);
    let check = PgPool::connect(&cluster.url())
        .await
        .expect("the cluster again");
    let (from, _) = rewind_history(&check).await;
    assert_eq!(from, 11);
    sender.publish(100, 110).await;
    check_both_sides(&check, &receiver, &before).await;
    let (sender_count, inbox_count) = rewound_counts();
    assert_eq!(
        (sender_count, inbox_count),
        (10, 10),
        "the positions counted on both sides"
    );
    sender.outbox.shutdown().await;
    check.close().await;
    a_pool.close().await;
}
