//! Listener streams across failures of the database: a stream retries transient failures
//! (lost connections, a restarting server, pool timeouts) at the same position and never yields
//! them; it yields every event once, in order, before and after.
//!
//! These tests stop and start a PostgreSQL server, so they make a private cluster of their own
//! with `pg_createcluster` (Debian's postgresql-common, run as root) and remove it afterwards,
//! even when the test fails. Where `pg_createcluster` is absent they print why and pass. The
//! shared test server is never restarted.

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use common::cluster::Cluster;
use common::{Note, eventually};
use futures::StreamExt;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use ordo::{CommitStream, EventStream, Outbox, OutboxConfig, Start, metrics as names};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::time::{Instant, timeout};

const PATIENCE: Duration = Duration::from_secs(60);
const CLUSTER: &str = "h4test";
const PORT: u16 = 5499;

/// One private cluster at a time: both tests use the same name and port.
static CLUSTER_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A pool that gives up on a connection after a second, so that a server that is down shows
/// up as failed reads (pool timeouts) quickly.
async fn impatient_pool(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(5)
        .acquire_timeout(Duration::from_secs(1))
        .connect(url)
        .await
        .expect("connect to the private cluster")
}

async fn publish(outbox: &Outbox<Note>, writer: u32, transactions: u32, per_transaction: u32) {
    for t in 0..transactions {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish_all((0..per_transaction).map(|k| Note {
            writer,
            n: t * per_transaction + k,
        }))
        .expect("publish");
        tx.commit().await.expect("commit");
    }
}

/// The recorder of this test binary (recorders are process-wide), installed once.
fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::set_global_recorder(recorder).expect("the only recorder of this binary");
        snapshotter
    })
}

/// Stream retries counted per lane since the last call (the recorder resets counters as it
/// takes a snapshot, so the caller adds them up).
fn retries_since_last_look() -> (u64, u64) {
    let (mut insert, mut commit) = (0, 0);
    for (key, _, _, value) in snapshotter().snapshot().into_vec() {
        if key.key().name() != names::STREAM_RETRIES {
            continue;
        }
        let DebugValue::Counter(count) = value else {
            continue;
        };
        match key.key().labels().find(|label| label.key() == "lane") {
            Some(label) if label.value() == "insert" => insert += count,
            Some(label) if label.value() == "commit" => commit += count,
            _ => {}
        }
    }
    (insert, commit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_survives_a_restart_of_its_pools_server() {
    let _one_cluster = CLUSTER_LOCK.lock().await;
    snapshotter();
    let Some(cluster) = Cluster::create(CLUSTER, PORT, &[]) else {
        return;
    };
    let pool = impatient_pool(&cluster.url()).await;
    ordo::migrate(&pool).await.expect("migrate");
    // A small cache and small pages: a listener from the beginning reads the table, page by
    // page, so it is mid-history when the server goes away.
    let config = OutboxConfig::default().cache_capacity(16).page_size(10);
    let outbox = Outbox::<Note>::new(pool.clone(), config)
        .await
        .expect("outbox");
    let mut inserted = outbox.listen_inserted(Start::Beginning);
    let mut committed = outbox.listen_committed(Start::Beginning);
    publish(&outbox, 1, 10, 10).await;
    let folded = eventually(PATIENCE, || async { outbox.commit_head().get() >= 100 }).await;
    assert!(folded, "the sequencer folded the first 100 events");

    // (position, writer, n) as received: sequences on the insert lane, commit sequences on
    // the commit lane.
    let mut got_inserted = Vec::new();
    let mut got_committed = Vec::new();
    read_30_from_each(
        &mut inserted,
        &mut committed,
        &mut got_inserted,
        &mut got_committed,
    )
    .await;

    cluster.stop_immediate();
    // While the server is down both listeners keep reading (and failing): wait until each has
    // retried at least once; an `Err` item meanwhile fails the test.
    read_until_both_retried(
        &mut inserted,
        &mut committed,
        &mut got_inserted,
        &mut got_committed,
    )
    .await;
    cluster.start();
    publish(&outbox, 2, 5, 10).await;
    read_until_150_from_each(
        &mut inserted,
        &mut committed,
        &mut got_inserted,
        &mut got_committed,
    )
    .await;
    assert_each_event_once_in_publish_order(&got_inserted, &got_committed);
    outbox.shutdown().await;
    pool.close().await;
}

/// What a listener received: (position, writer, n).
type Received = Vec<(u64, u32, u32)>;

/// Thirty events from each lane, one after the other.
async fn read_30_from_each(
    inserted: &mut EventStream<Note>,
    committed: &mut CommitStream<Note>,
    got_inserted: &mut Received,
    got_committed: &mut Received,
) {
    for _ in 0..30 {
        let event = timeout(PATIENCE, inserted.next())
            .await
            .expect("in time")
            .expect("open")
            .expect("an event, not an error");
        got_inserted.push((event.sequence.get(), event.payload.writer, event.payload.n));
        let item = timeout(PATIENCE, committed.next())
            .await
            .expect("in time")
            .expect("open")
            .expect("an event, not an error");
        let note = &item.event.payload;
        got_committed.push((item.commit_sequence.get(), note.writer, note.n));
    }
}

/// Reads on from both lanes until each has retried at least once (the server is down); an
/// `Err` item meanwhile fails the test.
async fn read_until_both_retried(
    inserted: &mut EventStream<Note>,
    committed: &mut CommitStream<Note>,
    got_inserted: &mut Received,
    got_committed: &mut Received,
) {
    retries_since_last_look();
    let (mut insert_retries, mut commit_retries) = (0, 0);
    let deadline = Instant::now() + PATIENCE;
    while insert_retries == 0 || commit_retries == 0 {
        assert!(
            Instant::now() < deadline,
            "no retry seen while the server was down (insert {insert_retries}, commit {commit_retries})"
        );
        tokio::select! {
            item = inserted.next() => {
                let event = item.expect("open").expect("no Err item while the server is down");
                got_inserted.push((event.sequence.get(), event.payload.writer, event.payload.n));
            }
            item = committed.next() => {
                let item = item.expect("open").expect("no Err item while the server is down");
                let note = &item.event.payload;
                got_committed.push((item.commit_sequence.get(), note.writer, note.n));
            }
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
        let (insert, commit) = retries_since_last_look();
        insert_retries += insert;
        commit_retries += commit;
    }
}

/// Reads each lane until it has delivered 150 events.
async fn read_until_150_from_each(
    inserted: &mut EventStream<Note>,
    committed: &mut CommitStream<Note>,
    got_inserted: &mut Received,
    got_committed: &mut Received,
) {
    while got_inserted.len() < 150 {
        let event = timeout(PATIENCE, inserted.next())
            .await
            .unwrap_or_else(|_| panic!("only {} of 150 events arrived", got_inserted.len()))
            .expect("open")
            .expect("an event, not an error");
        got_inserted.push((event.sequence.get(), event.payload.writer, event.payload.n));
    }
    while got_committed.len() < 150 {
        let item = timeout(PATIENCE, committed.next())
            .await
            .unwrap_or_else(|_| panic!("only {} of 150 log items arrived", got_committed.len()))
            .expect("open")
            .expect("an event, not an error");
        let note = &item.event.payload;
        got_committed.push((item.commit_sequence.get(), note.writer, note.n));
    }
}

/// Every event once, in publish order. Sequences after a crash may jump (PostgreSQL logs
/// sequence values ahead), so the insert lane's only have to increase; the commit log is dense.
fn assert_each_event_once_in_publish_order(
    got_inserted: &[(u64, u32, u32)],
    got_committed: &[(u64, u32, u32)],
) {
    let published: Vec<(u32, u32)> = (0..100)
        .map(|n| (1, n))
        .chain((0..50).map(|n| (2, n)))
        .collect();
    let notes = |got: &[(u64, u32, u32)]| -> Vec<(u32, u32)> {
        got.iter().map(|&(_, writer, n)| (writer, n)).collect()
    };
    assert_eq!(
        notes(got_inserted),
        published,
        "insert lane: each event once, in order"
    );
    assert_eq!(
        notes(got_committed),
        published,
        "commit lane: each event once, in order"
    );
    assert!(
        got_inserted.windows(2).all(|w| w[0].0 < w[1].0),
        "insert lane: sequences increase"
    );
    let positions: Vec<u64> = got_committed
        .iter()
        .map(|&(position, ..)| position)
        .collect();
    assert_eq!(
        positions,
        (1..=150).collect::<Vec<u64>>(),
        "commit lane: dense"
    );
}

/// `ordo tail --follow`, run as a real process against the private cluster.
#[cfg(feature = "cli")]
mod tail {
    use std::io::{BufRead, BufReader, Read};
    use std::process::{Command, Stdio};
    use std::sync::{Arc, Mutex};

    use super::*;
    use common::KillOnDrop;

    /// Lines read from a child's pipe by a thread of their own.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<String>>>);

    impl Captured {
        fn collect(&self, pipe: impl Read + Send + 'static) {
            let lines = Arc::clone(&self.0);
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    if let Ok(mut lines) = lines.lock() {
                        lines.push(line);
                    }
                }
            });
        }

        fn lines(&self) -> Vec<String> {
            self.0.lock().map(|lines| lines.clone()).unwrap_or_default()
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tail_follow_keeps_going_across_a_restart_of_its_server() {
        let _one_cluster = CLUSTER_LOCK.lock().await;
        let Some(cluster) = Cluster::create(CLUSTER, PORT, &[]) else {
            return;
        };
        let pool = impatient_pool(&cluster.url()).await;
        ordo::migrate(&pool).await.expect("migrate");
        let outbox = Outbox::<Note>::new(pool.clone(), OutboxConfig::default())
            .await
            .expect("outbox");
        // More than a page of history (2,000 rows), and more than a pipe holds.
        publish(&outbox, 1, 30, 100).await;

        let mut child = Command::new(env!("CARGO_BIN_EXE_ordo"))
            .args(["tail", "--follow"])
            .env("DATABASE_URL", cluster.url())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ordo tail --follow");
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let mut tail = KillOnDrop(child);
        let errors = Captured::default();
        errors.collect(stderr.expect("stderr"));
        // One line read: the tail is reading history. Not reading on, it soon blocks on the full
        // pipe, partway through its first page, with the rest of the history still in the table.
        let mut stdout = BufReader::new(stdout.expect("stdout"));
        let mut first = String::new();
        stdout.read_line(&mut first).expect("the first line");
        assert!(first.contains(r#""sequence":1,"#), "{first}");

        cluster.stop_immediate();
        let printed = Captured::default();
        printed.collect(stdout);
        // The tail drains its page, then fails to read the next one: it must wait (and say so on
        // stderr), not exit.
        let retried = eventually(PATIENCE, || {
            let exited = matches!(tail.0.try_wait(), Ok(Some(_)));
            let warned = errors
                .lines()
                .iter()
                .any(|line| line.contains("transiently"));
            async move { exited || warned }
        })
        .await;
        assert!(retried, "the tail neither retried nor exited");
        assert!(
            matches!(tail.0.try_wait(), Ok(None)),
            "ordo tail --follow exited while the server was down: {:?}",
            errors.lines()
        );
        cluster.start();
        publish(&outbox, 2, 1, 10).await;

        let all = eventually(PATIENCE, || {
            let count = printed.lines().len();
            async move { count >= 3_009 }
        })
        .await;
        assert!(
            all,
            "{} of 3,009 lines after the first; stderr: {:?}",
            printed.lines().len(),
            errors.lines()
        );
        assert!(
            matches!(tail.0.try_wait(), Ok(None)),
            "the tail is still following"
        );
        let lines: Vec<(u64, u64, u64)> = std::iter::once(first)
            .chain(printed.lines())
            .map(|line| {
                let value: serde_json::Value = serde_json::from_str(&line).expect("a JSON line");
                let field = |value: &serde_json::Value| value.as_u64().expect("a number");
                (
                    field(&value["sequence"]),
                    field(&value["payload"]["writer"]),
                    field(&value["payload"]["n"]),
                )
            })
            .collect();
        let notes: Vec<(u64, u64)> = lines.iter().map(|&(_, w, n)| (w, n)).collect();
        let published: Vec<(u64, u64)> = (0..3_000)
            .map(|n| (1, n))
            .chain((0..10).map(|n| (2, n)))
            .collect();
        assert!(notes == published, "every event once, in order");
        assert!(
            lines.windows(2).all(|w| w[0].0 < w[1].0),
            "sequences increase"
        );
        drop(tail);
        outbox.shutdown().await;
        pool.close().await;
    }
}
