//! End to end between two ordo databases: A's relay sends its commit lane to NATS JetStream,
//! B's NATS inbox adapter takes it into B's inbox in watermark mode, whose handler keeps a
//! projection. Writers keep committing (and rolling back) on A while A's relay and then B's
//! adapter are killed mid-stream (the adapter between its inbox commit and its ack) and
//! started again. B's projection must hold A's committed
//! events exactly once, each at its commit position.
#![cfg(all(feature = "nats", feature = "rabbitmq"))]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::brokers::{NATS_ADDR, TestStream, addr, nats_url};
use common::projection::{
    Project, SOURCE, a_outbox, assert_projection_is_a_commit_lane, b_inbox, create_projection,
    in_commit_order, projected, start_writers, stop_once_projected, writers_done,
};
use common::relays::config;
use common::tcp_fault::{Fault, TcpFault};
use common::{TestDb, eventually, run_then_kill};
use ordo::inbox::NatsInbox;
use ordo::relay::nats::NatsSink;
use sqlx::PgPool;
use tokio::sync::{Notify, mpsc};

const PATIENCE: Duration = Duration::from_secs(60);
const RELAY: &str = "a-to-nats";
const DURABLE: &str = "b-projection";

fn adapter(url: &str, stream: &TestStream) -> NatsInbox {
    common::brokers::watermark_adapter(url, stream, DURABLE)
}

fn sink(stream: &TestStream) -> NatsSink {
    NatsSink::builder(NATS_ADDR)
        .subject_prefix(&stream.prefix)
        .build()
        .expect("sink")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_into_a_watermark_inbox_projects_each_event_once_across_kills() {
    let a = TestDb::new().await;
    let b = TestDb::new().await;
    create_projection(&b.pool).await;
    let stream = TestStream::new().await;
    let outbox = a_outbox(a.pool.clone()).await;
    let writers = start_writers(&outbox);

    kill_a_relay_once_the_stream_holds_60(&a, &stream).await;
    // Its successor, for the rest of the test (it takes over once the lease expires).
    let relay = outbox
        .relay(config(RELAY).source(SOURCE), sink(&stream), in_commit_order)
        .await
        .expect("relay");
    kill_b_adapter_between_commit_and_ack_at_40(&b, &stream).await;
    let committed = writers_done(writers, &a).await;

    // B's next adapter, until the projection has every committed event.
    let inbox = b_inbox(b.pool.clone());
    let survivor = adapter(NATS_ADDR, &stream);
    let projecting = Project::default();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (ran, ()) = tokio::join!(
        survivor.run(&inbox, &projecting, async move {
            let _ = stopped.await;
        }),
        stop_once_projected(&b.pool, committed, stop)
    );
    ran.expect("the adapter ran");
    relay.shutdown().await;

    assert_projection_is_a_commit_lane(&a, &b, committed).await;
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

/// A's relay, killed once the stream holds 60 messages.
async fn kill_a_relay_once_the_stream_holds_60(a: &TestDb, stream: &TestStream) {
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
}

/// B's adapter, through a proxy, killed between the inbox commit of position 40 and its ack:
/// the handler holds at 40, the proxy cuts the connection, the handler goes on and commits, the
/// adapter dies. Position 40 comes back, at the mark: a duplicate.
async fn kill_b_adapter_between_commit_and_ack_at_40(b: &TestDb, stream: &TestStream) {
    let proxy = Arc::new(TcpFault::start(addr(NATS_ADDR)).await);
    let (b_url, victim_adapter) = (b.url.clone(), adapter(&nats_url(proxy.addr()), stream));
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
}
