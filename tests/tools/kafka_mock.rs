//! `ordo-kafka-mock`: librdkafka's mock Kafka cluster in a process of its own, for the tests
//! of the Kafka sink and inbox adapter and for trying them without a Kafka (there is no Docker
//! on the machines the tests run on, and no Kafka distribution among the registries they reach).
//! The cluster speaks the Kafka protocol (produce with idempotence, fetch, consumer groups and
//! offset commits) from memory; its own fault injection stands in for a TCP proxy, whose
//! address a Kafka client would not keep (brokers advertise their own).
//!
//! It prints `bootstrap=HOST:PORT,...` on its first line, then reads one command a line on its
//! standard input and answers `ok` or `error: ...`:
//!
//! | command | |
//! | --- | --- |
//! | `topic NAME PARTITIONS` | creates a topic (replication factor: the broker count, at most 3) |
//! | `down ID` / `up ID` | cuts a broker's connections and refuses new ones / takes them again (`-1`: every broker) |
//! | `rtt ID MILLIS` | delays every answer of a broker (`-1`: every broker): a broker that stops answering |
//!
//! It exits when its standard input closes: a test that dies takes its broker with it.
//!
//! `cargo run --features kafka --bin ordo-kafka-mock -- 3` starts three brokers.

use std::io::{BufRead, Write};
use std::time::Duration;

use rdkafka::mocking::MockCluster;

fn main() {
    let brokers: i32 = std::env::args()
        .nth(1)
        .and_then(|count| count.parse().ok())
        .unwrap_or(1);
    let cluster = match MockCluster::new(brokers) {
        Ok(cluster) => cluster,
        Err(error) => {
            eprintln!("ordo-kafka-mock: cannot start the mock cluster: {error}");
            std::process::exit(1);
        }
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "bootstrap={}", cluster.bootstrap_servers());
    let _ = out.flush();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        let number = |index: usize| words.get(index).and_then(|word| word.parse::<i64>().ok());
        let done = match (words.first().copied(), number(1), number(2)) {
            (Some("topic"), _, Some(partitions)) => {
                let name = words.get(1).copied().unwrap_or_default();
                let partitions = i32::try_from(partitions).unwrap_or(1);
                cluster
                    .create_topic(name, partitions, brokers.min(3))
                    .map_err(|error| error.to_string())
            }
            (Some("down"), Some(id), _) => cluster
                .broker_down(i32::try_from(id).unwrap_or(-1))
                .map_err(|error| error.to_string()),
            (Some("up"), Some(id), _) => cluster
                .broker_up(i32::try_from(id).unwrap_or(-1))
                .map_err(|error| error.to_string()),
            (Some("rtt"), Some(id), Some(millis)) => cluster
                .broker_round_trip_time(
                    i32::try_from(id).unwrap_or(-1),
                    Duration::from_millis(u64::try_from(millis).unwrap_or(0)),
                )
                .map_err(|error| error.to_string()),
            _ => Err(format!("unknown command {line:?}")),
        };
        let _ = match done {
            Ok(()) => writeln!(out, "ok"),
            Err(error) => writeln!(out, "error: {error}"),
        };
        let _ = out.flush();
    }
}
