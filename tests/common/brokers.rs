//! The real brokers of the sink tests: a JetStream stream and a RabbitMQ exchange with a queue,
//! each with a unique name per test and deleted when the test ends (also when it panics).
//!
//! NATS is `NATS_ADDR` (127.0.0.1:4222, JetStream on) and RabbitMQ `RABBIT_ADDR`
//! (127.0.0.1:5672, guest/guest); `.ci/run` starts both when they are down.

use std::net::SocketAddr;
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};

pub const NATS_ADDR: &str = "127.0.0.1:4222";
pub const RABBIT_ADDR: &str = "127.0.0.1:5672";

pub fn addr(text: &str) -> SocketAddr {
    text.parse().expect("a socket address")
}

pub fn nats_url(addr: SocketAddr) -> String {
    format!("nats://{addr}")
}

pub fn amqp_uri(addr: SocketAddr) -> String {
    format!("amqp://guest:guest@{addr}/%2f")
}

fn unique(kind: &str) -> String {
    format!("ordo_sink_{kind}_{}", uuid::Uuid::new_v4().simple())
}

/// Runs `cleanup` to completion on a runtime of its own, from `Drop` (which cannot await).
fn clean_up_from_drop<F: std::future::Future<Output = ()> + Send + 'static>(cleanup: F) {
    let thread = std::thread::spawn(move || {
        if let Ok(runtime) = tokio::runtime::Runtime::new() {
            runtime.block_on(async move {
                let _ = tokio::time::timeout(Duration::from_secs(10), cleanup).await;
            });
        }
    });
    let _ = thread.join();
}

/// A JetStream stream on subjects `{prefix}.>`, with a two-minute duplicate window.
pub struct TestStream {
    pub name: String,
    /// The subject prefix the stream listens on (a sink's `subject_prefix`).
    pub prefix: String,
    jetstream: jetstream::Context,
}

impl TestStream {
    pub async fn new() -> TestStream {
        TestStream::with_duplicate_window(Duration::from_secs(120)).await
    }

    /// A stream whose publish-side dedup forgets a message id after `window`.
    pub async fn with_duplicate_window(window: Duration) -> TestStream {
        TestStream::with_config(|config| config.duplicate_window = window).await
    }

    /// A stream on `{prefix}.>` with a two-minute duplicate window and whatever else
    /// `adjust` sets (limits, a discard policy).
    pub async fn with_config(adjust: impl FnOnce(&mut stream::Config)) -> TestStream {
        let client = async_nats::connect(NATS_ADDR)
            .await
            .expect("NATS at 127.0.0.1:4222 (.ci/run starts it)");
        let jetstream = jetstream::new(client);
        let name = unique("stream");
        let prefix = name.clone();
        let mut config = stream::Config {
            name: name.clone(),
            subjects: vec![format!("{prefix}.>")],
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        };
        adjust(&mut config);
        jetstream
            .create_stream(config)
            .await
            .expect("create the test stream");
        TestStream {
            name,
            prefix,
            jetstream,
        }
    }

    /// Deletes the stream (its subjects then have no responders), as an operator's mistake
    /// would; [`restore`](Self::restore) creates it again, empty.
    pub async fn delete(&self) {
        self.jetstream
            .delete_stream(&self.name)
            .await
            .expect("delete the test stream");
    }

    /// Creates the deleted stream again, on the same subjects.
    pub async fn restore(&self) {
        self.jetstream
            .create_stream(stream::Config {
                name: self.name.clone(),
                subjects: vec![format!("{}.>", self.prefix)],
                ..Default::default()
            })
            .await
            .expect("create the test stream again");
    }

    /// Publishes `payload` on `{prefix}.{subject}` with `headers`, awaiting the stream's ack.
    pub async fn publish(&self, subject: &str, headers: &[(&str, &str)], payload: &str) {
        let mut map = async_nats::HeaderMap::new();
        for (name, value) in headers {
            map.insert(*name, *value);
        }
        self.jetstream
            .publish_with_headers(
                format!("{}.{subject}", self.prefix),
                map,
                payload.to_owned().into(),
            )
            .await
            .expect("publish")
            .await
            .expect("the stream's ack");
    }

    /// Deletes the stream's message at `sequence`, as a broker that lost it would.
    pub async fn delete_message(&self, sequence: u64) {
        let stream = self
            .jetstream
            .get_stream(&self.name)
            .await
            .expect("the test stream");
        let deleted = stream
            .delete_message(sequence)
            .await
            .expect("delete a stream message");
        assert!(
            deleted,
            "message {sequence} of the stream was there to delete"
        );
    }

    /// The info of the stream's consumer `durable`, once it exists.
    pub async fn consumer_info(&self, durable: &str) -> Option<jetstream::consumer::Info> {
        let stream = self
            .jetstream
            .get_stream(&self.name)
            .await
            .expect("the test stream");
        stream.consumer_info(durable).await.ok()
    }

    /// How many messages the stream holds.
    pub async fn len(&self) -> u64 {
        let mut stream = self
            .jetstream
            .get_stream(&self.name)
            .await
            .expect("the test stream");
        stream.info().await.expect("stream info").state.messages
    }

    /// The stream's messages, in stream order.
    pub async fn messages(&self) -> Vec<jetstream::message::StreamMessage> {
        let stream = self
            .jetstream
            .get_stream(&self.name)
            .await
            .expect("the test stream");
        let mut messages = Vec::new();
        for sequence in 1..=self.len().await {
            messages.push(
                stream
                    .get_raw_message(sequence)
                    .await
                    .expect("a stream message"),
            );
        }
        messages
    }
}

impl Drop for TestStream {
    fn drop(&mut self) {
        // A connection of its own: the test's client runs on the test's runtime, which this
        // thread blocks while the clean-up runs.
        let name = self.name.clone();
        clean_up_from_drop(async move {
            if let Ok(client) = async_nats::connect(NATS_ADDR).await {
                let _ = jetstream::new(client).delete_stream(&name).await;
            }
        });
    }
}

/// A topic exchange with one durable queue bound to it for every routing key (`#`).
pub struct TestQueue {
    pub exchange: String,
    pub queue: String,
    _connection: Connection,
    channel: Channel,
}

impl TestQueue {
    pub async fn new() -> TestQueue {
        TestQueue::with_queue_arguments(FieldTable::default()).await
    }

    /// A queue that takes nothing (`x-max-length` 0, `x-overflow: reject-publish`): the broker
    /// nacks every message routed to it.
    pub async fn refusing() -> TestQueue {
        let mut arguments = FieldTable::default();
        arguments.insert("x-max-length".into(), lapin::types::AMQPValue::LongInt(0));
        arguments.insert(
            "x-overflow".into(),
            lapin::types::AMQPValue::LongString("reject-publish".into()),
        );
        TestQueue::with_queue_arguments(arguments).await
    }

    async fn with_queue_arguments(arguments: FieldTable) -> TestQueue {
        let connection = Connection::connect(
            &amqp_uri(addr(RABBIT_ADDR)),
            ConnectionProperties::default(),
        )
        .await
        .expect("RabbitMQ at 127.0.0.1:5672 (.ci/run starts it)");
        let channel = connection.create_channel().await.expect("a channel");
        let exchange = unique("exchange");
        let queue = unique("queue");
        channel
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("declare the test exchange");
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions::durable(),
                arguments,
            )
            .await
            .expect("declare the test queue");
        channel
            .queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind the test queue");
        TestQueue {
            exchange,
            queue,
            _connection: connection,
            channel,
        }
    }

    /// Declares exchange `front`, whose every message goes on to this queue's exchange (its
    /// alternate exchange): from the moment it exists, nothing published to it is lost, with
    /// no binding to race against.
    pub async fn declare_front(&self, front: &str) {
        let mut arguments = FieldTable::default();
        arguments.insert(
            "alternate-exchange".into(),
            lapin::types::AMQPValue::LongString(self.exchange.as_str().into()),
        );
        self.channel
            .exchange_declare(
                front.into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions::default(),
                arguments,
            )
            .await
            .expect("declare the front exchange");
    }

    /// Deletes exchange `front` (publishing to it then closes the channel), as an operator's
    /// mistake would.
    pub async fn delete_front(&self, front: &str) {
        self.channel
            .exchange_delete(
                front.into(),
                lapin::options::ExchangeDeleteOptions::default(),
            )
            .await
            .expect("delete the front exchange");
    }

    /// Takes every message in the queue (auto-acknowledged).
    pub async fn drain(&self) -> Vec<lapin::message::Delivery> {
        let mut deliveries = Vec::new();
        while let Some(message) = self
            .channel
            .basic_get(self.queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        {
            deliveries.push(message.delivery);
        }
        deliveries
    }

    /// [`drain`](Self::drain), as the deliveries' message ids (an event's id).
    pub async fn drain_ids(&self) -> Vec<String> {
        self.drain()
            .await
            .iter()
            .filter_map(|delivery| {
                let id = delivery.properties.message_id().as_ref();
                id.map(|id| id.to_string())
            })
            .collect()
    }
}

impl Drop for TestQueue {
    fn drop(&mut self) {
        let (exchange, queue) = (self.exchange.clone(), self.queue.clone());
        clean_up_from_drop(async move {
            let Ok(connection) = Connection::connect(
                &amqp_uri(addr(RABBIT_ADDR)),
                ConnectionProperties::default(),
            )
            .await
            else {
                return;
            };
            if let Ok(channel) = connection.create_channel().await {
                let _ = channel
                    .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                    .await;
                let _ = channel
                    .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
                    .await;
            }
            let _ = connection.close(200, "test done".into()).await;
        });
    }
}

/// Names for an inbox adapter's queue (which the adapter declares, with its dead-letter queue)
/// and a topic exchange (declared here) that tests publish to; all deleted when dropped.
pub struct InboxQueue {
    pub exchange: String,
    pub queue: String,
    _connection: Connection,
    channel: Channel,
}

impl InboxQueue {
    pub async fn new() -> InboxQueue {
        let connection = Connection::connect(
            &amqp_uri(addr(RABBIT_ADDR)),
            ConnectionProperties::default(),
        )
        .await
        .expect("RabbitMQ at 127.0.0.1:5672 (.ci/run starts it)");
        let channel = connection.create_channel().await.expect("a channel");
        let exchange = unique("exchange");
        channel
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("declare the test exchange");
        InboxQueue {
            exchange,
            queue: unique("inbox"),
            _connection: connection,
            channel,
        }
    }

    /// Publishes `payload` to the exchange with routing key `key`, message id `id` (none:
    /// without one) and `headers` (string values).
    pub async fn publish(
        &self,
        key: &str,
        id: Option<&str>,
        headers: &[(&str, &str)],
        payload: &str,
    ) {
        let mut table = FieldTable::default();
        for (name, value) in headers {
            table.insert((*name).into(), AMQPValue::LongString((*value).into()));
        }
        let mut properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_headers(table);
        if let Some(id) = id {
            properties = properties.with_message_id(id.into());
        }
        self.channel
            .basic_publish(
                self.exchange.as_str().into(),
                key.into(),
                BasicPublishOptions::default(),
                payload.as_bytes(),
                properties,
            )
            .await
            .expect("publish")
            .await
            .expect("published");
    }

    /// Ready messages in `queue` (not counting those delivered and not yet acknowledged).
    pub async fn ready(&self, queue: &str) -> u32 {
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        self.channel
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await
            .expect("the queue exists")
            .message_count()
    }

    /// Takes every message in `queue` (auto-acknowledged).
    pub async fn drain(&self, queue: &str) -> Vec<lapin::message::Delivery> {
        let mut deliveries = Vec::new();
        while let Some(message) = self
            .channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        {
            deliveries.push(message.delivery);
        }
        deliveries
    }
}

impl Drop for InboxQueue {
    fn drop(&mut self) {
        let (exchange, queue) = (self.exchange.clone(), self.queue.clone());
        clean_up_from_drop(async move {
            let Ok(connection) = Connection::connect(
                &amqp_uri(addr(RABBIT_ADDR)),
                ConnectionProperties::default(),
            )
            .await
            else {
                return;
            };
            if let Ok(channel) = connection.create_channel().await {
                for queue in [queue.clone(), format!("{queue}.dlq")] {
                    let _ = channel
                        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                        .await;
                }
                let _ = channel
                    .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
                    .await;
            }
            let _ = connection.close(200, "test done".into()).await;
        });
    }
}

/// A NATS adapter of `stream` for a watermark inbox: durable consumer `durable`, a short
/// `ack_wait`, and redeliveries soon enough for a test (a busy mark, a gap, a retry).
pub fn watermark_adapter(url: &str, stream: &TestStream, durable: &str) -> ordo::inbox::NatsInbox {
    ordo::inbox::NatsInbox::builder(url, stream.name.as_str(), durable)
        .ack_wait(Duration::from_secs(2))
        .redelivery(
            ordo::inbox::Redelivery::default()
                .busy(Duration::from_millis(50))
                .gap(Duration::from_millis(50))
                .retry_backoff(Duration::from_millis(50), Duration::from_millis(200)),
        )
        .build()
        .expect("adapter")
}
