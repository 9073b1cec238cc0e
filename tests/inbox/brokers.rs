//! The inbox's broker adapters against the real NATS JetStream and RabbitMQ, on a real
//! PostgreSQL: a redelivered message runs its handler once; a crash between the inbox commit
//! and the broker ack is a redelivery the inbox absorbs; two adapters on one queue never run a
//! message twice at once; a failing handler is dead-lettered in the inbox and replayable; a
//! message the inbox cannot store is rejected for good (RabbitMQ: into the derived `.dlq`).
#![cfg(all(feature = "nats", feature = "rabbitmq"))]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::brokers::{InboxQueue, NATS_ADDR, RABBIT_ADDR, TestStream, addr, amqp_uri, nats_url};
use common::inbox::{Recording, all_effects, effects, effects_table, status};
use common::tcp_fault::{Fault, TcpFault};
use common::{TestDb, eventually, run_then_kill};
use ordo::HandlerError;
use ordo::inbox::{
    Inbox, InboxConfig, InboxHandler, InboxMessage, NatsInbox, RabbitInbox, Receipt, Redelivery,
};
use sqlx::{PgConnection, PgPool};
use tokio::sync::{Notify, mpsc};

const PATIENCE: Duration = Duration::from_secs(30);

/// Redeliveries fast enough for a test.
fn quick() -> Redelivery {
    Redelivery::default()
        .busy(Duration::from_millis(50))
        .gap(Duration::from_millis(50))
        .retry_backoff(Duration::from_millis(50), Duration::from_millis(200))
}

async fn setup(consumer: &str, max_attempts: u32) -> (TestDb, Inbox) {
    let db = TestDb::new().await;
    effects_table(&db.pool).await;
    let config = InboxConfig::new(consumer).max_attempts(max_attempts);
    let inbox = Inbox::new(db.pool.clone(), config).expect("inbox");
    (db, inbox)
}

fn nats_adapter(url: &str, stream: &TestStream, durable: &str) -> NatsInbox {
    NatsInbox::builder(url, stream.name.as_str(), durable)
        .ack_wait(Duration::from_secs(1))
        .redelivery(quick())
        .build()
        .expect("a NATS inbox adapter")
}

fn rabbit_adapter(uri: &str, queue: &InboxQueue) -> RabbitInbox {
    RabbitInbox::builder(uri, queue.queue.as_str())
        .bind(queue.exchange.as_str(), "#")
        .prefetch(10)
        .redelivery(quick())
        .build()
        .expect("a RabbitMQ inbox adapter")
}

/// Runs `adapter`-like work in a task until the returned sender is dropped or fires.
fn stopper() -> (tokio::sync::oneshot::Sender<()>, impl Future<Output = ()>) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    (stop, async move {
        let _ = stopped.await;
    })
}

/// Starts the RabbitMQ adapter's queue declaration once, so that publishes before the adapter
/// consumes are routed to its queue.
async fn declare(adapter: &RabbitInbox, inbox: &Inbox, handler: &Recording) {
    adapter
        .run(inbox, handler, async {})
        .await
        .expect("the adapter declares its queue and stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_a_message_delivered_three_times_runs_its_handler_once() {
    let (db, inbox) = setup("billing", 5).await;
    // A short dedup window so that the stream takes the same message id three times.
    let stream = TestStream::with_duplicate_window(Duration::from_millis(100)).await;
    for _ in 0..3 {
        stream
            .publish("placed", &[("Nats-Msg-Id", "order-1")], r#"{"order":1}"#)
            .await;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(stream.len().await, 3, "the stream holds three copies");

    let handler = Recording::default();
    let adapter = nats_adapter(NATS_ADDR, &stream, "billing");
    let (stop, shutdown) = stopper();
    let done = eventually(PATIENCE, || async {
        let info = stream.consumer_info("billing").await;
        info.is_some_and(|info| info.ack_floor.stream_sequence == 3)
    });
    let (ran, ()) = tokio::join!(adapter.run(&inbox, &handler, shutdown), async {
        assert!(done.await, "the three copies were acknowledged");
        let _ = stop.send(());
    });
    ran.expect("the adapter ran");
    assert_eq!(handler.calls(), 1);
    assert_eq!(effects(&db.pool, "order-1").await, 1);
    assert_eq!(
        status(&db.pool, "billing", "order-1").await.as_deref(),
        Some("completed")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_a_message_delivered_three_times_runs_its_handler_once() {
    let (db, inbox) = setup("billing", 5).await;
    let queue = InboxQueue::new().await;
    let handler = Recording::default();
    let adapter = rabbit_adapter(&amqp_uri(addr(RABBIT_ADDR)), &queue);
    declare(&adapter, &inbox, &handler).await;
    for _ in 0..3 {
        queue
            .publish("placed", Some("order-1"), &[], r#"{"order":1}"#)
            .await;
    }
    let routed = eventually(PATIENCE, || async { queue.ready(&queue.queue).await == 3 }).await;
    assert!(routed, "the queue holds three copies");

    let (stop, shutdown) = stopper();
    let (ran, ()) = tokio::join!(adapter.run(&inbox, &handler, shutdown), async {
        let settled = eventually(PATIENCE, || async {
            handler.calls() == 1 && queue.ready(&queue.queue).await == 0
        })
        .await;
        assert!(settled, "the copies were consumed");
        let _ = stop.send(());
    });
    ran.expect("the adapter ran");
    // A clean stop settles what was received: a copy not acknowledged would be back now.
    assert_eq!(
        queue.ready(&queue.queue).await,
        0,
        "every copy acknowledged"
    );
    assert_eq!(handler.calls(), 1);
    assert_eq!(effects(&db.pool, "order-1").await, 1);
}

/// A handler that signals when it is entered and waits to be let go, once; then records.
struct Gated {
    inner: Recording,
    entered: mpsc::UnboundedSender<()>,
    go: Arc<Notify>,
}

impl InboxHandler for Gated {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        message: &InboxMessage,
    ) -> Result<(), HandlerError> {
        if self.inner.calls() == 0 {
            let _ = self.entered.send(());
            self.go.notified().await;
        }
        self.inner.handle(tx, message).await
    }
}

/// Kills an adapter between its inbox commit and its broker ack: the handler is held, the
/// proxy between the adapter and the broker cuts every connection (so no ack can leave), the
/// handler is let go, and once the inbox row is `completed` the adapter's runtime is dropped.
/// `run` runs the adapter (on the victim's runtime) with the gated handler and an inbox on the
/// victim's own pool (consumer `billing`, as [`setup`] makes them): its connections die with
/// the victim's runtime, as a killed process's would, instead of staying in the test's pool
/// bound to a dead runtime ("a Tokio 1.x context was found, but it is being shutdown").
async fn kill_between_commit_and_ack<R, Fut>(db: &TestDb, proxy: &Arc<TcpFault>, run: R) -> u32
where
    R: FnOnce(Arc<Gated>, Inbox) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (entered, mut entering) = mpsc::unbounded_channel();
    let go = Arc::new(Notify::new());
    let handler = Arc::new(Gated {
        inner: Recording::default(),
        entered,
        go: Arc::clone(&go),
    });
    let url = db.url.clone();
    let proxy = Arc::clone(proxy);
    let victim = Arc::clone(&handler);
    tokio::task::spawn_blocking(move || {
        run_then_kill(move || async move {
            let pool = PgPool::connect(&url).await.expect("victim pool");
            let config = InboxConfig::new("billing").max_attempts(5);
            let inbox = Inbox::new(pool.clone(), config).expect("victim inbox");
            let adapter = tokio::spawn(run(victim, inbox));
            assert!(
                tokio::time::timeout(PATIENCE, entering.recv())
                    .await
                    .is_ok(),
                "the adapter received the message"
            );
            proxy.set(Fault::Cut);
            go.notify_one();
            let committed = eventually(PATIENCE, || async {
                status(&pool, "billing", "order-1").await.as_deref() == Some("completed")
            })
            .await;
            assert!(committed, "the inbox transaction committed");
            // The kill: the adapter dies with the runtime, its ack never sent.
            drop(adapter);
        });
    })
    .await
    .expect("the victim");
    handler.inner.calls()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_a_crash_between_the_inbox_commit_and_the_ack_is_a_redelivery_the_inbox_absorbs() {
    let (db, inbox) = setup("billing", 5).await;
    let stream = TestStream::new().await;
    stream
        .publish("placed", &[("Nats-Msg-Id", "order-1")], r#"{"order":1}"#)
        .await;
    let proxy = Arc::new(TcpFault::start(addr(NATS_ADDR)).await);
    let adapter = nats_adapter(&nats_url(proxy.addr()), &stream, "billing");
    let calls = kill_between_commit_and_ack(&db, &proxy, move |handler, victim_inbox| async move {
        let _ = adapter
            .run(&victim_inbox, handler.as_ref(), std::future::pending())
            .await;
    })
    .await;
    assert_eq!(calls, 1);
    let info = stream.consumer_info("billing").await.expect("the consumer");
    assert_eq!(
        info.num_ack_pending, 1,
        "delivered, committed, never acknowledged"
    );

    // A new adapter gets the redelivery (after ack_wait), which the inbox answers as a duplicate.
    let handler = Recording::default();
    let adapter = nats_adapter(NATS_ADDR, &stream, "billing");
    let (stop, shutdown) = stopper();
    let (ran, ()) = tokio::join!(adapter.run(&inbox, &handler, shutdown), async {
        let acked = eventually(PATIENCE, || async {
            let info = stream.consumer_info("billing").await;
            info.is_some_and(|info| {
                info.num_ack_pending == 0 && info.ack_floor.stream_sequence == 1
            })
        })
        .await;
        assert!(acked, "the redelivery was acknowledged");
        let _ = stop.send(());
    });
    ran.expect("the adapter ran");
    let info = stream.consumer_info("billing").await.expect("the consumer");
    assert!(
        info.delivered.consumer_sequence >= 2,
        "the message was delivered again: {info:?}"
    );
    assert_eq!(handler.calls(), 0, "the redelivery did not run the handler");
    assert_eq!(effects(&db.pool, "order-1").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_a_crash_between_the_inbox_commit_and_the_ack_is_a_redelivery_the_inbox_absorbs() {
    let (db, inbox) = setup("billing", 5).await;
    let queue = InboxQueue::new().await;
    let direct = rabbit_adapter(&amqp_uri(addr(RABBIT_ADDR)), &queue);
    declare(&direct, &inbox, &Recording::default()).await;
    queue
        .publish("placed", Some("order-1"), &[], r#"{"order":1}"#)
        .await;
    let proxy = Arc::new(TcpFault::start(addr(RABBIT_ADDR)).await);
    let adapter = rabbit_adapter(&amqp_uri(proxy.addr()), &queue);
    let calls = kill_between_commit_and_ack(&db, &proxy, move |handler, victim_inbox| async move {
        let _ = adapter
            .run(&victim_inbox, handler.as_ref(), std::future::pending())
            .await;
    })
    .await;
    assert_eq!(calls, 1);
    let requeued = eventually(PATIENCE, || async { queue.ready(&queue.queue).await == 1 }).await;
    assert!(requeued, "the broker requeued the unacknowledged delivery");

    let handler = Recording::default();
    let (stop, shutdown) = stopper();
    let (ran, ()) = tokio::join!(direct.run(&inbox, &handler, shutdown), async {
        let taken = eventually(PATIENCE, || async { queue.ready(&queue.queue).await == 0 }).await;
        assert!(taken, "the redelivery was consumed");
        let _ = stop.send(());
    });
    ran.expect("the adapter ran");
    assert_eq!(
        queue.ready(&queue.queue).await,
        0,
        "the redelivery was acknowledged"
    );
    assert_eq!(handler.calls(), 0, "the redelivery did not run the handler");
    assert_eq!(effects(&db.pool, "order-1").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rabbitmq_two_adapters_on_one_queue_never_run_a_message_twice_at_once() {
    let (db, inbox) = setup("billing", 5).await;
    let queue = InboxQueue::new().await;
    let uri = amqp_uri(addr(RABBIT_ADDR));
    let adapter = rabbit_adapter(&uri, &queue);
    let handler = Arc::new(Recording::holding(Duration::from_millis(30)));
    declare(&adapter, &inbox, &handler).await;
    // Every message twice, so that both adapters hold copies of the same one at once.
    let messages = 20;
    for n in 0..messages {
        for _ in 0..2 {
            let id = format!("order-{n}");
            queue
                .publish("placed", Some(&id), &[], &format!(r#"{{"order":{n}}}"#))
                .await;
        }
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut adapters = tokio::task::JoinSet::new();
    for _ in 0..2 {
        let (adapter, inbox, handler) = (adapter.clone(), inbox.clone(), Arc::clone(&handler));
        let mut stopped = stopped.clone();
        adapters.spawn(async move {
            let shutdown = async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            };
            adapter.run(&inbox, handler.as_ref(), shutdown).await
        });
    }
    let drained = eventually(PATIENCE, || async {
        all_effects(&db.pool).await == i64::from(messages) && queue.ready(&queue.queue).await == 0
    })
    .await;
    assert!(drained, "every message handled and every copy consumed");
    let _ = stop.send(true);
    while let Some(ran) = adapters.join_next().await {
        ran.expect("an adapter task").expect("an adapter ran");
    }
    // Copies that were waiting out a `Busy` delay at the stop went back to the queue: one
    // adapter takes them now, as duplicates.
    let (stop, shutdown) = stopper();
    let (ran, ()) = tokio::join!(adapter.run(&inbox, handler.as_ref(), shutdown), async {
        let taken = eventually(PATIENCE, || async { queue.ready(&queue.queue).await == 0 }).await;
        assert!(taken, "the requeued copies were consumed");
        let _ = stop.send(());
    });
    ran.expect("the adapter ran");
    assert_eq!(handler.most_at_once(), 1, "a message ran twice at once");
    assert_eq!(handler.calls(), messages, "a copy ran its handler again");
    for n in 0..messages {
        assert_eq!(effects(&db.pool, &format!("order-{n}")).await, 1);
    }
    assert_eq!(
        queue.ready(&queue.queue).await,
        0,
        "every copy acknowledged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_a_handler_failing_for_good_is_dead_lettered_in_the_inbox_and_replayable() {
    let (db, inbox) = setup("billing", 3).await;
    let stream = TestStream::new().await;
    stream
        .publish("placed", &[("Nats-Msg-Id", "order-1")], r#"{"order":1}"#)
        .await;
    let failing = Recording::failing(3);
    let adapter = nats_adapter(NATS_ADDR, &stream, "billing");
    let (stop, shutdown) = stopper();
    let (ran, ()) = tokio::join!(adapter.run(&inbox, &failing, shutdown), async {
        let acked = eventually(PATIENCE, || async {
            let info = stream.consumer_info("billing").await;
            info.is_some_and(|info| info.ack_floor.stream_sequence == 1)
        })
        .await;
        assert!(
            acked,
            "the failed message was acknowledged: the inbox keeps it"
        );
        let _ = stop.send(());
    });
    ran.expect("the adapter ran");
    assert_eq!(failing.calls(), 3);
    assert_eq!(
        effects(&db.pool, "order-1").await,
        0,
        "every attempt rolled back"
    );
    let failed = ordo::inbox::list_failed(&db.pool, Some("billing"))
        .await
        .expect("list failed");
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].attempts, 3);
    let error = failed[0].error.as_deref().unwrap_or_default();
    assert!(error.contains("planned failure 3"), "{error}");

    ordo::inbox::replay(&db.pool, Some("billing"), "order-1")
        .await
        .expect("replay");
    let fixed = Recording::default();
    let receipts = inbox.run_pending(&fixed, 10).await.expect("run pending");
    assert_eq!(receipts, [("order-1".to_owned(), Receipt::Handled)]);
    assert_eq!(effects(&db.pool, "order-1").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_the_inbox_cannot_store_are_rejected_for_good() {
    let (db, inbox) = setup("billing", 5).await;
    let handler = Recording::default();

    // NATS: no Nats-Msg-Id; then a good one. The first is terminated, the second handled.
    let stream = TestStream::new().await;
    stream.publish("placed", &[], r#"{"order":0}"#).await;
    stream
        .publish("placed", &[("Nats-Msg-Id", "order-1")], r#"{"order":1}"#)
        .await;
    let adapter = nats_adapter(NATS_ADDR, &stream, "billing");
    let (stop, shutdown) = stopper();
    let (ran, ()) = tokio::join!(adapter.run(&inbox, &handler, shutdown), async {
        let done = eventually(PATIENCE, || async {
            let info = stream.consumer_info("billing").await;
            info.is_some_and(|info| {
                info.ack_floor.stream_sequence == 2 && info.num_ack_pending == 0
            })
        })
        .await;
        assert!(done, "both messages were answered");
        let _ = stop.send(());
    });
    ran.expect("the adapter ran");
    assert_eq!(handler.calls(), 1);

    // RabbitMQ: no message_id, and a position that is not a number: both land in `{queue}.dlq`.
    let queue = InboxQueue::new().await;
    let adapter = rabbit_adapter(&amqp_uri(addr(RABBIT_ADDR)), &queue);
    declare(&adapter, &inbox, &handler).await;
    queue.publish("placed", None, &[], r#"{"order":2}"#).await;
    queue
        .publish("placed", Some("order-3"), &[("ordo-position", "x")], "{}")
        .await;
    queue
        .publish("placed", Some("order-4"), &[], r#"{"order":4}"#)
        .await;
    let dead_letters = adapter.dead_letter_queue();
    assert_eq!(dead_letters, format!("{}.dlq", queue.queue));
    let (stop, shutdown) = stopper();
    let (ran, ()) = tokio::join!(adapter.run(&inbox, &handler, shutdown), async {
        let done = eventually(PATIENCE, || async {
            queue.ready(&dead_letters).await == 2 && handler.calls() == 2
        })
        .await;
        assert!(done, "two dead letters, one handled");
        let _ = stop.send(());
    });
    ran.expect("the adapter ran");
    let rejected = queue.drain(&dead_letters).await;
    let ids: Vec<Option<String>> = rejected
        .iter()
        .map(|d| {
            d.properties
                .message_id()
                .as_ref()
                .map(|id| id.as_str().to_owned())
        })
        .collect();
    assert_eq!(ids, [None, Some("order-3".to_owned())]);
    assert_eq!(effects(&db.pool, "order-4").await, 1);
    assert_eq!(queue.ready(&queue.queue).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_adapter_settings_and_a_missing_stream_are_refused_with_the_setting_named() {
    let refused = |result: ordo::Result<NatsInbox>| match result {
        Err(ordo::Error::InvalidConfig { setting, .. }) => setting,
        other => panic!("expected InvalidConfig, got {other:?}"),
    };
    let nats = |durable: &str| NatsInbox::builder(NATS_ADDR, "STREAM", durable);
    assert_eq!(refused(nats("a.b").build()), "NatsInbox durable");
    assert_eq!(
        refused(nats("ok").ack_wait(Duration::from_millis(10)).build()),
        "NatsInbox ack_wait"
    );
    assert_eq!(
        refused(
            nats("ok")
                .redelivery(Redelivery::default().busy(Duration::ZERO))
                .build()
        ),
        "NatsInbox redelivery"
    );
    match RabbitInbox::builder(amqp_uri(addr(RABBIT_ADDR)), "amq.sneaky").build() {
        Err(ordo::Error::InvalidConfig { setting, .. }) => assert_eq!(setting, "RabbitInbox queue"),
        other => panic!("expected InvalidConfig, got {other:?}"),
    }

    let (_db, inbox) = setup("billing", 5).await;
    let adapter = NatsInbox::builder(nats_url(addr(NATS_ADDR)), "ordo_no_such_stream", "billing")
        .build()
        .expect("settings are fine");
    match adapter.run(&inbox, &Recording::default(), async {}).await {
        Err(ordo::Error::Broker { broker, reason, .. }) => {
            assert_eq!(broker, "nats");
            assert!(reason.contains("ordo_no_such_stream"), "{reason}");
        }
        other => panic!("expected a broker error, got {other:?}"),
    }
    let undeclared = RabbitInbox::builder(amqp_uri(addr(RABBIT_ADDR)), "ordo_no_such_queue")
        .declare(false)
        .build()
        .expect("settings are fine");
    match undeclared
        .run(&inbox, &Recording::default(), async {})
        .await
    {
        Err(ordo::Error::Broker { broker, reason, .. }) => {
            assert_eq!(broker, "rabbitmq");
            assert!(reason.contains("ordo_no_such_queue"), "{reason}");
        }
        other => panic!("expected a broker error, got {other:?}"),
    }
}

/// Publishes `count` messages `order-{from}` … through `publish`, each with its own id.
async fn publish_orders<F, Fut>(from: u32, count: u32, publish: F)
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = ()>,
{
    for n in from..from + count {
        publish(format!("order-{n}")).await;
    }
}

/// Runs `run` (an adapter behind `proxy`) while the proxy cuts every connection after 5
/// messages were handled and passes again a second later; returns once `total` are handled, each
/// exactly once (orders `order-0` to `order-{total - 1}`).
async fn through_a_cut<R>(db: &TestDb, proxy: &TcpFault, handler: &Recording, total: u32, run: R)
where
    R: Future<Output = ordo::Result<()>>,
{
    let orchestrate = async {
        let five = eventually(PATIENCE, || async { handler.calls() >= 5 }).await;
        assert!(five, "the adapter handled its first messages");
        proxy.set(Fault::Cut);
        tokio::time::sleep(Duration::from_secs(1)).await;
        proxy.set(Fault::Pass);
        let all = eventually(PATIENCE, || async {
            all_effects(&db.pool).await >= i64::from(total)
        })
        .await;
        assert!(all, "every message handled after the connection came back");
    };
    tokio::select! {
        ran = run => panic!("the adapter stopped by itself: {ran:?}"),
        () = orchestrate => {}
    }
    for n in 0..total {
        assert_eq!(
            effects(&db.pool, &format!("order-{n}")).await,
            1,
            "order-{n}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_an_adapter_whose_connection_is_cut_reconnects_and_loses_nothing() {
    let (db, inbox) = setup("billing", 5).await;
    let queue = InboxQueue::new().await;
    let handler = Recording::holding(Duration::from_millis(20));
    declare(
        &rabbit_adapter(&amqp_uri(addr(RABBIT_ADDR)), &queue),
        &inbox,
        &handler,
    )
    .await;
    publish_orders(0, 30, |id| {
        let queue = &queue;
        async move { queue.publish("placed", Some(&id), &[], "{}").await }
    })
    .await;
    let proxy = TcpFault::start(addr(RABBIT_ADDR)).await;
    let adapter = rabbit_adapter(&amqp_uri(proxy.addr()), &queue);
    let (_stop, shutdown) = stopper();
    through_a_cut(
        &db,
        &proxy,
        &handler,
        30,
        adapter.run(&inbox, &handler, shutdown),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_an_adapter_whose_connection_is_cut_reconnects_and_loses_nothing() {
    let (db, inbox) = setup("billing", 5).await;
    let stream = TestStream::new().await;
    publish_orders(0, 30, |id| {
        let stream = &stream;
        async move {
            stream
                .publish("placed", &[("Nats-Msg-Id", id.as_str())], "{}")
                .await
        }
    })
    .await;
    let handler = Recording::holding(Duration::from_millis(20));
    let proxy = TcpFault::start(addr(NATS_ADDR)).await;
    let adapter = nats_adapter(&nats_url(proxy.addr()), &stream, "billing");
    let (_stop, shutdown) = stopper();
    through_a_cut(
        &db,
        &proxy,
        &handler,
        30,
        adapter.run(&inbox, &handler, shutdown),
    )
    .await;
}
