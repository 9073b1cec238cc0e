//! `ordo`: the operator's command-line tool. Thin over the library.
//!
//! ```text
//! ordo migrate                                   create or upgrade the ordo schema
//! ordo tail --lane insert|commit [--after N] [--limit N] [--follow]
//! ordo fold                                      run a sequencer until SIGINT/SIGTERM
//! ordo status [--json|--prometheus] [--watch S]   positions, lag, the inbox, what is stuck
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
//! ordo inbox [--consumer C] [--json]            the consumer inbox (inbox.rs): its
//! ordo inbox failed|replay|watermarks|set-watermark  failed messages, replays, watermarks
//! ordo relay [list] [--json]                     list relays
//! ordo relay run NAME --sink S --key-from K ...   a relay until SIGINT/SIGTERM (relay/run.rs)
//! ordo relay parked|requeue|replay|resume|attempts   relays' parked events (relay/mod.rs)
//! ordo secrets [list] [--json] | add|remove|scrub  secret payload keys (secrets.rs)
//! ```
//!
//! Every list command lists when given no subcommand, and takes there what its `list` takes;
//! every name, key, position, id and consumer that matches nothing is an error that names it.
//! What they print is safe for a terminal and tells look-alike names apart; a reader that
//! closes the pipe ends a command quietly.
//! Every command reads `DATABASE_URL`, or `--database-url`.
//!
//! One file per command (or folder, for `relay`); the value parsers they share are in
//! `parse.rs`, their JSON output in `output.rs`, and every table they print is rendered by
//! `ordo::admin` (`src/ops/render.rs`).

use std::io;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ordo::admin;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

mod dead_letters;
mod diagnose;
mod fold;
mod grant;
mod inbox;
mod output;
mod parse;
mod relay;
mod retention;
mod secrets;
mod status;
mod subscriptions;
mod tail;

#[derive(Parser)]
#[command(name = "ordo", version, about = "Operate an ordo outbox on PostgreSQL")]
struct Cli {
    /// PostgreSQL URL of the database holding the `ordo` schema [default: $DATABASE_URL].
    // Read from the environment by `run`, not by clap: an argument clap fills from the
    // environment counts as given, and its error messages then show it in the usage line as if
    // it were required.
    #[arg(long, global = true, value_name = "URL")]
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
    Tail(tail::TailArgs),
    /// Run a commit-lane sequencer until SIGINT or SIGTERM. Any number may run at once.
    Fold(fold::FoldArgs),
    /// List subscriptions and relays; pause, resume, reset or delete one; its stalled keys.
    Subscriptions(subscriptions::SubscriptionsArgs),
    /// Show positions, lag of each lane and subscription, and stalls with who holds them.
    Status(status::StatusArgs),
    /// Show the partitions and what retention would do; `--apply` does it.
    Retention(retention::RetentionArgs),
    /// Grant roles what an ordo writer, publisher, sequencer, consumer, reader or operator
    /// needs (idempotent).
    Grant(grant::GrantArgs),
    /// List, retry or purge the events subscriptions gave up on.
    DeadLetters(dead_letters::DeadLettersArgs),
    /// The consumer inbox: failed messages, replays, watermarks and moving one.
    Inbox(inbox::InboxArgs),
    /// Relays: list them, run one standalone; parked events, requeue, replay, resume, attempts.
    Relay(relay::RelayArgs),
    /// Secret payload keys: removed from stored events once every reader passed them.
    Secrets(secrets::SecretsArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // A standalone relay is a long-running service: its operator sees it start, change state
    // and progress. Every other command only warns. RUST_LOG overrides both.
    // sqlx's own warnings (a statement slower than a second, on a database with ten thousand
    // subscriptions) are not the operator's business: only its errors are shown.
    let quiet = match &cli.command {
        Command::Relay(args) if args.runs_a_relay() => "warn,ordo=info,sqlx=error",
        _ => "warn,sqlx=error",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(quiet)),
        )
        .fmt_fields(printable_fields())
        // Colours for a terminal only: a log file or a pipe gets the text alone.
        .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
        .with_writer(io::stderr)
        .init();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`ordo subscriptions --json | head`): nothing left to say.
        Err(error) if closed_pipe(error.as_ref()) => ExitCode::SUCCESS,
        Err(error) => {
            // Errors can quote subscription names, handler errors and payload text: nothing
            // in them may drive the terminal.
            eprintln!("ordo: {}", admin::printable(&error.to_string()));
            ExitCode::FAILURE
        }
    }
}

pub(crate) type CliResult = Result<(), Box<dyn std::error::Error>>;

/// How log lines show their fields: each value made [`admin::printable`], the message's
/// too. A relay's or subscription's name, a handler's error and a sink's answer are someone
/// else's text; on the operator's terminal none may drive it, forge a line or pass for
/// another name.
fn printable_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> {
    use tracing_subscriber::field::MakeExt;
    tracing_subscriber::fmt::format::debug_fn(|writer, field, value| {
        let shown = format!("{value:?}");
        let shown = admin::printable(&shown);
        if field.name() == "message" {
            write!(writer, "{shown}")
        } else {
            write!(writer, "{field}={shown}")
        }
    })
    .delimited(" ")
}

/// Whether `error` is a write to a reader that went away.
fn closed_pipe(error: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(error), |error| error.source()).any(|error| {
        error
            .downcast_ref::<io::Error>()
            .is_some_and(|error| error.kind() == io::ErrorKind::BrokenPipe)
    })
}

async fn run(cli: Cli) -> CliResult {
    let url = cli
        .database_url
        .or_else(|| std::env::var("DATABASE_URL").ok())
        .filter(|url| !url.is_empty());
    let Some(url) = url else {
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
        Command::Tail(args) => tail::run(pool, args).await,
        Command::Fold(args) => fold::run(pool, args).await,
        Command::Subscriptions(args) => subscriptions::run(pool, args).await,
        Command::Status(args) => status::run(pool, args).await,
        Command::Retention(args) => retention::run(pool, args).await,
        Command::Grant(args) => grant::run(pool, args).await,
        Command::DeadLetters(args) => dead_letters::run(pool, args).await,
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
        .map_err(|_| "DATABASE_URL (or --database-url) is not a valid PostgreSQL URL")?
        .disable_statement_logging();
    // A refused connection is answered at once: the pool would retry it until the timeout.
    if let Err(why) = diagnose::reach(&options, timeout).await {
        return Err(format!(
            "cannot connect to the database {}: {why}",
            diagnose::place(&options)
        )
        .into());
    }
    let pooled = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(timeout)
        .connect_with(options.clone())
        .await;
    match pooled {
        Ok(pool) => match ordo::admin::keeps_sessions(&pool).await {
            Ok(true) => Ok(pool),
            Ok(false) => Err(format!(
                "the database at {} is reached through a transaction-mode pooler (PgBouncer \
                 pool_mode = transaction), where ordo's commands cannot keep a session: point \
                 DATABASE_URL (or --database-url) at the server itself or at a session-mode pool",
                diagnose::place(&options)
            )
            .into()),
            Err(error) => Err(format!(
                "cannot use the database at {}: {error}",
                diagnose::place(&options)
            )
            .into()),
        },
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
pub(crate) async fn interrupted() {
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
    fn the_retention_command_line_refuses_an_overflowing_keep() {
        let parsed = Cli::try_parse_from(["ordo", "retention", "--keep", "999999999999999d"]);
        let error = parsed.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("is not a duration"), "{error}");
    }
}
