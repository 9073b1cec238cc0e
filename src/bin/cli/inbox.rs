//! `ordo inbox`: the consumer inbox's failed messages, replays and watermarks.
//!
//! ```text
//! ordo inbox failed [--consumer C] [--json]      messages a consumer gave up on
//! ordo inbox replay ID [--consumer C]            run a failed message again
//! ordo inbox replay --all [--consumer C]         every failed message (of C)
//! ordo inbox watermarks [--consumer C] [--json]  watermark mode: how far each source is handled
//! ```

use std::fmt::Write as _;
use std::io::{self, Write};

use clap::Subcommand;
use ordo::admin::printable;
use ordo::inbox::{self, FailedMessage, Watermark};
use sqlx::PgPool;

type CliResult = Result<(), Box<dyn std::error::Error>>;

#[derive(clap::Args)]
pub(crate) struct InboxArgs {
    #[command(subcommand)]
    action: InboxAction,
}

#[derive(Subcommand)]
enum InboxAction {
    /// List failed messages (they reached their consumer's maximum attempts), oldest first.
    Failed {
        /// Only this consumer's.
        #[arg(long)]
        consumer: Option<String>,
        /// Print JSON (one object per message) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Set failed messages back to pending, attempts at zero. Each runs once, on the
    /// consumer's next `Inbox::run_pending` or on a redelivery of its id, whichever comes
    /// first.
    Replay {
        /// The message id (`ordo inbox failed`).
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        id: Option<String>,
        /// Every failed message (of --consumer, or of every consumer).
        #[arg(long)]
        all: bool,
        /// Only this consumer's.
        #[arg(long)]
        consumer: Option<String>,
    },
    /// List watermark-mode consumers' marks, one per source.
    Watermarks {
        /// Only this consumer's.
        #[arg(long)]
        consumer: Option<String>,
        /// Print JSON (one object per mark) instead of a table.
        #[arg(long)]
        json: bool,
    },
}

pub(crate) async fn run(pool: PgPool, args: InboxArgs) -> CliResult {
    let mut out = io::stdout().lock();
    match args.action {
        InboxAction::Failed { consumer, json } => {
            let failed = inbox::list_failed(&pool, consumer.as_deref()).await?;
            if json {
                return json_lines(&mut out, &failed);
            }
            write!(out, "{}", failed_table(&failed))?;
        }
        InboxAction::Replay { id, all, consumer } => {
            let replayed = match (id, all) {
                (Some(id), false) => inbox::replay(&pool, consumer.as_deref(), &id).await?,
                (None, true) => inbox::replay_all(&pool, consumer.as_deref()).await?,
                _ => return Err("give a message id or --all".into()),
            };
            eprintln!(
                "ordo: {replayed} message(s) set to pending; each runs on its consumer's next run_pending or redelivery"
            );
        }
        InboxAction::Watermarks { consumer, json } => {
            let marks = inbox::list_watermarks(&pool, consumer.as_deref()).await?;
            if json {
                return json_lines(&mut out, &marks);
            }
            write!(out, "{}", watermarks_table(&marks))?;
        }
    }
    Ok(())
}

fn json_lines(out: &mut impl Write, rows: &[impl serde::Serialize]) -> CliResult {
    for row in rows {
        writeln!(out, "{}", serde_json::to_string(row)?)?;
    }
    Ok(())
}

/// One line per failed message, safe for a terminal (ids, errors and names are sender text).
fn failed_table(failed: &[FailedMessage]) -> String {
    let mut out = format!(
        "{:<24} {:<38} {:>8} {:<20} ERROR\n",
        "CONSUMER", "ID", "ATTEMPTS", "FAILED AT"
    );
    for message in failed {
        let _ = writeln!(
            out,
            "{:<24} {:<38} {:>8} {:<20} {}",
            printable(&message.consumer),
            printable(&message.id),
            message.attempts,
            message.failed_at.format("%Y-%m-%d %H:%M:%S"),
            printable(message.error.as_deref().unwrap_or("-")),
        );
    }
    out
}

fn watermarks_table(marks: &[Watermark]) -> String {
    let mut out = format!(
        "{:<24} {:<24} {:>12} {:>8} LAST ERROR\n",
        "CONSUMER", "SOURCE", "POSITION", "ATTEMPTS"
    );
    for mark in marks {
        let _ = writeln!(
            out,
            "{:<24} {:<24} {:>12} {:>8} {}",
            printable(&mark.consumer),
            printable(&mark.source),
            mark.position,
            mark.attempts,
            printable(mark.last_error.as_deref().unwrap_or("-")),
        );
    }
    out
}
