//! What a handler learns from its [`Delivery`]: the event's place on the subscription's lane
//! (on the commit lane its commit sequence and group boundary, as the log stores them) and the
//! attempt number, counted across a restart.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Note, TestDb, eventually};
use ordo::{
    CommitSequence, Delivery, HandlerError, JobConfig, OnExhaustion, Ordering, Outbox,
    OutboxConfig, Position, RetryPolicy, Subscriber, SubscriptionState,
};
use sqlx::PgConnection;

const PATIENCE: Duration = Duration::from_secs(30);

/// What a handler was told on one call.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    sequence: u64,
    position: Position,
    ends_group: bool,
    attempt: u32,
}

/// Records every call; fails the first attempt at events whose `n` is 1.
#[derive(Clone, Default)]
struct Recorder {
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Recorder {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("recorder lock").clone()
    }
}

impl Subscriber<Note> for Recorder {
    async fn handle(
        &self,
        _tx: &mut PgConnection,
        event: &Delivery<Note>,
    ) -> Result<(), HandlerError> {
        self.seen.lock().expect("recorder lock").push(Seen {
            sequence: event.sequence.get(),
            position: event.position(),
            ends_group: event.ends_group(),
            attempt: event.attempt(),
        });
        if event.payload.n == 1 && event.attempt() == 1 {
            return Err("first try at n = 1 fails".into());
        }
        Ok(())
    }
}

fn quick_retries(max_attempts: u32, backoff: Duration) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        initial_backoff: backoff,
        max_backoff: backoff,
    }
}

#[tokio::test]
async fn commit_lane_handlers_see_the_logs_place_and_the_attempt_number() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    for writer in 0..2 {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish_all((0..3).map(|n| Note { writer, n }))
            .expect("publish");
        tx.commit().await.expect("commit");
    }
    let recorder = Recorder::default();
    let config = JobConfig::new("context")
        .ordering(Ordering::Commit)
        .retry(quick_retries(5, Duration::from_millis(1)));
    let handle = outbox
        .subscribe(config, recorder.clone())
        .await
        .expect("subscribe");
    assert!(
        eventually(PATIENCE, || async {
            handle.status().position == Position::Commit(CommitSequence::new(6))
        })
        .await,
        "the subscription did not reach commit sequence 6: {:?}",
        handle.status()
    );
    handle.shutdown().await;

    let log: Vec<(i64, i64, bool)> =
        sqlx::query_as("SELECT commit_seq, sequence, group_last FROM ordo.commit_log ORDER BY 1")
            .fetch_all(&db.pool)
            .await
            .expect("commit log");
    assert_eq!(log.len(), 6);
    let mut expected = Vec::new();
    for (commit_seq, sequence, group_last) in &log {
        let seen = Seen {
            sequence: *sequence as u64,
            position: Position::Commit(CommitSequence::new(*commit_seq as u64)),
            ends_group: *group_last,
            attempt: 1,
        };
        // The middle event of each transaction fails once, then succeeds as attempt 2.
        if commit_seq % 3 == 2 {
            expected.push(seen.clone());
            expected.push(Seen { attempt: 2, ..seen });
        } else {
            expected.push(seen);
        }
    }
    assert_eq!(recorder.seen(), expected);
    let boundaries = log.iter().filter(|(_, _, last)| *last).count();
    assert_eq!(
        boundaries, 2,
        "two source transactions, two boundaries: {log:?}"
    );
}

/// Fails every time, recording the attempts it is told.
#[derive(Clone, Default)]
struct AlwaysFails {
    attempts: Arc<Mutex<Vec<u32>>>,
}

impl Subscriber<Note> for AlwaysFails {
    async fn handle(
        &self,
        _tx: &mut PgConnection,
        event: &Delivery<Note>,
    ) -> Result<(), HandlerError> {
        self.attempts
            .lock()
            .expect("attempts lock")
            .push(event.attempt());
        Err("always fails".into())
    }
}

#[tokio::test]
async fn attempts_are_counted_across_a_restart_and_exhaust_on_time() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(Note { writer: 0, n: 0 }).expect("publish");
    tx.commit().await.expect("commit");

    // First runner: two failed attempts, then a backoff long enough to shut it down in.
    let first = AlwaysFails::default();
    let config = JobConfig::new("restarted")
        .lease(Duration::from_secs(300))
        .retry(quick_retries(3, Duration::from_secs(60)))
        .on_exhaustion(OnExhaustion::Halt);
    let handle = outbox
        .subscribe(config.clone(), first.clone())
        .await
        .expect("subscribe");
    let stored_attempts = || async {
        sqlx::query_scalar::<_, i32>("SELECT attempts FROM ordo.subscriptions WHERE name = $1")
            .bind("restarted")
            .fetch_one(&db.pool)
            .await
            .expect("stored attempts")
    };
    assert!(eventually(PATIENCE, || async { stored_attempts().await == 1 }).await);
    handle.shutdown().await;
    outbox.shutdown().await;
    assert_eq!(*first.attempts.lock().expect("attempts lock"), vec![1]);

    // Second process: its first call is attempt 2, its second attempt 3, the last allowed.
    let outbox = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("second outbox");
    let second = AlwaysFails::default();
    let config = config.retry(quick_retries(3, Duration::from_millis(1)));
    let handle = outbox
        .subscribe(config, second.clone())
        .await
        .expect("subscribe again");
    assert!(
        eventually(PATIENCE, || async {
            handle.status().state == SubscriptionState::Halted
        })
        .await,
        "the subscription did not halt: {:?}",
        handle.status()
    );
    assert_eq!(*second.attempts.lock().expect("attempts lock"), vec![2, 3]);
    assert_eq!(stored_attempts().await, 3);
    handle.shutdown().await;
    outbox.shutdown().await;
}
