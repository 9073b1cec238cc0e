//! librdkafka's log, through `tracing`.

/// librdkafka's client context for ordo's Kafka clients: its log lines and error callbacks go
/// to `tracing` at DEBUG (WARN for the critical ones), not to stderr. An unreachable broker
/// makes librdkafka log every reconnect; the relay and the inbox adapter report the outage
/// themselves, once.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Logs;

impl rdkafka::ClientContext for Logs {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, line: &str) {
        use rdkafka::config::RDKafkaLogLevel as Level;
        let line = super::printable(line);
        match level {
            Level::Emerg | Level::Alert | Level::Critical => {
                tracing::warn!(facility, "librdkafka: {line}");
            }
            _ => tracing::debug!(facility, "librdkafka: {line}"),
        }
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        tracing::debug!(%error, reason = %super::printable(reason), "librdkafka");
    }
}

impl rdkafka::consumer::ConsumerContext for Logs {}
