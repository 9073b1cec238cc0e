//! Relays end to end, one module per behaviour: delivery to the real NATS JetStream, RabbitMQ,
//! Kafka (librdkafka's mock cluster in a process of its own) and HTTP servers the tests run,
//! exactly once after the receiver's deduplication and in order per key, across kills and
//! takeovers; the standalone `ordo relay run`; attempts, parking and the failure model; stale
//! owners' fences, retention, routing, secrets, the envelopes the sinks send, and event ids.
//!
//! The relay tests that read a process-wide metrics recorder or log subscriber are test
//! binaries of their own (`tests/relay_blame.rs`, `tests/relay_faults.rs`,
//! `tests/relay_kafka.rs`, `tests/relay_rabbitmq.rs`, `tests/relay_slow_link.rs`), and the
//! sinks alone are `tests/sinks/`.

#[path = "../common/mod.rs"]
mod common;

mod attempts;
mod bytes;
mod chains;
mod cli;
mod end_to_end;
mod envelopes;
mod event_ids;
mod failure_model;
mod fence;
mod ownership;
mod retention;
mod routing;
mod secrets;
mod sink_down;
mod webhook;
