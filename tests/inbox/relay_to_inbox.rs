//! End to end between two ordo databases: A's relay sends its commit lane to NATS JetStream,
//! B's NATS inbox adapter takes it into B's inbox in watermark mode, whose handler keeps a
//! projection. Writers keep committing (and rolling back) on A while A's relay and then B's
//! adapter are killed mid-stream (the adapter between its inbox commit and its ack) and
//! started again. B's projection must hold A's committed
//! events exactly once, each at its commit position.
#![cfg(all(feature = "nats", feature = "rabbitmq"))]

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::brokers::{NATS_ADDR, TestStream, addr, nats_url};
use common::keyed::Parcel;
use common::relays::config;
use common::tcp_fault::{Fault, TcpFault};
use common::{TestDb, eventually, run_then_kill};
use ordo::HandlerError;
use ordo::inbox::{Inbox, InboxConfig, InboxHandler, InboxMessage, InboxMode, NatsInbox};
use ordo::relay::nats::NatsSink;
use ordo::{Envelope, Keys, Outbox, OutboxConfig};
use sqlx::{PgConnection, PgPool};
use tokio::sync::{Notify, mpsc};

const PATIENCE: Duration = Duration::from_secs(60);
const SOURCE: &str = "ordo-a";
const RELAY: &str = "a-to-nats";
const DURABLE: &str = "b-projection";
const CONSUMER: &str = "b-projection";

/// One key for every event: the relay sends in commit order, as watermark mode wants.
fn in_commit_order(_: &Envelope<Parcel>) -> Keys {
    Keys::one("all")
}

/// B's handler: one projection row per message, at its position. With a gate, it stops at
/// that position, signals, and goes on when let go.
#[derive(Default)]
struct Project {
    gate: Option<(u64, mpsc::UnboundedSender<()>, Arc<Notify>)>,
}

impl InboxHandler for Project {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        message: &InboxMessage,
    ) -> Result<(), HandlerError> {
        let parcel: Parcel = message.payload_as()?;
        let position = message
            .position
            .ok_or("a watermark message has a position")?;
        sqlx::query("INSERT INTO projection (position, event_id, parcel) VALUES ($1, $2, $3)")
            .bind(i64::try_from(position)?)
            .bind(&message.id)
            .bind(i64::from(parcel.id))
            .execute(&mut *tx)
            .await?;
        if let Some((at, entered, go)) = &self.gate
            && *at == position
        {
            let _ = entered.send(());
            go.notified().await;
        }
        Ok(())
    }
}

fn adapter(url: &str, stream: &TestStream) -> NatsInbox {
    common::brokers::watermark_adapter(url, stream, DURABLE)
}

fn b_inbox(pool: PgPool) -> Inbox {
    let config = InboxConfig::new(CONSUMER).mode(InboxMode::Watermark);
    Inbox::new(pool, config).expect("inbox")
}

async fn a_outbox(pool: PgPool) -> Outbox<Parcel> {
    Outbox::<Parcel>::new(pool, OutboxConfig::default())
        .await
        .expect("outbox A")
}

fn sink(stream: &TestStream) -> NatsSink {
    NatsSink::builder(NATS_ADDR)
        .subject_prefix(&stream.prefix)
        .build()
        .expect("sink")
}

async fn projected(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM projection")
        .fetch_one(pool)
        .await
        .expect("count the projection")
}

/// Writers on A: `transactions` each of one or two parcels, every fifth rolled back.
async fn write(outbox: Outbox<Parcel>, writer: u32, transactions: u32) {
    for n in 0..transactions {
        let mut tx = outbox.begin().await.expect("begin");
        let id = writer * 10_000 + n * 2;
        tx.publish(Parcel::new(id, &["all"])).expect("publish");
        if n % 3 == 0 {
            tx.publish(Parcel::new(id + 1, &["all"])).expect("publish");
        }
        if n % 5 == 4 {
            tx.rollback().await.expect("rollback");
        } else {
            tx.commit().await.expect("commit");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_into_a_watermark_inbox_projects_each_event_once_across_kills() {
    let a = TestDb::new().await;
    let b = TestDb::new().await;
    sqlx::query(
        // No unique constraint: a handler run twice would show as a second row, not as an error.
        "CREATE TABLE projection (position BIGINT NOT NULL, event_id TEXT NOT NULL, parcel BIGINT NOT NULL)",
    )
    .execute(&b.pool)
    .await
    .expect("projection table");
    let stream = TestStream::new().await;
    let outbox = a_outbox(a.pool.clone()).await;
    let mut writers = tokio::task::JoinSet::new();
    for writer in 1..=3 {
        writers.spawn(write(outbox.clone(), writer, 120));
    }

    // A's relay, killed once the stream holds 60 messages.
    let (url, prefix, name) = (a.url.clone(), stream.prefix.clone(), stream.name.clone());
    tokio::task::spawn_blocking(move || {
        run_then_kill(move || async move {
            let pool = PgPool::connect(&url).await.expect("victim pool");
            let outbox = a_outbox(pool).await;
            let sink = NatsSink::builder(NATS_ADDR)
                .subject_prefix(&prefix)
                .build()
                .expect("sink");
            let _relay = outbox
                .relay(config(RELAY).source(SOURCE), sink, in_commit_order)
                .await
                .expect("relay");
            let js =
                async_nats::jetstream::new(async_nats::connect(NATS_ADDR).await.expect("nats"));
            let sent = eventually(PATIENCE, || async {
                let Ok(mut stream) = js.get_stream(&name).await else {
                    return false;
                };
                stream
                    .info()
                    .await
                    .is_ok_and(|info| info.state.messages >= 60)
            })
            .await;
            assert!(sent, "the first relay sent 60 messages");
        });
    })
    .await
    .expect("the killed relay");

    // Its successor, for the rest of the test (it takes over once the lease expires).
    let relay = outbox
        .relay(config(RELAY).source(SOURCE), sink(&stream), in_commit_order)
        .await
        .expect("relay");

    // B's adapter, through a proxy, killed between the inbox commit of position 40 and its
    // ack: the handler holds at 40, the proxy cuts the connection, the handler goes on and
    // commits, the adapter dies. Position 40 comes back, at the mark: a duplicate.
    let proxy = Arc::new(TcpFault::start(addr(NATS_ADDR)).await);
    let (b_url, victim_adapter) = (b.url.clone(), adapter(&nats_url(proxy.addr()), &stream));
    let cutter = Arc::clone(&proxy);
    tokio::task::spawn_blocking(move || {
        run_then_kill(move || async move {
            // The victim's own pool: its connections die with its runtime, as a killed
            // process's would. (Sharing B's pool left connections bound to the dead runtime for
            // the test to pick up later: "a Tokio 1.x context was found, but it is being
            // shutdown".)
            let b_pool = PgPool::connect(&b_url).await.expect("victim pool on B");
            let inbox = b_inbox(b_pool.clone());
            let (entered, mut entering) = mpsc::unbounded_channel();
            let go = Arc::new(Notify::new());
            let gated = Project {
                gate: Some((40, entered, Arc::clone(&go))),
            };
            let consuming = tokio::spawn(async move {
                let _ = victim_adapter
                    .run(&inbox, &gated, std::future::pending())
                    .await;
            });
            let at_40 = tokio::time::timeout(PATIENCE, entering.recv()).await;
            assert!(at_40.is_ok(), "the first adapter reached position 40");
            cutter.set(Fault::Cut);
            go.notify_one();
            let committed = eventually(PATIENCE, || async { projected(&b_pool).await >= 40 }).await;
            assert!(committed, "position 40 committed");
            drop(consuming);
        });
    })
    .await
    .expect("the killed adapter");
    drop(proxy);

    while let Some(written) = writers.join_next().await {
        written.expect("a writer");
    }
    let committed: i64 = sqlx::query_scalar("SELECT count(*) FROM ordo.events")
        .fetch_one(&a.pool)
        .await
        .expect("count A's events");

    // B's next adapter, until the projection has every committed event.
    let inbox = b_inbox(b.pool.clone());
    let survivor = adapter(NATS_ADDR, &stream);
    let projecting = Project::default();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (ran, ()) = tokio::join!(
        survivor.run(&inbox, &projecting, async move {
            let _ = stopped.await;
        }),
        async {
            let all =
                eventually(PATIENCE, || async { projected(&b.pool).await >= committed }).await;
            assert!(all, "B projected every committed event of A");
            let _ = stop.send(());
        }
    );
    ran.expect("the adapter ran");
    relay.shutdown().await;

    // Exactly A's committed events, each once, each at its commit position on A.
    let on_a: BTreeMap<i64, String> = sqlx::query_as(
        "SELECT l.commit_seq, e.id::text FROM ordo.commit_log AS l JOIN ordo.events AS e ON e.sequence = l.sequence",
    )
    .fetch_all(&a.pool)
    .await
    .expect("A's commit lane")
    .into_iter()
    .collect();
    let rows: Vec<(i64, String)> = sqlx::query_as("SELECT position, event_id FROM projection")
        .fetch_all(&b.pool)
        .await
        .expect("B's projection");
    assert_eq!(rows.len() as i64, committed, "one projection row per event");
    let on_b: BTreeMap<i64, String> = rows.into_iter().collect();
    assert_eq!(on_a.len() as i64, committed);
    assert_eq!(on_b, on_a, "B's projection is A's commit lane, once each");
    let watermarks = ordo::inbox::list_watermarks(&b.pool, Some(CONSUMER))
        .await
        .expect("watermarks");
    assert_eq!(watermarks.len(), 1);
    assert_eq!(watermarks[0].source, SOURCE);
    assert_eq!(watermarks[0].position, committed as u64);
    // The kills were mid-stream: the stream holds each event once (JetStream dropped what the
    // killed relay's successor sent again), and B's consumer had messages delivered twice.
    assert_eq!(stream.len().await, committed as u64);
    let info = stream.consumer_info(DURABLE).await.expect("B's consumer");
    assert!(
        info.delivered.consumer_sequence > committed as u64,
        "the killed adapter left messages to deliver again: {info:?}"
    );
    drop(outbox);
}
