//! `ordo`: the operator's command-line tool. Thin over the library.
//!
//! ```text
//! ordo migrate                                   create or upgrade the ordo schema
//! ordo tail --lane insert|commit [--after N] [--limit N] [--follow]
//! ordo fold                                      run a sequencer until SIGINT/SIGTERM
//! ordo status [--json|--prometheus] [--watch S]   positions, lag, stalls and their holders
//! ordo retention [--keep 30d] [--apply] [--force] partitions, and dropping old ones
//! ordo subscriptions [--json]                    list durable subscriptions
//! ordo subscriptions resume|pause NAME
//! ordo subscriptions reset NAME [--to POSITION]
//! ```
//! Every command reads `DATABASE_URL`, or `--database-url`.

use std::io::{self, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use futures::StreamExt;
use ordo::{CommitSequence, EventSequence, Outbox, OutboxConfig, Start};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

#[derive(Parser)]
#[command(name = "ordo", version, about = "Operate an ordo outbox on PostgreSQL")]
struct Cli {
    /// PostgreSQL URL of the database holding the `ordo` schema.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    database_url: Option<String>,

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
    /// List durable subscriptions, or pause, resume or reset one.
    Subscriptions(SubscriptionsArgs),
    /// Show positions, lag of each lane and subscription, and stalls with who holds them.
    Status(StatusArgs),
    /// Show the partitions and what retention would do; `--apply` does it.
    Retention(RetentionArgs),
}

#[derive(clap::Args)]
struct RetentionArgs {
    /// Drop partitions whose newest event is older than this (e.g. 30d, 12h, 45m, 90s).
    /// Without it nothing is dropped; partitions ahead are still created with --apply.
    #[arg(long, value_parser = parse_duration)]
    keep: Option<Duration>,
    /// Partitions to keep ready above the head.
    #[arg(long, default_value_t = 2)]
    ahead: u32,
    /// Drop even what subscriptions still need (they will halt). Never splits a transaction.
    #[arg(long)]
    force: bool,
    /// Create and drop; without it, only show the plan.
    #[arg(long)]
    apply: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let value: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 30d, 12h, 45m or 90s"))?;
    let seconds = match unit {
        "d" => 86_400,
        "h" => 3_600,
        "m" => 60,
        "s" | "" => 1,
        _ => return Err(format!("{text:?}: the unit must be d, h, m or s")),
    };
    Ok(Duration::from_secs(value * seconds))
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
    /// List every subscription (the default).
    List,
    /// Let a paused or halted subscription run again (a halted one retries its event).
    Resume { name: String },
    /// Stop a subscription after the event in hand, until resumed.
    Pause { name: String },
    /// Move a subscription's position (replay from it, or skip to it).
    Reset {
        name: String,
        /// The new position: everything at or below it counts as handled. Default 0.
        #[arg(long, default_value_t = 0)]
        to: u64,
    },
}

#[derive(clap::Args)]
struct TailArgs {
    /// Which lane to read.
    #[arg(long, value_enum, default_value = "insert")]
    lane: Lane,
    /// Start after this position (an insert sequence or a commit sequence, by lane); default
    /// the beginning.
    #[arg(long)]
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
    /// Seconds between progress lines on stderr (0: none).
    #[arg(long, default_value_t = 10)]
    progress: u64,
}

#[derive(Clone, Copy, ValueEnum)]
enum Lane {
    Insert,
    Commit,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(io::stderr)
        .init();
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("ordo: {error}");
            ExitCode::FAILURE
        }
    }
}

type CliResult = Result<(), Box<dyn std::error::Error>>;

async fn run(cli: Cli) -> CliResult {
    let Some(url) = cli.database_url else {
        return Err("no database: set DATABASE_URL or pass --database-url".into());
    };
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url)
        .await
        .map_err(|error| format!("cannot connect to the database: {error}"))?;
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
    }
}

async fn tail(pool: PgPool, args: TailArgs) -> CliResult {
    // A tail only reads; folding is left to the application's processes or `ordo fold`.
    let config = OutboxConfig::default().sequencer(false);
    let outbox = Outbox::<Value>::new(pool, config).await?;
    let limit = args.limit.unwrap_or(u64::MAX);
    let mut printed = 0u64;
    let mut out = io::BufWriter::new(io::stdout().lock());
    match args.lane {
        Lane::Insert => {
            let end = outbox.insert_frontier().get();
            let start = args.after.map_or(Start::Beginning, |after| {
                Start::After(EventSequence::new(after))
            });
            let mut events = outbox.listen_inserted(start);
            while printed < limit {
                if !args.follow && args.after.unwrap_or(0) >= end {
                    break;
                }
                let Some(event) = next_or_interrupt(&mut events).await else {
                    break;
                };
                let event = event?;
                let line = InsertLine {
                    lane: "insert",
                    sequence: event.sequence,
                    id: event.id,
                    commit_xid: event.commit_xid,
                    recorded_at: event.recorded_at,
                    event_type: event.event_type.as_deref(),
                    payload: &event.payload,
                };
                if !emit(&mut out, &line, args.follow)? {
                    break;
                }
                printed += 1;
                if !args.follow && event.sequence.get() >= end {
                    break;
                }
            }
        }
        Lane::Commit => {
            let end = outbox.commit_head().get();
            let start = args.after.map_or(Start::Beginning, |after| {
                Start::After(CommitSequence::new(after))
            });
            let mut events = outbox.listen_committed(start);
            while printed < limit {
                if !args.follow && args.after.unwrap_or(0) >= end {
                    break;
                }
                let Some(item) = next_or_interrupt(&mut events).await else {
                    break;
                };
                let item = item?;
                let line = CommitLine {
                    lane: "commit",
                    commit_sequence: item.commit_sequence,
                    sequence: item.event.sequence,
                    boundary: item.boundary,
                    commit_xid: item.event.commit_xid,
                    event_type: item.event.event_type.as_deref(),
                    payload: &item.event.payload,
                };
                if !emit(&mut out, &line, args.follow)? {
                    break;
                }
                printed += 1;
                if !args.follow && item.commit_sequence.get() >= end {
                    break;
                }
            }
        }
    }
    let _ = out.flush();
    outbox.shutdown().await;
    Ok(())
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

/// Writes one JSON line; `false` when the reader went away (a closed pipe is not an error).
fn emit(out: &mut impl Write, line: &impl Serialize, flush: bool) -> io::Result<bool> {
    let line = serde_json::to_string(line).map_err(io::Error::other)?;
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
            let rows = ordo::list_subscriptions(&pool).await?;
            let mut out = io::stdout().lock();
            if args.json {
                for row in &rows {
                    writeln!(out, "{}", serde_json::to_string(row)?)?;
                }
                return Ok(());
            }
            writeln!(
                out,
                "{:<24} {:<6} {:>10} {:>8} {:<7} {:>8}  LAST ERROR",
                "NAME", "LANE", "POSITION", "LAG", "STATUS", "ATTEMPTS"
            )?;
            for row in &rows {
                let error = row.last_error.as_deref().unwrap_or("-");
                writeln!(
                    out,
                    "{:<24} {:<6} {:>10} {:>8} {:<7} {:>8}  {}",
                    row.name, row.lane, row.position, row.lag, row.status, row.attempts, error
                )?;
            }
            Ok(())
        }
        SubscriptionAction::Resume { name } => {
            ordo::resume_subscription(&pool, &name).await?;
            eprintln!("ordo: subscription {name:?} resumed");
            Ok(())
        }
        SubscriptionAction::Pause { name } => {
            ordo::pause_subscription(&pool, &name).await?;
            eprintln!("ordo: subscription {name:?} paused");
            Ok(())
        }
        SubscriptionAction::Reset { name, to } => {
            ordo::reset_subscription(&pool, &name, to).await?;
            eprintln!("ordo: subscription {name:?} reset to position {to}");
            Ok(())
        }
    }
}

async fn status(pool: PgPool, args: StatusArgs) -> CliResult {
    if let Some(every) = args.watch
        && !(every.is_finite() && every >= 0.1)
    {
        return Err("--watch takes a number of seconds, at least 0.1".into());
    }
    loop {
        let status = ordo::status(&pool).await?;
        let text = if args.json {
            format!("{}\n", serde_json::to_string(&status)?)
        } else if args.prometheus {
            ordo::prometheus_text(&status)
        } else {
            ordo::status_table(&status)
        };
        let mut out = io::stdout().lock();
        if args.watch.is_some() && !args.json && !args.prometheus {
            // Clear the screen and go home, as `watch` does.
            write!(out, "\x1b[2J\x1b[H")?;
        }
        write!(out, "{text}")?;
        out.flush()?;
        drop(out);
        let Some(every) = args.watch else {
            return Ok(());
        };
        tokio::select! {
            _ = interrupted() => return Ok(()),
            _ = tokio::time::sleep(Duration::from_secs_f64(every)) => {}
        }
    }
}

async fn retention(pool: PgPool, args: RetentionArgs) -> CliResult {
    let mut config = ordo::RetentionConfig::new()
        .ahead(args.ahead)
        .force(args.force);
    if let Some(keep) = args.keep {
        config = config.keep(keep);
    }
    let report = if args.apply {
        ordo::run_retention(&pool, &config).await?
    } else {
        ordo::plan_retention(&pool, &config).await?
    };
    let mut out = io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
        return Ok(());
    }
    writeln!(
        out,
        "partition size {}; lowest stored sequence {}; needed from sequence {} by {}",
        report.partition_size, report.events_floor, report.needed_from, report.needed_by
    )?;
    writeln!(
        out,
        "{:<28} {:>14} {:>14}  VERDICT",
        "PARTITION", "FROM", "TO"
    )?;
    for partition in &report.partitions {
        let verdict = match (partition.drop, args.apply) {
            (true, true) => "dropped".to_owned(),
            (true, false) => "would drop (past retention)".to_owned(),
            (false, _) => format!("kept: {}", partition.reason),
        };
        let from = partition
            .from
            .map_or("MINVALUE".to_owned(), |f| f.to_string());
        writeln!(
            out,
            "{:<28} {:>14} {:>14}  {verdict}",
            partition.name, from, partition.to
        )?;
    }
    for created in &report.created {
        writeln!(out, "created {created}")?;
    }
    if !args.apply {
        writeln!(out, "(a plan: run with --apply to create and drop)")?;
    }
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
