//! The consumer inbox, one module per behaviour: row-per-message and watermark modes on a real
//! PostgreSQL, its upkeep, its broker adapters against the real NATS JetStream and RabbitMQ,
//! `ordo inbox` and `ordo status` on the receiving side, and two ordo databases end to end (a
//! relay into a watermark inbox over NATS and over Kafka, across kills).

#[path = "../common/mod.rs"]
mod common;

mod brokers;
mod cli;
mod kafka_to_inbox;
mod relay_to_inbox;
mod row_mode;
mod status;
mod upkeep;
mod watermark;
