//! A sequencer that yields tells its peers so on the wake-up channel, and the peer it yields to
//! then announces each append there, so that the follower reads it at once instead of at its
//! next poll. A process alone announces nothing. A follower leaves even its own writers'
//! transactions to the leader, and takes them back when the leader stops.

use crate::common;

use std::time::Duration;

use common::invariants::{ORDO, check_log, counts};
use common::{KillOnDrop, Note, TestDb, eventually};
use ordo::{Outbox, OutboxConfig};
use sqlx::postgres::PgListener;

const PATIENCE: Duration = Duration::from_secs(60);

async fn publish(outbox: &Outbox<Note>, writer: u32, from: u32, transactions: u32) {
    for n in from..from + transactions {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish(Note { writer, n }).expect("publish");
        tx.commit().await.expect("commit");
    }
}

/// Announcements (wake-ups that carry a log head: three fields, the third a number, unlike an
/// outbox's greeting `0 {instance} hello`) heard within `window`.
async fn announcements(listener: &mut PgListener, window: Duration) -> Vec<String> {
    let mut heard = Vec::new();
    let until = tokio::time::Instant::now() + window;
    while let Ok(Ok(notification)) = tokio::time::timeout_at(until, listener.recv()).await {
        let fields: Vec<&str> = notification.payload().split(' ').collect();
        if let [_, _, head] = fields[..]
            && head.parse::<u64>().is_ok()
        {
            heard.push(notification.payload().to_owned());
        }
    }
    heard
}

/// A listener on the wake-up channel, hearing what every process says there.
async fn wake_up_listener(db: &TestDb) -> PgListener {
    let mut listener = PgListener::connect_with(&db.pool).await.expect("listener");
    listener.listen("ordo_events").await.expect("listen");
    listener
}

/// An outbox on a pool of its own, folding: another process, as far as ordo can tell.
async fn folding_process(db: &TestDb, what: &str) -> Outbox<Note> {
    Outbox::<Note>::new(db.another_pool(4).await, OutboxConfig::default())
        .await
        .unwrap_or_else(|error| panic!("{what}: {error}"))
}

/// The leader of the kill tests, in a process of its own (a runtime, or a child process): an
/// outbox on its own pool to the database at `url`, which has written its first 60
/// transactions, so that a follower started beside it learns of them later and yields.
async fn leader_at(url: &str) -> Outbox<Note> {
    let pool = sqlx::PgPool::connect(url).await.expect("the leader's pool");
    let outbox = Outbox::<Note>::new(pool, OutboxConfig::default())
        .await
        .expect("the leader's outbox");
    publish(&outbox, 0, 0, 60).await;
    outbox
}

/// After its leader was killed, the follower writes 100 transactions more alone: it must fold
/// every committed event, the dead leader's included, exactly once.
async fn follower_folds_it_all(db: &TestDb, follower: Outbox<Note>) {
    publish(&follower, 1, 60, 100).await;
    let caught_up = eventually(PATIENCE, || async {
        let (real, logged) = counts(&db.pool).await;
        logged >= real
    })
    .await;
    let (real, logged) = counts(&db.pool).await;
    assert!(
        caught_up,
        "the follower did not take over: {logged} of {real} events logged, head {}",
        follower.commit_head()
    );
    if let Err(broken) = check_log(&db.pool, &ORDO).await {
        panic!("commit log invariant broken: {broken}");
    }
    follower.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_announces_its_appends_once_a_peer_yields_to_it() {
    let db = TestDb::new().await;
    let mut listener = wake_up_listener(&db).await;

    // Alone, a folding process announces nothing.
    let writer = folding_process(&db, "the writer's outbox").await;
    publish(&writer, 0, 0, 50).await;
    assert!(
        eventually(PATIENCE, || async { writer.commit_head().get() >= 50 }).await,
        "the log did not reach 50"
    );
    let alone = announcements(&mut listener, Duration::from_millis(300)).await;
    assert!(alone.is_empty(), "a process alone announced: {alone:?}");

    // A second folding process loses the race once, yields, and says so; the writer's process
    // then announces its appends (each one, where the yielding process speaks once a second).
    let peer = folding_process(&db, "the peer's outbox").await;
    let mut next = 50;
    let mut heard = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while heard.len() < 10 && tokio::time::Instant::now() < deadline {
        publish(&writer, 0, next, 20).await;
        next += 20;
        heard.extend(announcements(&mut listener, Duration::from_millis(200)).await);
    }
    assert!(
        heard.len() >= 10,
        "fewer than 10 announcements while a peer yields: {heard:?}"
    );
    let heads: Vec<u64> = heard
        .iter()
        .filter_map(|payload| payload.rsplit(' ').next()?.parse().ok())
        .collect();
    assert!(
        heads.iter().any(|&head| head > 50),
        "no announcement of an append past the first 50: {heard:?}"
    );
    let total = u64::from(next);
    assert!(
        eventually(PATIENCE, || async {
            writer.commit_head().get() >= total && peer.commit_head().get() >= total
        })
        .await,
        "the log did not reach {total} in both processes"
    );
    if let Err(broken) = check_log(&db.pool, &ORDO).await {
        panic!("commit log invariant broken: {broken}");
    }
    writer.shutdown().await;
    peer.shutdown().await;
}

/// Writes `transactions` transactions from `writer` starting at `from`: every fifth rolls back,
/// every third publishes a group of three. Returns how many events committed.
async fn write_mixed(outbox: &Outbox<Note>, writer: u32, from: u32, transactions: u32) -> u64 {
    let mut committed = 0;
    for n in from..from + transactions {
        let mut tx = outbox.begin().await.expect("begin");
        let size = if n % 3 == 0 { 3 } else { 1 };
        tx.publish_all((0..size).map(|i| Note {
            writer,
            n: n * 10 + i,
        }))
        .expect("publish");
        if n % 5 == 0 {
            tx.rollback().await.expect("rollback");
        } else {
            tx.commit().await.expect("commit");
            committed += u64::from(size);
        }
    }
    committed
}

/// Two folding processes, one following the other: the leader's writer goes first, so the
/// follower learns of those transactions later, loses the race and yields (see
/// tests/fold_turns.rs); then both write `transactions` at once, rollbacks and groups among
/// them, and the follower leaves its own transactions to the leader. Returns both outboxes and
/// how many events committed, once both commit lanes have reached them.
async fn leader_and_follower(db: &TestDb, transactions: u32) -> (Outbox<Note>, Outbox<Note>, u64) {
    let leader = folding_process(db, "the leader's outbox").await;
    let follower = folding_process(db, "the follower's outbox").await;
    let mut total = write_mixed(&leader, 0, 0, 60).await;
    let (a, b) = tokio::join!(
        write_mixed(&leader, 0, 60, transactions),
        write_mixed(&follower, 1, 0, transactions)
    );
    total += a + b;
    assert!(
        both_at(&leader, &follower, total).await,
        "the log did not reach {total} in both processes"
    );
    (leader, follower, total)
}

/// Whether both processes' commit lanes reach `total` within the patience.
async fn both_at(leader: &Outbox<Note>, follower: &Outbox<Note>, total: u64) -> bool {
    eventually(PATIENCE, || async {
        leader.commit_head().get() >= total && follower.commit_head().get() >= total
    })
    .await
}

/// The log's invariants hold and it holds exactly `total` entries: every committed event once,
/// no rolled-back one.
async fn logged_once(db: &TestDb, total: u64) {
    if let Err(broken) = check_log(&db.pool, &ORDO).await {
        panic!("commit log invariant broken: {broken}");
    }
    let logged: i64 = sqlx::query_scalar("SELECT count(*) FROM ordo.commit_log")
        .fetch_one(&db.pool)
        .await
        .expect("count");
    assert_eq!(
        logged as u64, total,
        "every committed event logged once, no rolled-back one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_takes_its_own_transactions_back_when_the_leader_stops() {
    let db = TestDb::new().await;
    let (leader, follower, mut total) = leader_and_follower(&db, 100).await;

    // The leader stops; the follower's own writer goes on and its transactions must still
    // reach the log, appended by the follower once the leader has not covered them in time.
    leader.shutdown().await;
    total += write_mixed(&follower, 1, 100, 100).await;
    assert!(
        eventually(PATIENCE, || async { follower.commit_head().get() >= total }).await,
        "the follower did not take over its own transactions: head {} of {total}",
        follower.commit_head()
    );
    logged_once(&db, total).await;
    follower.shutdown().await;
}

/// The leader is killed while it writes and folds and a follower yields to it: its runtime is
/// dropped at whatever await each task is in, its connections closed mid-statement (the way
/// `tests/commit_lane/fold.rs` kills a process), an append perhaps in flight. The follower hears no
/// announcement any more, its grace runs out and it appends again: every event that committed,
/// the leader's included, is logged exactly once, and what the follower writes afterwards too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_takes_over_from_a_leader_killed_mid_stream() {
    let db = TestDb::new().await;
    let mut listener = wake_up_listener(&db).await;
    let follower = folding_process(&db, "the follower's outbox").await;

    // The leader, in a "process" of its own: a thread with its own runtime and pool. It writes
    // first, so the follower learns of its transactions later and loses the race, then keeps
    // writing until it is killed.
    let (led, leading) = std::sync::mpsc::channel::<()>();
    let (kill, killed) = tokio::sync::oneshot::channel::<()>();
    let url = db.url.clone();
    let leader = std::thread::spawn(move || {
        let runtime = common::victim_runtime();
        runtime.block_on(async {
            let outbox = leader_at(&url).await;
            led.send(()).expect("tell the test");
            tokio::spawn(async move {
                for n in 60.. {
                    let mut tx = outbox.begin().await.expect("begin");
                    tx.publish(Note { writer: 0, n }).expect("publish");
                    tx.commit().await.expect("commit");
                }
            });
            let _ = killed.await;
        });
        runtime.shutdown_background();
    });
    leading.recv().expect("the leader wrote first");

    // Both write; the follower yields, and the leader announces its appends to it.
    publish(&follower, 1, 0, 60).await;
    let heard = announcements(&mut listener, Duration::from_millis(500)).await;
    assert!(
        !heard.is_empty(),
        "no announcement while both wrote: nobody yielded, so no leader was killed"
    );
    kill.send(()).expect("kill the leader");
    leader.join().expect("the leader's thread");

    // The follower writes on alone and must fold it all.
    follower_folds_it_all(&db, follower).await;
}

/// The sender of each announcement in `heard` (its second field, the outbox's instance), with
/// how many it sent, most first.
fn senders(heard: &[String]) -> Vec<(String, usize)> {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for payload in heard {
        let Some(instance) = payload.split(' ').nth(1) else {
            continue;
        };
        match counts.iter_mut().find(|(sender, _)| sender == instance) {
            Some((_, count)) => *count += 1,
            None => counts.push((instance.to_owned(), 1)),
        }
    }
    counts.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
    counts
}

/// Announcements heard while `writes` runs, from when `from` of its transactions are done.
async fn announced_while(
    listener: &mut PgListener,
    outbox: &Outbox<Note>,
    writer: u32,
    from: u32,
    skip: u32,
    transactions: u32,
) -> Vec<String> {
    publish(outbox, writer, from, skip).await;
    let writing = publish(outbox, writer, from + skip, transactions - skip);
    tokio::pin!(writing);
    let mut heard = Vec::new();
    loop {
        tokio::select! {
            _ = &mut writing => break,
            notification = listener.recv() => {
                let notification = notification.expect("the wake-up channel");
                if notification.payload().split(' ').count() == 3 {
                    heard.push(notification.payload().to_owned());
                }
            }
        }
    }
    heard.extend(announcements(listener, Duration::from_millis(100)).await);
    heard
}

/// The lead follows the writes, end to end: while only the leader's process writes, the leader
/// announces its appends; once only the follower's process writes, the follower sees the leader
/// append mostly its transactions, takes the lead back, and from then on it is the follower
/// that appends and announces (a leader announces every append while a peer listens; a
/// yielding process speaks about once a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lead_moves_to_the_process_that_writes() {
    let db = TestDb::new().await;
    let (leader, follower, mut total) = leader_and_follower(&db, 60).await;
    let mut listener = wake_up_listener(&db).await;

    // Only the leader's process writes: it appends, and announces (to the follower, which
    // yields). Its instance is the one heard most.
    let heard = announced_while(&mut listener, &leader, 0, 1_000, 50, 150).await;
    total += 150;
    let before = senders(&heard);
    let Some((first, _)) = before.first().cloned() else {
        panic!("no announcement while the leader wrote alone: nobody yields to it");
    };

    // Only the follower's process writes. Past the take-back window its sequencer leads; the
    // second half of its writes is appended, and announced, by it.
    let heard = announced_while(&mut listener, &follower, 1, 1_000, 150, 300).await;
    total += 300;
    let after = senders(&heard);
    let Some((second, count)) = after.first().cloned() else {
        panic!("no announcement while the follower wrote alone (before: {before:?})");
    };
    assert_ne!(
        second, first,
        "the lead did not move to the process that writes: before {before:?}, after {after:?}"
    );
    assert!(
        count >= 10,
        "the new leader announced {count} appends of 150 transactions: {after:?}"
    );
    assert!(
        both_at(&leader, &follower, total).await,
        "the log did not reach {total} in both processes"
    );
    logged_once(&db, total).await;
    leader.shutdown().await;
    follower.shutdown().await;
}

/// The leader of `a_follower_takes_over_from_a_leader_process_killed_with_sigkill`, run by it
/// in a child process (this test binary again): it writes 60 transactions, says `led` on
/// stdout, then writes and folds until it is killed. `ORDO_TEST_LEADER_URL` names the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
#[ignore = "run in a child process by a_follower_takes_over_from_a_leader_process_killed_with_sigkill"]
async fn leader_process() {
    let url = std::env::var("ORDO_TEST_LEADER_URL").expect("ORDO_TEST_LEADER_URL");
    let outbox = leader_at(&url).await;
    println!("led");
    for n in 60.. {
        publish(&outbox, 0, n, 1).await;
    }
}

/// `leader_process` as the test harness names it in this binary: its module's path without the
/// crate's name (`announce::leader_process`), for `--exact`.
fn leader_test_name() -> String {
    let module = module_path!()
        .split_once("::")
        .map_or("", |(_crate, module)| module);
    if module.is_empty() {
        "leader_process".to_owned()
    } else {
        format!("{module}::leader_process")
    }
}

/// As `a_follower_takes_over_from_a_leader_killed_mid_stream`, with a real process killed with
/// SIGKILL: no task runs on, no socket is closed by the leader, its backends learn of its death
/// from the kernel (a commit or an append in flight may land or not). The follower must still
/// log every event that committed exactly once, and what it writes afterwards too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_takes_over_from_a_leader_process_killed_with_sigkill() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};

    let db = TestDb::new().await;
    let mut listener = wake_up_listener(&db).await;
    let follower = folding_process(&db, "the follower's outbox").await;

    let mut leader = KillOnDrop(
        Command::new(std::env::current_exe().expect("the test binary"))
            .args([&leader_test_name(), "--exact", "--ignored", "--nocapture"])
            .env("ORDO_TEST_LEADER_URL", &db.url)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the leader process"),
    );
    let stdout = leader.0.stdout.take().expect("the leader's stdout");
    let (said, saying) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if line == "led" {
                let _ = said.send(());
            }
        }
    });
    let led = tokio::task::spawn_blocking(move || saying.recv_timeout(PATIENCE))
        .await
        .expect("wait for the leader");
    assert!(
        led.is_ok(),
        "the leader process did not write its first 60 transactions"
    );

    // Both write; the follower yields, and the leader announces its appends to it.
    publish(&follower, 1, 0, 60).await;
    let heard = announcements(&mut listener, Duration::from_millis(500)).await;
    leader.0.kill().expect("SIGKILL the leader");
    leader.0.wait().expect("reap the leader");
    assert!(
        !heard.is_empty(),
        "no announcement while both wrote: nobody yielded, so no leader was killed"
    );

    // The follower writes on alone and must fold it all.
    follower_folds_it_all(&db, follower).await;
}

/// The wake-up connections are lost while a follower yields (the server terminates them, as a
/// restart or a pooler would): no announcement reaches the follower until it has reconnected.
/// Meanwhile it reads what the leader appended at its own polls, or appends its groups itself
/// once the leader has not covered them within the grace; either way every committed event is
/// logged exactly once and both processes' commit lanes reach the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_loses_its_wake_up_connection_still_follows_the_leader() {
    let db = TestDb::new().await;
    let (leader, follower, mut total) = leader_and_follower(&db, 60).await;

    let terminated: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND query LIKE 'LISTEN%'
               AND pid <> pg_backend_pid()) AS t",
    )
    .fetch_one(&db.pool)
    .await
    .expect("terminate the wake-up connections");
    assert!(
        terminated >= 2,
        "expected both processes' wake-up connections, found {terminated}"
    );
    let (a, b) = tokio::join!(
        write_mixed(&leader, 0, 120, 100),
        write_mixed(&follower, 1, 60, 100)
    );
    total += a + b;
    assert!(
        both_at(&leader, &follower, total).await,
        "the log did not reach {total} in both after the wake-ups were lost: leader {}, follower {}",
        leader.commit_head(),
        follower.commit_head()
    );
    logged_once(&db, total).await;
    follower.shutdown().await;
    leader.shutdown().await;
}
