//! Operations: `status` names the transaction holding a lane, reports lag per lane and per
//! subscription, and renders for people and for Prometheus.

mod common;

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
        .find(|s| s.lane == "insert")
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

    let table = ordo::status_table(&status);
    assert!(
        table.contains(&format!("holder: pid {held_pid}")),
        "{table}"
    );
    let text = ordo::prometheus_text(&status);
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
        (sub.position, sub.lag, sub.status.as_str()),
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
        _event: &std::sync::Arc<ordo::Envelope<Note>>,
    ) -> Result<(), ordo::HandlerError> {
        Err("this subscription is not meant to run".into())
    }
}
