//! `ordo`: the operator's command-line tool. Thin over the library.
//!
//! ```text
//! ordo migrate                                   create or upgrade the ordo schema
//! ordo tail --lane insert|commit [--after N] [--limit N] [--follow]
//! ordo fold                                      run a sequencer until SIGINT/SIGTERM
//! ordo status [--json|--prometheus] [--watch S]   positions, lag, stalls and their holders
//! ordo retention [--keep 30d] [--ahead N] [--apply] [--force]  partitions, and dropping old ones
//! ordo subscriptions [list] [--json]             list subscriptions and relays
//! ordo subscriptions resume|pause NAME
//! ordo subscriptions reset NAME --to POSITION [--force]
//! ordo subscriptions stalled NAME [--json]
//! ordo subscriptions retry-keys NAME (KEY | --all)
//! ordo subscriptions delete NAME [--force]
//! ordo dead-letters [list] [--subscription NAME] [--json]
//! ordo dead-letters retry (ID | --subscription NAME)
//! ordo dead-letters purge [--subscription NAME] (--older-than 7d | --all)
//! ordo grant [--writer R]... [--publisher R]... [--sequencer R]... [--consumer R]...
//!            [--reader R]... [--operator R]...      least-privilege roles
//! ordo inbox [failed|replay|watermarks|set-watermark]  the consumer inbox (see cli/inbox.rs)
//! ordo relay [list]                              list relays
//! ordo relay run NAME --sink S --key-from K ...   a relay until SIGINT/SIGTERM (cli/relay_run.rs)
//! ordo relay parked|requeue|replay|resume|attempts   relays' parked events (see cli/relay.rs)
//! ordo secrets [list|add|remove|scrub]           secret payload keys (see cli/secrets.rs)
//! ```
//!
//! Every list command lists when given no subcommand; every name, id and consumer that matches
//! nothing is an error that names it.
//! Every command reads `DATABASE_URL`, or `--database-url`.

use std::io::{self, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use futures::StreamExt;
use ordo::{
    CommitOrderedEnvelope, CommitSequence, Envelope, EventSequence, Ordering, Outbox, OutboxConfig,
    Start, admin,
};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::str::FromStr;

#[path = "ordo/diagnose.rs"]
mod diagnose;
#[path = "cli/inbox.rs"]
mod inbox;
#[path = "cli/relay.rs"]
mod relay;
#[path = "cli/secrets.rs"]
mod secrets;

#[derive(Parser)]
#[command(name = "ordo", version, about = "Operate an ordo outbox on PostgreSQL")]
struct Cli {
    /// PostgreSQL URL of the database holding the `ordo` schema.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    database_url: Option<String>,

    /// Seconds to wait for a connection before saying why there is none.
    #[arg(long, global = true, default_value_t = 10.0, value_name = "SECONDS")]
    connect_timeout: f64,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create or upgrade the `ordo` schema (idempotent).
    Migrate,
    /// Print events as JSON lines, one object per event.
    Tail(TailArgs),
    /// Run a commit-lane sequencer until SIGINT or SIGTERM. Any number may run at once.
    Fold(FoldArgs),
    /// List subscriptions and relays; pause, resume, reset or delete one; its stalled keys.
    Subscriptions(SubscriptionsArgs),
    /// Show positions, lag of each lane and subscription, and stalls with who holds them.
    Status(StatusArgs),
    /// Show the partitions and what retention would do; `--apply` does it.
    Retention(RetentionArgs),
    /// Grant roles what an ordo writer, publisher, sequencer, consumer, reader or operator
    /// needs (idempotent).
    Grant(GrantArgs),
    /// List, retry or purge the events subscriptions gave up on.
    DeadLetters(DeadLettersArgs),
    /// The consumer inbox: failed messages, replays, watermarks and moving one.
    Inbox(inbox::InboxArgs),
    /// Relays: list them, run one standalone; parked events, requeue, replay, resume, attempts.
    Relay(relay::RelayArgs),
    /// Secret payload keys: removed from stored events once every reader passed them.
    Secrets(secrets::SecretsArgs),
}

#[derive(clap::Args)]
#[command(group = clap::ArgGroup::new("roles").required(true).multiple(true))]
struct GrantArgs {
    /// An application role: publishes and runs an Outbox (lanes, sequencer, its own
    /// subscriptions and relays); may not set `sequence` or `commit_xid`, write the commit log
    /// directly, move another role's subscription, nor create partitions.
    #[arg(long, value_name = "ROLE", group = "roles")]
    writer: Vec<String>,
    /// A role that only publishes (its Outbox runs with the sequencer off).
    #[arg(long, value_name = "ROLE", group = "roles")]
    publisher: Vec<String>,
    /// A folding process (`ordo fold`): resolves holes and appends to the commit log, each
    /// through a function that verifies it.
    #[arg(long, value_name = "ROLE", group = "roles")]
    sequencer: Vec<String>,
    /// A role that runs its own subscriptions, relays and inboxes, and folds; it cannot move
    /// another role's subscription.
    #[arg(long, value_name = "ROLE", group = "roles")]
    consumer: Vec<String>,
    /// A read-only role: status, tail, listeners with the sequencer off.
    #[arg(long, value_name = "ROLE", group = "roles")]
    reader: Vec<String>,
    /// An operator: partitions, retention, subscription admin (a member of ordo's owner).
    #[arg(long, value_name = "ROLE", group = "roles")]
    operator: Vec<String>,
}

#[derive(clap::Args)]
struct RetentionArgs {
    /// Drop partitions sealed longer ago than this: every event in them committed at least
    /// that long ago (e.g. 30d, 12h, 45m, 90s, "1h 30m"). Without it nothing is dropped;
    /// partitions ahead are still created with --apply.
    #[arg(long, value_parser = parse_duration)]
    keep: Option<Duration>,
    /// Partitions to keep ready above the head (1 to ordo::MAX_AHEAD).
    #[arg(long, default_value_t = 2, value_parser = ahead_in_range)]
    ahead: u32,
    /// Drop even what subscriptions still need (they will halt). Never splits a transaction.
    #[arg(long)]
    force: bool,
    /// Create, fold and drop; without it, only show the plan.
    #[arg(long)]
    apply: bool,
    /// How long to keep retrying a partition whose lock is busy (each try waits 100 ms).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    retry_for: Duration,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// A duration such as `30d`, `12h`, `45m`, `90s` or `1h 30m` (a bare number is seconds),
/// parsed with overflow checks: a value too large is an error, never a panic.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let parsed = if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        text.parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|error| error.to_string())
    } else {
        humantime::parse_duration(text).map_err(|error| error.to_string())
    };
    parsed.map_err(|error| {
        format!("{text:?} is not a duration such as 30d, 12h, 45m or 90s: {error}")
    })
}

fn ahead_in_range(text: &str) -> Result<u32, String> {
    let ahead: u32 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of partitions"))?;
    if !(1..=ordo::MAX_AHEAD).contains(&ahead) {
        return Err(format!(
            "{ahead} is out of range: between 1 and {} partitions ahead (each partition costs every \
             query on ordo.events planning time; use larger partitions instead)",
            ordo::MAX_AHEAD
        ));
    }
    Ok(ahead)
}

/// A position as PostgreSQL stores it: a `bigint`, so at most `i64::MAX`.
fn parse_position(text: &str) -> Result<u64, String> {
    let value: u64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a position (a whole number, 0 or more)"))?;
    if i64::try_from(value).is_err() {
        return Err(format!(
            "{value} is beyond any position: positions are PostgreSQL bigints, at most {}",
            i64::MAX
        ));
    }
    Ok(value)
}

#[derive(clap::Args)]
struct StatusArgs {
    /// Print one JSON object.
    #[arg(long, conflicts_with = "prometheus")]
    json: bool,
    /// Print the figures in Prometheus text exposition format.
    #[arg(long)]
    prometheus: bool,
    /// Refresh every this many seconds until interrupted.
    #[arg(long, value_name = "SECONDS")]
    watch: Option<f64>,
}

#[derive(clap::Args)]
struct SubscriptionsArgs {
    #[command(subcommand)]
    action: Option<SubscriptionAction>,
    /// Print JSON (one object per subscription) instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum SubscriptionAction {
    /// List every subscription and relay (the default).
    List,
    /// Let a paused or halted subscription run again (a halted one retries its event).
    Resume { name: String },
    /// Stop a subscription after the event in hand, until resumed.
    Pause { name: String },
    /// Move a subscription's position (replay from it, or skip to it).
    Reset {
        name: String,
        /// The new position, in the subscription's lane: everything at or below it counts as
        /// handled (0 replays everything).
        #[arg(long)]
        to: u64,
        /// Allow a position past the lane's head (skips events not yet written).
        #[arg(long)]
        force: bool,
    },
    /// List a keyed subscription's stalled keys.
    ///
    /// Each waits on an event whose attempts ran out, while every other key goes on.
    Stalled {
        name: String,
        /// Print JSON (one object per key) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Retry the stalled event holding KEY (or every one, with --all).
    ///
    /// The subscription's runner takes the request; the events waiting behind the stalled one
    /// follow in order.
    #[command(group = clap::ArgGroup::new("which").required(true).args(["key", "all"]))]
    RetryKeys {
        name: String,
        /// The stalled key (`ordo subscriptions stalled NAME`).
        key: Option<String>,
        /// Every stalled key of the subscription.
        #[arg(long)]
        all: bool,
    },
    /// Delete a subscription's row (its dead letters stay until purged).
    Delete {
        name: String,
        /// Delete even while a runner holds a live lease (that runner then stands by).
        #[arg(long)]
        force: bool,
    },
}

#[derive(clap::Args)]
struct DeadLettersArgs {
    #[command(subcommand)]
    action: Option<DeadLetterAction>,
}

#[derive(Subcommand)]
enum DeadLetterAction {
    /// List dead letters, oldest first (the default).
    List {
        /// Only this subscription's.
        #[arg(long)]
        subscription: Option<String>,
        /// Print JSON (one object per dead letter) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Hand a dead letter's event (or each of a subscription's) to its handler again, once.
    ///
    /// The subscription's running runner takes the request; the dead letter goes when the
    /// handler succeeds, and stays with the new error when not.
    #[command(group = clap::ArgGroup::new("which").required(true).args(["id", "subscription"]))]
    Retry {
        /// The dead letter's id (`ordo dead-letters list`).
        id: Option<i64>,
        /// Every dead letter of this subscription.
        #[arg(long)]
        subscription: Option<String>,
    },
    /// Delete dead letters (the events stay in ordo.events).
    #[command(group = clap::ArgGroup::new("age").required(true).args(["older_than", "all"]))]
    Purge {
        /// Only this subscription's.
        #[arg(long)]
        subscription: Option<String>,
        /// Only those at least this old (e.g. 30d, 12h, 45m, 90s).
        #[arg(long, value_parser = parse_duration)]
        older_than: Option<Duration>,
        /// Every one, whatever its age.
        #[arg(long)]
        all: bool,
    },
}

#[derive(clap::Args)]
struct TailArgs {
    /// Which lane to read.
    #[arg(long, default_value = "insert", value_parser = lane_parser())]
    lane: Ordering,
    /// Start after this position (an insert sequence or a commit sequence, by lane); default
    /// the beginning.
    #[arg(long, value_parser = parse_position)]
    after: Option<u64>,
    /// Exit after this many events.
    #[arg(long)]
    limit: Option<u64>,
    /// Keep waiting for new events instead of exiting once caught up.
    #[arg(long)]
    follow: bool,
}

#[derive(clap::Args)]
struct FoldArgs {
    /// Seconds between progress lines on stderr: 1 to 86400 (a day), or 0 for none. Whole
    /// seconds, so no period floods the log as a sub-second one would.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    progress: u64,
}

/// `--lane`: the lane's name, as ordo prints and stores it.
fn lane_parser() -> impl clap::builder::TypedValueParser<Value = Ordering> {
    use clap::builder::TypedValueParser;
    let lanes = [Ordering::Insert, Ordering::Commit];
    clap::builder::PossibleValuesParser::new(lanes.map(Ordering::as_str)).map(move |name| {
        lanes
            .into_iter()
            .find(|lane| lane.as_str() == name)
            .unwrap_or_default()
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // A standalone relay is a long-running service: its operator sees it start, change state
    // and progress. Every other command only warns. RUST_LOG overrides both.
    let quiet = match &cli.command {
        Command::Relay(args) if args.runs_a_relay() => "warn,ordo=info",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(quiet)),
        )
        .with_writer(io::stderr)
        .init();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // Errors can quote subscription names, handler errors and payload text: nothing
            // in them may drive the terminal.
            eprintln!("ordo: {}", admin::printable(&error.to_string()));
            ExitCode::FAILURE
        }
    }
}

type CliResult = Result<(), Box<dyn std::error::Error>>;

async fn run(cli: Cli) -> CliResult {
    let Some(url) = cli.database_url else {
        return Err("no database: set DATABASE_URL or pass --database-url".into());
    };
    let database = connect(&url, cli.connect_timeout);
    let pool = match cli.command {
        // `ordo relay run` checks its settings before it connects.
        Command::Relay(args) => return relay::run(database, args).await,
        _ => database.await?,
    };
    match cli.command {
        Command::Migrate => {
            ordo::migrate(&pool).await?;
            eprintln!("ordo: schema is up to date");
            Ok(())
        }
        Command::Tail(args) => tail(pool, args).await,
        Command::Fold(args) => fold(pool, args).await,
        Command::Subscriptions(args) => subscriptions(pool, args).await,
        Command::Status(args) => status(pool, args).await,
        Command::Retention(args) => retention(pool, args).await,
        Command::Grant(args) => grant(pool, args).await,
        Command::DeadLetters(args) => dead_letters(pool, args).await,
        Command::Inbox(args) => inbox::run(pool, args).await,
        Command::Relay(args) => relay::run(std::future::ready(Ok(pool)), args).await,
        Command::Secrets(args) => secrets::run(pool, args).await,
    }
}

/// A pool on `url`, or an error that says why not and where: refused, unreachable, or a
/// server that accepts connections and never answers. Never the URL itself (it may hold a
/// password).
async fn connect(url: &str, timeout: f64) -> Result<PgPool, Box<dyn std::error::Error>> {
    let timeout = Duration::try_from_secs_f64(timeout)
        .ok()
        .filter(|t| !t.is_zero())
        .ok_or("--connect-timeout takes a positive number of seconds")?;
    let options = PgConnectOptions::from_str(url)
        .map_err(|_| "DATABASE_URL (or --database-url) is not a valid PostgreSQL URL")?;
    let pooled = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(timeout)
        .connect_with(options.clone())
        .await;
    match pooled {
        Ok(pool) => Ok(pool),
        Err(error @ (sqlx::Error::PoolTimedOut | sqlx::Error::Io(_))) => {
            Err(diagnose::connect_failure(&options, &error).await.into())
        }
        Err(error) => Err(format!(
            "cannot connect to the database at {}: {}",
            diagnose::place(&options),
            ordo::Error::from(error)
        )
        .into()),
    }
}

async fn grant(pool: PgPool, args: GrantArgs) -> CliResult {
    let grants = args
        .writer
        .iter()
        .map(ordo::Grants::writer)
        .chain(args.publisher.iter().map(ordo::Grants::publisher))
        .chain(args.sequencer.iter().map(ordo::Grants::sequencer))
        .chain(args.consumer.iter().map(ordo::Grants::consumer))
        .chain(args.reader.iter().map(ordo::Grants::reader))
        .chain(args.operator.iter().map(ordo::Grants::operator))
        .fold(ordo::Grants::default(), ordo::Grants::and);
    admin::grant(&pool, &grants).await?;
    for (kind, role) in grants.roles() {
        eprintln!("ordo: {role} is an ordo {}", kind.as_str());
    }
    Ok(())
}

async fn tail(pool: PgPool, args: TailArgs) -> CliResult {
    // A tail only reads; folding is left to the application's processes or `ordo fold`.
    let config = OutboxConfig::default().sequencer(false);
    let outbox = Outbox::<Value>::new(pool, config).await?;
    let printed = match args.lane {
        Ordering::Commit => {
            let end = outbox.commit_head().get();
            let start = args.after.map_or(Start::Beginning, |after| {
                Start::After(CommitSequence::new(after))
            });
            print_lane(outbox.listen_committed(start), end, &args).await
        }
        _ => {
            let end = outbox.insert_frontier().get();
            let start = args.after.map_or(Start::Beginning, |after| {
                Start::After(EventSequence::new(after))
            });
            print_lane(outbox.listen_inserted(start), end, &args).await
        }
    };
    outbox.shutdown().await;
    printed
}

/// Prints a lane's events as JSON lines, up to `--limit`, and without `--follow` up to `end`
/// (the lane's position when the tail started).
async fn print_lane<S, T>(mut events: S, end: u64, args: &TailArgs) -> CliResult
where
    S: futures::Stream<Item = Result<T, ordo::Error>> + Unpin,
    T: TailItem,
{
    let limit = args.limit.unwrap_or(u64::MAX);
    let mut printed = 0u64;
    let mut out = io::BufWriter::new(io::stdout().lock());
    while printed < limit {
        if !args.follow && args.after.unwrap_or(0) >= end {
            break;
        }
        let Some(item) = next_or_interrupt(&mut events).await else {
            break;
        };
        let item = item?;
        if !emit(&mut out, &item.line(), args.follow)? {
            break;
        }
        printed += 1;
        if !args.follow && item.position() >= end {
            break;
        }
    }
    let _ = out.flush();
    Ok(())
}

/// An item of either lane, as `tail` prints it.
trait TailItem {
    /// Its position in its lane.
    fn position(&self) -> u64;
    fn line(&self) -> TailLine<'_>;
}

impl TailItem for std::sync::Arc<Envelope<Value>> {
    fn position(&self) -> u64 {
        self.sequence.get()
    }

    fn line(&self) -> TailLine<'_> {
        TailLine::Insert(InsertLine {
            lane: Ordering::Insert.as_str(),
            sequence: self.sequence,
            id: self.id,
            commit_xid: self.commit_xid,
            recorded_at: self.recorded_at,
            event_type: self.event_type.as_deref(),
            payload: &self.payload,
        })
    }
}

impl TailItem for CommitOrderedEnvelope<Value> {
    fn position(&self) -> u64 {
        self.commit_sequence.get()
    }

    fn line(&self) -> TailLine<'_> {
        TailLine::Commit(CommitLine {
            lane: Ordering::Commit.as_str(),
            commit_sequence: self.commit_sequence,
            sequence: self.event.sequence,
            boundary: self.boundary,
            commit_xid: self.event.commit_xid,
            event_type: self.event.event_type.as_deref(),
            payload: &self.event.payload,
        })
    }
}

/// One line of `tail`, its fields those of its lane.
#[derive(Serialize)]
#[serde(untagged)]
enum TailLine<'a> {
    Insert(InsertLine<'a>),
    Commit(CommitLine<'a>),
}

/// The next stream item, or `None` on end of stream, SIGINT or SIGTERM.
async fn next_or_interrupt<S: futures::Stream + Unpin>(stream: &mut S) -> Option<S::Item> {
    tokio::select! {
        item = stream.next() => item,
        _ = interrupted() => None,
    }
}

/// One `tail --lane insert` line; fields in this order.
#[derive(Serialize)]
struct InsertLine<'a> {
    lane: &'static str,
    sequence: EventSequence,
    id: uuid::Uuid,
    commit_xid: i64,
    recorded_at: chrono::DateTime<chrono::Utc>,
    /// `null` when untyped.
    event_type: Option<&'a str>,
    payload: &'a Value,
}

/// One `tail --lane commit` line; fields in this order.
#[derive(Serialize)]
struct CommitLine<'a> {
    lane: &'static str,
    commit_sequence: CommitSequence,
    sequence: EventSequence,
    boundary: bool,
    commit_xid: i64,
    /// `null` when untyped.
    event_type: Option<&'a str>,
    payload: &'a Value,
}

/// `value` as one line of JSON that is also safe on a terminal: serde_json escapes C0 controls,
/// and DEL, C1 controls (8-bit CSI among them) and bidirectional overrides are escaped here too
/// (still valid JSON, the same string once parsed).
fn json_line(value: &impl Serialize) -> serde_json::Result<String> {
    let line = serde_json::to_string(value)?;
    if !line.chars().any(|c| c.is_control() || is_bidi_override(c)) {
        return Ok(line);
    }
    let mut out = String::with_capacity(line.len() + 16);
    for c in line.chars() {
        if c.is_control() || is_bidi_override(c) {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

fn is_bidi_override(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Writes one JSON line; `false` when the reader went away (a closed pipe is not an error).
fn emit(out: &mut impl Write, line: &impl Serialize, flush: bool) -> io::Result<bool> {
    let line = json_line(line).map_err(io::Error::other)?;
    let written = writeln!(out, "{line}").and_then(|()| if flush { out.flush() } else { Ok(()) });
    match written {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == io::ErrorKind::BrokenPipe => Ok(false),
        Err(error) => Err(error),
    }
}

async fn fold(pool: PgPool, args: FoldArgs) -> CliResult {
    let outbox =
        Outbox::<Box<serde_json::value::RawValue>>::new(pool, OutboxConfig::default()).await?;
    eprintln!(
        "ordo fold: folding from commit sequence {} (insert frontier {}); SIGINT or SIGTERM stops",
        outbox.commit_head(),
        outbox.insert_frontier()
    );
    let every = Duration::from_secs(args.progress.max(1));
    let mut last = outbox.commit_head().get();
    loop {
        tokio::select! {
            _ = interrupted() => break,
            _ = tokio::time::sleep(every), if args.progress > 0 => {
                let head = outbox.commit_head().get();
                eprintln!(
                    "ordo fold: commit head {head} (+{} in {}s), insert frontier {}",
                    head - last.min(head),
                    every.as_secs(),
                    outbox.insert_frontier()
                );
                last = head;
            }
        }
    }
    outbox.shutdown().await;
    eprintln!(
        "ordo fold: stopped at commit sequence {}",
        outbox.commit_head()
    );
    Ok(())
}

async fn subscriptions(pool: PgPool, args: SubscriptionsArgs) -> CliResult {
    match args.action.unwrap_or(SubscriptionAction::List) {
        SubscriptionAction::List => {
            let rows = admin::list_subscriptions(&pool).await?;
            let mut out = io::stdout().lock();
            if args.json {
                for row in &rows {
                    writeln!(out, "{}", json_line(row)?)?;
                }
                return Ok(());
            }
            write!(out, "{}", admin::subscriptions_table(&rows))?;
            Ok(())
        }
        SubscriptionAction::Resume { name } => {
            admin::resume_subscription(&pool, &name).await?;
            eprintln!("ordo: subscription {name:?} resumed");
            Ok(())
        }
        SubscriptionAction::Pause { name } => {
            admin::pause_subscription(&pool, &name).await?;
            eprintln!("ordo: subscription {name:?} paused");
            Ok(())
        }
        SubscriptionAction::Reset { name, to, force } => reset(&pool, &name, to, force).await,
        SubscriptionAction::Stalled { name, json } => {
            let stalled = admin::list_stalled_keys(&pool, &name).await?;
            let mut out = io::stdout().lock();
            if json {
                for key in &stalled {
                    writeln!(out, "{}", json_line(key)?)?;
                }
                return Ok(());
            }
            write!(out, "{}", admin::stalled_keys_table(&stalled))?;
            Ok(())
        }
        SubscriptionAction::RetryKeys { name, key, all: _ } => {
            let asked = admin::retry_stalled_keys(&pool, &name, key.as_deref()).await?;
            let which = key.map_or_else(|| "every key".to_owned(), |key| format!("key {key:?}"));
            eprintln!(
                "ordo: {asked} stalled events of {name:?} ({which}) marked for retry by its runner"
            );
            Ok(())
        }
        SubscriptionAction::Delete { name, force } => {
            admin::delete_subscription(&pool, &name, force).await?;
            eprintln!("ordo: subscription {name:?} deleted");
            Ok(())
        }
    }
}

/// The raw `--to` becomes a position of the subscription's own lane.
async fn reset(pool: &PgPool, name: &str, to: u64, force: bool) -> CliResult {
    let rows = admin::list_subscriptions(pool).await?;
    let Some(row) = rows.iter().find(|row| row.name == name) else {
        return Err(ordo::Error::UnknownSubscription {
            name: name.to_owned(),
        }
        .into());
    };
    let position = match row.lane {
        Ordering::Commit => ordo::Position::Commit(CommitSequence::new(to)),
        _ => ordo::Position::Insert(EventSequence::new(to)),
    };
    admin::reset_subscription(pool, name, position, force).await?;
    eprintln!(
        "ordo: subscription {name:?} reset to {} position {to}",
        row.lane
    );
    Ok(())
}

async fn dead_letters(pool: PgPool, args: DeadLettersArgs) -> CliResult {
    let action = args.action.unwrap_or(DeadLetterAction::List {
        subscription: None,
        json: false,
    });
    match action {
        DeadLetterAction::List { subscription, json } => {
            let rows = admin::list_dead_letters(&pool, subscription.as_deref()).await?;
            let mut out = io::stdout().lock();
            if json {
                for row in &rows {
                    writeln!(out, "{}", serde_json::to_string(row)?)?;
                }
                return Ok(());
            }
            write!(out, "{}", admin::dead_letters_table(&rows))?;
            Ok(())
        }
        DeadLetterAction::Retry { id, subscription } => {
            match (id, subscription) {
                (Some(id), _) => {
                    admin::retry_dead_letter(&pool, id).await?;
                    eprintln!(
                        "ordo: dead letter {id} marked for retry by its subscription's runner"
                    );
                }
                (None, Some(name)) => {
                    let marked = admin::retry_dead_letters(&pool, &name).await?;
                    eprintln!(
                        "ordo: {marked} dead letters of {name:?} marked for retry by its runner"
                    );
                }
                (None, None) => return Err("give a dead letter's id or --subscription".into()),
            }
            Ok(())
        }
        DeadLetterAction::Purge {
            subscription,
            older_than,
            all: _,
        } => {
            let older_than = older_than.unwrap_or(Duration::ZERO);
            let purged =
                admin::purge_dead_letters(&pool, subscription.as_deref(), older_than).await?;
            eprintln!("ordo: {purged} dead letters purged");
            Ok(())
        }
    }
}

async fn status(pool: PgPool, args: StatusArgs) -> CliResult {
    let watch = match args.watch {
        None => None,
        Some(every) => Some(
            Duration::try_from_secs_f64(every)
                .ok()
                .filter(|d| d.as_secs_f64() >= 0.1)
                .ok_or("--watch takes a number of seconds, at least 0.1")?,
        ),
    };
    loop {
        let status = admin::status(&pool).await?;
        let text = if args.json {
            format!("{}\n", json_line(&status)?)
        } else if args.prometheus {
            admin::prometheus_text(&status)
        } else {
            admin::status_table(&status)
        };
        let mut out = io::stdout().lock();
        if args.watch.is_some() && !args.json && !args.prometheus {
            // Clear the screen and go home, as `watch` does.
            write!(out, "\x1b[2J\x1b[H")?;
        }
        write!(out, "{text}")?;
        out.flush()?;
        drop(out);
        let Some(every) = watch else {
            return Ok(());
        };
        tokio::select! {
            _ = interrupted() => return Ok(()),
            _ = tokio::time::sleep(every) => {}
        }
    }
}

async fn retention(pool: PgPool, args: RetentionArgs) -> CliResult {
    let mut config = ordo::RetentionConfig::new()
        .ahead(args.ahead)
        .force(args.force)
        .retry_for(args.retry_for);
    if let Some(keep) = args.keep {
        config = config.keep(keep);
    }
    let report = if args.apply {
        admin::run_retention(&pool, &config).await?
    } else {
        admin::plan_retention(&pool, &config).await?
    };
    if let Some(warning) = &report.warning {
        // On stderr too, so that a cron job's mail carries it.
        eprintln!("ordo retention: WARNING: {warning}");
    }
    let mut out = io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
        return Ok(());
    }
    write!(out, "{}", admin::retention_table(&report, args.apply))?;
    Ok(())
}

async fn interrupted() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_refuse_overflow_without_panicking() {
        assert_eq!(parse_duration("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_duration("12h"), Ok(Duration::from_secs(12 * 3_600)));
        assert_eq!(parse_duration("45m"), Ok(Duration::from_secs(45 * 60)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5_400)));
        let overflow = parse_duration("999999999999999d");
        assert!(
            overflow
                .as_ref()
                .is_err_and(|e| e.contains("999999999999999d")),
            "{overflow:?}"
        );
        assert!(parse_duration("99999999999999999999999").is_err());
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn ahead_is_bounded() {
        assert_eq!(ahead_in_range("2"), Ok(2));
        assert_eq!(ahead_in_range("100"), Ok(ordo::MAX_AHEAD));
        assert!(ahead_in_range("0").is_err());
        let refused = ahead_in_range("300");
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.contains("between 1 and 100")),
            "{refused:?}"
        );
    }

    #[test]
    fn the_retention_command_line_refuses_an_overflowing_keep() {
        let parsed = Cli::try_parse_from(["ordo", "retention", "--keep", "999999999999999d"]);
        let error = parsed.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("is not a duration"), "{error}");
    }
}
