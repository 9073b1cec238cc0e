//! `ordo relay run`: a relay in a process of its own, for applications that write
//! `ordo.events` by plain SQL from another language. It is `Outbox::relay_with_sinks` on an
//! outbox of raw JSON payloads, configured by flags or a file, until SIGINT or SIGTERM.
//!
//! Everything is checked before the database is reached (the settings, the sink's feature, its
//! secret); the relay's timing rule is checked when it starts, as in the library. Its process
//! also folds the commit lane (any number of sequencers may run), so a relay needs no other
//! ordo process beside it.

use std::path::PathBuf;
use std::time::Duration;

use ordo::relay::{RelayConfig, Sink};
use ordo::{Ordering, Outbox, OutboxConfig, StartFrom, SubscriptionHandle};
use sqlx::PgPool;

use super::keys::{KeyFrom, RawPayload};
use super::settings::{self, FileSettings, Settings, StartAt};
use super::sinks::{self, Sinks};

mod watch;

use watch::watch;

/// The environment variable a sink's URL is read from when `--url` is not given.
pub(crate) const URL_ENV: &str = "ORDO_RELAY_URL";
/// `RelayConfig`'s default backoff, for a command line that sets only one end of it.
const DEFAULT_BACKOFF: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(10));
const DEFAULT_PROGRESS: Duration = Duration::from_secs(10);
/// The shortest `--progress` period. A line a second is already more than anyone reads as it
/// scrolls; shorter periods only flood the log (`--progress 1ns` wrote 2,243 lines in 3 s).
const MIN_PROGRESS: Duration = Duration::from_secs(1);
/// The longest: a rarer line says nothing while it is needed, and `0` already means never.
const MAX_PROGRESS: Duration = Duration::from_secs(24 * 3600);
/// More batches in flight than this is a mistake, not a throughput setting.
const MAX_SINKS: usize = 64;

type CliResult = Result<(), Box<dyn std::error::Error>>;

#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// The relay's name: its row in ordo.subscriptions, shared by every process that runs it
    /// (one delivers, the others stand by). Or `name` in the file.
    name: Option<String>,
    /// A file of `setting = value` lines named as the flags without `--` (and `name`); `#`
    /// starts a comment line. Flags override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(flatten)]
    settings: Settings,
}

/// A relay ready to start: its settings checked, its sinks built, nothing connected yet.
pub(crate) struct Plan {
    name: String,
    config: RelayConfig,
    lane: Ordering,
    keys: KeyFrom,
    sinks: Sinks,
    count: usize,
    target: String,
    progress: Duration,
}

impl RunArgs {
    /// The relay these arguments describe, or why not, naming the setting.
    pub(crate) fn plan(self) -> Result<Plan, String> {
        let file = match &self.config {
            Some(path) => settings::read_file(path)?,
            None => FileSettings::default(),
        };
        let name = self
            .name
            .or(file.name)
            .ok_or("the relay's NAME is required (or `name` in the --config file)")?;
        let mut flags = self.settings;
        let flag_url = flags.url.take();
        if let Some(secret) = flags
            .routing
            .kafka_properties
            .iter()
            .flatten()
            .find(|pair| names_a_secret(pair))
        {
            let name = secret.split('=').next().unwrap_or_default();
            return Err(format!(
                "--kafka-property {name}=... carries a secret, which `ps` and shell history would \
                 show: put it in the --config file (`kafka-property = {name}=...`)"
            ));
        }
        if flag_url.as_deref().is_some_and(sinks::has_credentials) {
            return Err(format!(
                "--url carries credentials, which `ps` and shell history would show: put the URL \
                 in {URL_ENV} or in the --config file"
            ));
        }
        let env_url = std::env::var(URL_ENV)
            .ok()
            .filter(|url| !url.trim().is_empty());
        let s = flags.or(file.settings);
        let url = flag_url
            .or(env_url)
            .or_else(|| s.url.clone())
            .ok_or_else(|| {
                format!("--url is required (or {URL_ENV}, or `url` in the --config file)")
            })?;
        let kind = s.sink.ok_or(
            "--sink is required (or `sink` in the --config file): nats, rabbitmq, webhook or kafka",
        )?;
        let keys = s.key_from.clone().ok_or(
            "--key-from is required (or `key-from` in the --config file): event-type, none, \
             payload:/json/pointer or header:NAME; it decides which events keep their order",
        )?;
        if let Some((setting, owner)) = s.foreign_to(kind) {
            return Err(format!(
                "--{setting} is a setting of --sink {}, and this relay's sink is {}",
                owner.name(),
                kind.name()
            ));
        }
        let count = s.sinks.unwrap_or(1);
        if !(1..=MAX_SINKS).contains(&count) {
            return Err(format!(
                "--sinks must be 1 to {MAX_SINKS} (batches in flight at once)"
            ));
        }
        let sinks = sinks::build(kind, &url, &s, count)?;
        let lane = s.lane.unwrap_or(Ordering::Commit);
        Ok(Plan {
            target: describe(&sinks),
            config: s.routing.apply(relay_config(&name, lane, &s))?,
            name,
            lane,
            keys,
            sinks,
            count,
            progress: progress(s.progress)?,
        })
    }
}

/// Whether a `NAME=VALUE` librdkafka setting holds a secret (`sasl.password`,
/// `ssl.key.password`, `sasl.oauthbearer.client.secret`, ...).
fn names_a_secret(pair: &str) -> bool {
    let name = pair
        .split('=')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    ["password", "secret", "ssl.key.pem", "sasl.jaas"]
        .iter()
        .any(|word| name.contains(word))
}

/// The period of the progress lines: `0` (none), or [`MIN_PROGRESS`] to [`MAX_PROGRESS`].
fn progress(given: Option<Duration>) -> Result<Duration, String> {
    let every = given.unwrap_or(DEFAULT_PROGRESS);
    if every.is_zero() || (MIN_PROGRESS..=MAX_PROGRESS).contains(&every) {
        return Ok(every);
    }
    Err(format!(
        "--progress {} is out of range: 1s to 24h between progress lines, or 0 for none (a \
         shorter period floods the log)",
        humantime::format_duration(every)
    ))
}

fn relay_config(name: &str, lane: Ordering, s: &Settings) -> RelayConfig {
    let start = match s.start {
        Some(StartAt::Now) => StartFrom::Now,
        Some(StartAt::Beginning) | None => StartFrom::Beginning,
    };
    let mut config = RelayConfig::new(name).ordering(lane).start(start);
    if let Some(events) = s.batch_size {
        config = config.batch_size(events);
    }
    if let Some(budget) = s.per_event_budget {
        config = config.per_event_budget(budget);
    }
    if let Some(deadline) = s.batch_deadline {
        config = config.batch_deadline(deadline);
    }
    if let Some(lease) = s.lease {
        config = config.lease(lease);
    }
    if let Some(attempts) = s.max_attempts {
        config = config.max_attempts(attempts);
    }
    if let Some(types) = &s.event_types {
        config = config.event_types(types.iter().map(|name| name.trim().to_owned()));
    }
    if let Some(skip) = s.skip_untyped {
        config = config.skip_untyped(skip);
    }
    if let Some(bytes) = s.window_bytes {
        config = config.window(ordo::DEFAULT_KEYED_WINDOW, bytes);
    }
    if s.backoff_initial.is_some() || s.backoff_max.is_some() {
        let (initial, max) = DEFAULT_BACKOFF;
        config = config.backoff(
            s.backoff_initial.unwrap_or(initial),
            s.backoff_max.unwrap_or(max),
        );
    }
    config
}

fn describe(sinks: &Sinks) -> String {
    #[cfg_attr(
        not(any(
            feature = "nats",
            feature = "rabbitmq",
            feature = "http",
            feature = "kafka"
        )),
        allow(dead_code)
    )]
    fn first<K: Sink>(sinks: &[K]) -> String {
        sinks.first().map(Sink::describe).unwrap_or_default()
    }
    match *sinks {
        #[cfg(feature = "nats")]
        Sinks::Nats(ref sinks) => first(sinks),
        #[cfg(feature = "rabbitmq")]
        Sinks::Rabbit(ref sinks) => first(sinks),
        #[cfg(feature = "http")]
        Sinks::Webhook(ref sinks) => first(sinks),
        #[cfg(feature = "kafka")]
        Sinks::Kafka(ref sinks) => first(sinks),
    }
}

/// A library configuration error in the command line's words: the flags (and file settings)
/// it names, rather than the builder methods.
pub(crate) fn refusal(error: &ordo::Error) -> String {
    let ordo::Error::InvalidConfig { setting, reason } = error else {
        return error.to_string();
    };
    let flags: Vec<String> = setting
        .trim_start_matches("nats ")
        .trim_start_matches("rabbitmq ")
        .trim_start_matches("webhook ")
        .trim_start_matches("kafka ")
        .split('/')
        .map(|part| match part {
            "RelayConfig::new" => "NAME".to_owned(),
            "uri" | "url" | "bootstrap" => "--url".to_owned(),
            "property" => "--kafka-property".to_owned(),
            "secret" => "--secret-env".to_owned(),
            "timeout" => "--request-timeout".to_owned(),
            "connect_timeout" => "--sink-connect-timeout".to_owned(),
            "backoff" => "--backoff-initial/--backoff-max".to_owned(),
            other => format!("--{}", other.replace('_', "-")),
        })
        .collect();
    format!("invalid relay setting {}: {reason}", flags.join("/"))
}

/// Starts the relay of `plan` and runs it until SIGINT or SIGTERM, then stops it: the
/// batches in flight finish (bounded by the batch deadline) and are recorded, and the lease is
/// released, so a standby elsewhere takes over at once. A second signal exits without waiting.
#[cfg_attr(
    not(any(
        feature = "nats",
        feature = "rabbitmq",
        feature = "http",
        feature = "kafka"
    )),
    allow(unreachable_code, unused_variables)
)]
pub(crate) async fn serve(pool: PgPool, plan: Plan) -> CliResult {
    let Plan {
        name,
        config,
        lane,
        keys,
        sinks,
        count,
        target,
        progress,
    } = plan;
    let outbox = Outbox::<RawPayload>::new(pool, OutboxConfig::default()).await?;
    let started = match sinks {
        #[cfg(feature = "nats")]
        Sinks::Nats(sinks) => start(&outbox, config, sinks, keys.clone()).await,
        #[cfg(feature = "rabbitmq")]
        Sinks::Rabbit(sinks) => start(&outbox, config, sinks, keys.clone()).await,
        #[cfg(feature = "http")]
        Sinks::Webhook(sinks) => start(&outbox, config, sinks, keys.clone()).await,
        #[cfg(feature = "kafka")]
        Sinks::Kafka(sinks) => start(&outbox, config, sinks, keys.clone()).await,
    };
    let relay = match started {
        Ok(relay) => relay,
        Err(error) => {
            outbox.shutdown().await;
            return Err(refusal(&error).into());
        }
    };
    tracing::info!(
        relay = %name, %lane, sink = %target, sinks = count, key_from = %keys,
        "relay started; SIGINT or SIGTERM stops it"
    );
    watch(&relay, &name, progress).await;
    tracing::info!(relay = %name, "stopping: the batches in flight finish, then the lease is released");
    let stopping = async {
        relay.shutdown().await;
        outbox.shutdown().await;
    };
    tokio::select! {
        () = stopping => {}
        () = crate::interrupted() => {
            return Err(format!(
                "relay {name:?}: stopped by a second signal without waiting; its lease expires by itself"
            )
            .into());
        }
    }
    let position = relay.status().position.get();
    tracing::info!(relay = %name, position, "relay stopped; its lease is released");
    Ok(())
}

#[cfg_attr(
    not(any(
        feature = "nats",
        feature = "rabbitmq",
        feature = "http",
        feature = "kafka"
    )),
    allow(dead_code)
)]
async fn start<K: Sink>(
    outbox: &Outbox<RawPayload>,
    config: RelayConfig,
    sinks: Vec<K>,
    keys: KeyFrom,
) -> ordo::Result<SubscriptionHandle> {
    outbox
        .relay_with_sinks(config, sinks, move |event| keys.keys(event))
        .await
}
