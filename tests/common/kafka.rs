//! The Kafka tests' broker: librdkafka's mock cluster in a process of its own
//! (`ordo-kafka-mock`, built with the tests), its faults injected through its own controls, and
//! a reader of what a topic holds.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use ordo::relay::kafka::rdkafka::consumer::{BaseConsumer, Consumer};
use ordo::relay::kafka::rdkafka::message::{Headers, Message};
use ordo::relay::kafka::rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio::time::Instant;

/// A mock Kafka cluster, killed when dropped.
pub struct MockKafka {
    pub bootstrap: String,
    control: Mutex<(ChildStdin, BufReader<ChildStdout>)>,
    child: Child,
}

impl MockKafka {
    /// A cluster of `brokers` brokers.
    pub fn start(brokers: u32) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ordo-kafka-mock"))
            .arg(brokers.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start ordo-kafka-mock");
        let stdin = child.stdin.take().expect("its stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("its stdout"));
        let mut first = String::new();
        stdout.read_line(&mut first).expect("its first line");
        let bootstrap = first
            .trim()
            .strip_prefix("bootstrap=")
            .unwrap_or_else(|| panic!("ordo-kafka-mock said {first:?}"))
            .to_owned();
        Self {
            bootstrap,
            control: Mutex::new((stdin, stdout)),
            child,
        }
    }

    fn command(&self, line: &str) {
        let mut control = self.control.lock().expect("the control pipe");
        let (stdin, stdout) = &mut *control;
        writeln!(stdin, "{line}").expect("send a command");
        stdin.flush().expect("flush the command");
        let mut answer = String::new();
        stdout.read_line(&mut answer).expect("its answer");
        assert_eq!(answer.trim(), "ok", "ordo-kafka-mock: {line}");
    }

    /// Creates `topic` with `partitions` partitions.
    pub fn topic(&self, topic: &str, partitions: u32) {
        self.command(&format!("topic {topic} {partitions}"));
    }

    /// Every broker cuts its connections and refuses new ones.
    pub fn down(&self) {
        self.command("down -1");
    }

    /// Every broker takes connections again, and answers at once.
    pub fn up(&self) {
        self.command("up -1");
        self.command("rtt -1 0");
    }

    /// Every broker answers only after `delay`: a broker that stops answering.
    pub fn silent_for(&self, delay: Duration) {
        self.command(&format!("rtt -1 {}", delay.as_millis()));
    }
}

impl Drop for MockKafka {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A unique topic name.
pub fn topic_name(what: &str) -> String {
    format!("{what}-{}", uuid::Uuid::new_v4().simple())
}

/// One record as a consumer sees it.
#[derive(Debug, Clone)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<String>,
    pub payload: Vec<u8>,
    pub headers: HashMap<String, String>,
}

/// Every record of `topic` up to each partition's high watermark now, in partition and offset
/// order. (A blocking consumer: call it from `spawn_blocking` in async tests.)
pub fn read_topic(bootstrap: &str, topic: &str) -> Vec<Record> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set(
            "group.id",
            format!("reader-{}", uuid::Uuid::new_v4().simple()),
        )
        .set("enable.auto.commit", "false")
        .create()
        .expect("a reader");
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("the topic's metadata");
    let partitions: Vec<i32> = metadata.topics()[0]
        .partitions()
        .iter()
        .map(|p| p.id())
        .collect();
    let mut ends = HashMap::new();
    let mut assignment = TopicPartitionList::new();
    for partition in &partitions {
        let (_, high) = consumer
            .fetch_watermarks(topic, *partition, Duration::from_secs(10))
            .expect("watermarks");
        ends.insert(*partition, high);
        assignment
            .add_partition_offset(topic, *partition, Offset::Beginning)
            .expect("assign");
    }
    consumer.assign(&assignment).expect("assign");
    let mut records = Vec::new();
    let mut next: HashMap<i32, i64> = partitions.iter().map(|p| (*p, 0)).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while next.iter().any(|(p, offset)| *offset < ends[p]) {
        assert!(Instant::now() < deadline, "reading {topic} took too long");
        let Some(polled) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message = polled.expect("a record");
        let mut headers = HashMap::new();
        if let Some(found) = message.headers() {
            for header in found.iter() {
                let value = header
                    .value
                    .map(|v| String::from_utf8_lossy(v).into_owned());
                headers.insert(header.key.to_owned(), value.unwrap_or_default());
            }
        }
        next.insert(message.partition(), message.offset() + 1);
        records.push(Record {
            partition: message.partition(),
            offset: message.offset(),
            key: message
                .key()
                .map(|k| String::from_utf8_lossy(k).into_owned()),
            payload: message.payload().unwrap_or_default().to_vec(),
            headers,
        });
    }
    records.sort_by_key(|r| (r.partition, r.offset));
    records
}

/// How many records `topic` holds now (the sum of its partitions' high watermarks).
pub fn count(bootstrap: &str, topic: &str) -> i64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("a client");
    let Ok(metadata) = consumer.fetch_metadata(Some(topic), Duration::from_secs(5)) else {
        return 0;
    };
    metadata.topics()[0]
        .partitions()
        .iter()
        .filter_map(|p| {
            consumer
                .fetch_watermarks(topic, p.id(), Duration::from_secs(5))
                .ok()
        })
        .map(|(_, high)| high)
        .sum()
}

/// Checks that `records` hold each of `ids` once after deduplication by `ordo-event-id`, and
/// nothing else; that each key's records are in one partition; and that there, a key's first
/// copies are in publishing order (`id_of` reads the publishing order from a payload).
pub fn assert_each_once_in_key_order(
    records: &[Record],
    ids: &std::collections::HashSet<String>,
    id_of: impl Fn(&[u8]) -> u32,
) {
    let mut seen = std::collections::HashSet::new();
    let mut partition_of: HashMap<String, i32> = HashMap::new();
    let mut last_of_key: HashMap<String, u32> = HashMap::new();
    for record in records {
        let id = record.headers.get("ordo-event-id").expect("an event id");
        assert!(ids.contains(id), "a record of no event: {record:?}");
        if !seen.insert(id.clone()) {
            continue;
        }
        let Some(key) = &record.key else { continue };
        let partition = *partition_of.entry(key.clone()).or_insert(record.partition);
        assert_eq!(partition, record.partition, "key {key} in two partitions");
        let order = id_of(&record.payload);
        if let Some(before) = last_of_key.insert(key.clone(), order) {
            assert!(before < order, "key {key}: {order} after {before}");
        }
    }
    assert_eq!(
        seen.len(),
        ids.len(),
        "every event, once after deduplication"
    );
}

/// The offset group `group` has committed for partition 0 of `topic`, if any (blocking).
pub fn committed(bootstrap: &str, group: &str, topic: &str) -> Option<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .create()
        .expect("a client of the group");
    let mut partitions = TopicPartitionList::new();
    partitions.add_partition(topic, 0);
    let committed = consumer
        .committed_offsets(partitions, Duration::from_secs(10))
        .expect("the group's offsets");
    let offset = committed.find_partition(topic, 0)?.offset();
    match offset {
        Offset::Offset(offset) => Some(offset),
        _ => None,
    }
}
