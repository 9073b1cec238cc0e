//! The settings of `ordo relay run`: flags, or `setting = value` lines of a `--config` file
//! whose names are the flags' own (`batch-deadline = 10s`). Flags override the file.
//!
//! The file is a flat list on purpose: every line is one flag, parsed by the same parser as
//! the command line, so the two can never disagree, and no configuration-language dependency
//! comes into the CLI for a dozen settings.

use std::path::Path;
use std::time::Duration;

use clap::{CommandFactory, Parser};
use ordo::Ordering;

use super::keys::KeyFrom;
use crate::parse::{lane_parser, parse_duration};

/// Where a relay delivers.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SinkKind {
    /// NATS JetStream (cargo feature `nats`).
    Nats,
    /// RabbitMQ with publisher confirms (cargo feature `rabbitmq`).
    Rabbitmq,
    /// HTTP POST, signed (cargo feature `http`).
    Webhook,
    /// Kafka, idempotent producer (cargo feature `kafka`).
    Kafka,
}

impl SinkKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            SinkKind::Nats => "nats",
            SinkKind::Rabbitmq => "rabbitmq",
            SinkKind::Webhook => "webhook",
            SinkKind::Kafka => "kafka",
        }
    }

    /// The cargo feature that builds this sink into `ordo`.
    pub(crate) fn feature(self) -> &'static str {
        match self {
            SinkKind::Nats => "nats",
            SinkKind::Rabbitmq => "rabbitmq",
            SinkKind::Webhook => "http",
            SinkKind::Kafka => "kafka",
        }
    }
}

/// Where a new relay starts (ignored once its row exists).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StartAt {
    /// From the lane's first event.
    Beginning,
    /// Only events committed after the relay's row is created.
    Now,
}

/// Every setting of a standalone relay but its name and file. All optional here: the file
/// fills what the flags leave out, and the library's defaults what both leave out.
#[derive(clap::Args, Debug, Default, Clone)]
pub(crate) struct Settings {
    /// Where events go. Each sink needs ordo built with its cargo feature: nats, rabbitmq, http
    /// (for webhook), kafka.
    #[arg(long, value_enum)]
    pub(crate) sink: Option<SinkKind>,
    /// The sink's address: nats://HOST:4222, amqp://HOST:5672/%2f, https://HOST/PATH,
    /// kafka://HOST:9092[,HOST:9092...]. Default:
    /// the environment variable ORDO_RELAY_URL. Refused here when it carries credentials
    /// (they would show in `ps` and shell history): put such a URL in ORDO_RELAY_URL or the
    /// file.
    #[arg(long)]
    pub(crate) url: Option<String>,
    /// Where an event's ordering key comes from: event-type, none, payload:/json/pointer or
    /// header:NAME. Events of one key are delivered in order, one at a time; events of
    /// different keys in parallel. An event without that value has no key (ordered with
    /// nothing).
    #[arg(long, value_parser = KeyFrom::parse, value_name = "SOURCE")]
    pub(crate) key_from: Option<KeyFrom>,
    /// The lane relayed [default: commit].
    #[arg(long, value_parser = lane_parser())]
    pub(crate) lane: Option<Ordering>,
    /// Where a relay that does not exist yet starts [default: beginning].
    #[arg(long, value_enum)]
    pub(crate) start: Option<StartAt>,
    /// Batches in flight at once, one per sink connection [default: 1].
    #[arg(long, value_name = "N")]
    pub(crate) sinks: Option<usize>,
    /// Send only events of these types (comma-separated), and untyped ones unless
    /// --skip-untyped; events of other types are passed over, never sent [default: every type].
    #[arg(long, value_delimiter = ',', value_name = "TYPE,...")]
    pub(crate) event_types: Option<Vec<String>>,
    /// Pass over untyped events (NULL event_type) instead of sending them [default: false].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub(crate) skip_untyped: Option<bool>,
    /// The most the relay holds in memory past its low watermark (events read and not yet
    /// delivered, as payload and header bytes), e.g. 64MiB [default: 64MiB].
    #[arg(long, value_parser = parse_bytes, value_name = "BYTES")]
    pub(crate) window_bytes: Option<usize>,
    /// How often to log the relay's progress: 1s to 24h, or 0 for never [default: 10s].
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) progress: Option<Duration>,

    /// Events per send [default: 100].
    #[arg(long, help_heading = "Timing", value_name = "EVENTS")]
    pub(crate) batch_size: Option<usize>,
    /// Each event's share of the batch deadline [default: 50ms].
    #[arg(long, help_heading = "Timing", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) per_event_budget: Option<Duration>,
    /// One deadline over a batch's send and confirm [default: 10s].
    #[arg(long, help_heading = "Timing", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) batch_deadline: Option<Duration>,
    /// The relay's claim on its work, renewed every third of it [default: 30s].
    /// batch-size × per-event-budget ≤ batch-deadline < lease, or the relay refuses to start.
    #[arg(long, help_heading = "Timing", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) lease: Option<Duration>,
    /// Failed deliveries before an event is parked [default: 10].
    #[arg(long, help_heading = "Timing", value_name = "N")]
    pub(crate) max_attempts: Option<u32>,
    /// The first backoff after a failed delivery [default: 200ms].
    #[arg(long, help_heading = "Timing", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) backoff_initial: Option<Duration>,
    /// The longest backoff, at most half the lease [default: 10s].
    #[arg(long, help_heading = "Timing", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) backoff_max: Option<Duration>,

    /// How long connecting to the sink may take [default: 5s].
    #[arg(long, help_heading = "Every sink", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) sink_connect_timeout: Option<Duration>,

    /// The first token of each subject, "{prefix}.{event_type}" [default: ordo].
    #[arg(long, help_heading = "NATS", value_name = "PREFIX")]
    pub(crate) subject_prefix: Option<String>,
    /// The longest wait for one message's stream ack [default: 5s].
    #[arg(long, help_heading = "NATS", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) ack_timeout: Option<Duration>,
    /// Acks awaited at once [default: 1024].
    #[arg(long, help_heading = "NATS", value_name = "N")]
    pub(crate) max_in_flight: Option<usize>,
    /// Also send Ordo-Sequence, Ordo-Recorded-At and Content-Type with each message
    /// [default: false].
    #[arg(long, help_heading = "NATS", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub(crate) detail_headers: Option<bool>,

    /// The exchange; the routing key is the event type [default: "", the default exchange].
    #[arg(long, help_heading = "RabbitMQ", value_name = "EXCHANGE")]
    pub(crate) exchange: Option<String>,
    /// Publishes awaiting their confirm at once [default: 128].
    #[arg(long, help_heading = "RabbitMQ", value_name = "N")]
    pub(crate) pipeline_depth: Option<usize>,

    /// The environment variable holding the signing secret (a secret is never a flag)
    /// [default: ORDO_WEBHOOK_SECRET].
    #[arg(long, help_heading = "Webhook", value_name = "VARIABLE")]
    pub(crate) secret_env: Option<String>,
    /// How long one request may take [default: 10s].
    #[arg(long, help_heading = "Webhook", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) request_timeout: Option<Duration>,
    /// Keys sent at once [default: 16].
    #[arg(long, help_heading = "Webhook", value_name = "KEYS")]
    pub(crate) concurrency: Option<usize>,

    #[command(flatten)]
    pub(crate) routing: super::routing::Routing,
}

/// A size in bytes: a number with an optional unit, `B`, `KiB`, `MiB` or `GiB` (`64MiB`).
fn parse_bytes(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: usize = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size: expected a number of bytes, e.g. 64MiB"))?;
    let scale: usize = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => {
            return Err(format!(
                "{other:?} is not a unit of size: use B, KiB, MiB or GiB"
            ));
        }
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("{text} is too large"))
}

/// `a.or(b)` for every field: what `a` sets wins.
macro_rules! prefer {
    ($a:ident, $b:ident; $($field:ident),* $(,)?) => {
        Settings { $($field: $a.$field.or($b.$field)),* }
    };
}

impl Settings {
    /// These settings, with what they leave out taken from `fallback`.
    pub(crate) fn or(self, fallback: Settings) -> Settings {
        let (a, b) = (self, fallback);
        prefer!(a, b; sink, url, key_from, lane, start, event_types, skip_untyped, window_bytes,
            sinks, progress, batch_size,
            per_event_budget, batch_deadline, lease, max_attempts, backoff_initial, backoff_max,
            sink_connect_timeout, subject_prefix, ack_timeout, max_in_flight, detail_headers, exchange,
            pipeline_depth, secret_env, request_timeout, concurrency, routing)
    }

    /// A setting given for another sink than `sink`: most likely a mistake (a NATS relay told
    /// an exchange), so refused with its name rather than ignored.
    pub(crate) fn foreign_to(&self, sink: SinkKind) -> Option<(&'static str, SinkKind)> {
        let owned = [
            (
                self.subject_prefix.is_some(),
                "subject-prefix",
                SinkKind::Nats,
            ),
            (self.ack_timeout.is_some(), "ack-timeout", SinkKind::Nats),
            (
                self.max_in_flight.is_some(),
                "max-in-flight",
                SinkKind::Nats,
            ),
            (
                self.detail_headers.is_some(),
                "detail-headers",
                SinkKind::Nats,
            ),
            (self.exchange.is_some(), "exchange", SinkKind::Rabbitmq),
            (
                self.pipeline_depth.is_some(),
                "pipeline-depth",
                SinkKind::Rabbitmq,
            ),
            (self.secret_env.is_some(), "secret-env", SinkKind::Webhook),
            (
                self.request_timeout.is_some(),
                "request-timeout",
                SinkKind::Webhook,
            ),
            (self.concurrency.is_some(), "concurrency", SinkKind::Webhook),
        ];
        let routed = self
            .routing
            .owned()
            .into_iter()
            .map(|(given, name, owner)| {
                let owner = match owner {
                    "kafka" => SinkKind::Kafka,
                    _ => SinkKind::Webhook,
                };
                (given, name, owner)
            });
        owned
            .into_iter()
            .chain(routed)
            .find(|(given, _, owner)| *given && *owner != sink)
            .map(|(_, name, owner)| (name, owner))
    }
}

/// One line of a settings file, parsed as the flag of the same name.
#[derive(Parser)]
#[command(name = "--config", no_binary_name = true)]
struct FileLine {
    #[command(flatten)]
    settings: Settings,
}

/// What a settings file holds: the relay's name, if it gives one, and its settings.
#[derive(Default)]
pub(crate) struct FileSettings {
    pub(crate) name: Option<String>,
    pub(crate) settings: Settings,
}

/// Reads `path`: `setting = value` lines (the flags' names without `--`), blank lines, and
/// comment lines starting with `#`. A value may be wrapped in double quotes. The last line of a
/// setting wins. Errors name the file, the line and the setting.
pub(crate) fn read_file(path: &Path) -> Result<FileSettings, String> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("--config {shown}: cannot read it: {error}"))?;
    parse_file(&text).map_err(|error| format!("--config {shown}: {error}"))
}

fn parse_file(text: &str) -> Result<FileSettings, String> {
    let known: Vec<String> = FileLine::command()
        .get_arguments()
        .filter_map(|arg| arg.get_long().map(str::to_owned))
        .collect();
    let mut file = FileSettings::default();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((setting, value)) = line.split_once('=') else {
            return Err(format!(
                "line {number}: expected `setting = value`, found {line:?}"
            ));
        };
        let (setting, value) = (setting.trim(), unquote(value.trim()));
        if setting == "name" {
            file.name = Some(value.to_owned());
            continue;
        }
        if setting == "config" || !known.iter().any(|name| name == setting) {
            return Err(format!(
                "line {number}: unknown setting `{setting}` (the settings are the flags of \
                 `ordo relay run --help`, without the dashes, and `name`)"
            ));
        }
        let parsed =
            FileLine::try_parse_from([format!("--{setting}={value}")]).map_err(|error| {
                let rendered = error.render().to_string();
                let first = rendered.lines().next().unwrap_or_default();
                let why = first.strip_prefix("error: ").unwrap_or(first);
                format!("line {number}: setting `{setting}`: {why}")
            })?;
        file.settings = parsed.settings.or(file.settings);
    }
    Ok(file)
}

fn unquote(value: &str) -> &str {
    value
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
        .unwrap_or(value)
}

#[cfg(test)]
mod tests;
