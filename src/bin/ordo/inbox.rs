//! `ordo inbox`: the consumer inbox's failed messages, replays and watermarks.
//!
//! ```text
//! ordo inbox [--consumer C] [--json]            the watermarks, then the failed messages
//! ordo inbox failed [--consumer C] [--json]      messages a consumer gave up on
//! ordo inbox replay ID [--consumer C]            run a failed message again
//! ordo inbox replay --all [--consumer C]         every failed message (of C)
//! ordo inbox watermarks [--consumer C] [--json]  watermark mode: how far each source is handled,
//!                                                and a gap it waits on
//! ordo inbox set-watermark CONSUMER SOURCE POSITION [--route R] [--create]
//!                                                move a mark (past a position that never comes)
//! ordo inbox adopt CONSUMER --role ROLE          assign a consumer from before roles were
//!                                                recorded to the role that receives for it
//! ```

use std::io::{self, Write};

use clap::Subcommand;
use ordo::admin::{self, printable};
use ordo::inbox;
use sqlx::PgPool;

use crate::output::json_lines;

type CliResult = Result<(), Box<dyn std::error::Error>>;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct InboxArgs {
    #[command(subcommand)]
    action: Option<InboxAction>,
    /// Only this consumer's watermarks and failed messages.
    #[arg(long)]
    consumer: Option<String>,
    /// Print one JSON object (`{"watermarks": [...], "failed": [...]}`) instead of tables.
    #[arg(long)]
    json: bool,
}

/// What the bare `ordo inbox --json` prints.
#[derive(serde::Serialize)]
struct Everything {
    watermarks: Vec<inbox::Watermark>,
    failed: Vec<inbox::FailedMessage>,
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
    /// Set a failed message (or every one, with --all) back to pending, attempts at zero.
    ///
    /// Each runs once, on the consumer's next `Inbox::run_pending` or on a redelivery of its
    /// id, whichever comes first.
    #[command(group = clap::ArgGroup::new("which").required(true).args(["id", "all"]))]
    Replay {
        /// The message id (`ordo inbox failed`).
        id: Option<String>,
        /// Every failed message (of --consumer, or of every consumer).
        #[arg(long)]
        all: bool,
        /// Only this consumer's.
        #[arg(long)]
        consumer: Option<String>,
    },
    /// List watermark-mode consumers' marks, one per source, with the gap each waits on.
    Watermarks {
        /// Only this consumer's.
        #[arg(long)]
        consumer: Option<String>,
        /// Print JSON (one object per mark) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Move a watermark consumer's mark for a source: it handles POSITION + 1 next.
    ///
    /// Ends a wait on a gap that will never fill (the sender skipped those positions); moving
    /// it back handles the messages above again as they are redelivered.
    SetWatermark {
        consumer: String,
        /// The sending ordo, as `ordo inbox watermarks` shows it.
        source: String,
        /// The last position to count as handled.
        #[arg(value_parser = crate::parse::parse_position)]
        position: u64,
        /// The source's route whose mark to move (the ROUTE of `ordo inbox watermarks`); by
        /// default the source's one route (`-`).
        #[arg(long)]
        route: Option<String>,
        /// Create the mark if the consumer has none for SOURCE yet (a consumer joining a
        /// source whose history it does not need); without it, an unknown pair is refused.
        #[arg(long)]
        create: bool,
    },
    /// Assign an inbox consumer to the role that receives for it.
    ///
    /// For a consumer whose rows predate ordo's record of roles, when the upgrade could not
    /// tell its role: until then only the owner (and operators) may write its rows. Run as an
    /// operator.
    Adopt {
        consumer: String,
        /// The database role that receives for it.
        #[arg(long)]
        role: String,
    },
}

pub(crate) async fn run(pool: PgPool, args: InboxArgs) -> CliResult {
    let mut out = io::stdout().lock();
    let Some(action) = args.action else {
        let consumer = args.consumer.as_deref();
        let marks = inbox::list_watermarks(&pool, consumer).await?;
        let failed = inbox::list_failed(&pool, consumer).await?;
        if args.json {
            let everything = Everything {
                watermarks: marks,
                failed,
            };
            return Ok(json_lines(&mut out, &[everything])?);
        }
        writeln!(out, "watermarks (ordo inbox watermarks):")?;
        write!(out, "{}", admin::watermarks_table(&marks))?;
        writeln!(out, "\nfailed messages (ordo inbox failed):")?;
        write!(out, "{}", admin::inbox_failed_table(&failed))?;
        return Ok(());
    };
    match action {
        InboxAction::Failed { consumer, json } => {
            let failed = inbox::list_failed(&pool, consumer.as_deref()).await?;
            if json {
                return Ok(json_lines(&mut out, &failed)?);
            }
            write!(out, "{}", admin::inbox_failed_table(&failed))?;
        }
        InboxAction::Replay { id, all, consumer } => {
            let replayed = match (id, all) {
                (Some(id), false) => inbox::replay(&pool, consumer.as_deref(), &id).await?,
                (None, true) => inbox::replay_all(&pool, consumer.as_deref()).await?,
                _ => return Err("give a message id or --all, not both".into()),
            };
            eprintln!(
                "ordo: {replayed} message(s) set to pending; each runs on its consumer's next run_pending or redelivery"
            );
        }
        InboxAction::Watermarks { consumer, json } => {
            let marks = inbox::list_watermarks(&pool, consumer.as_deref()).await?;
            if json {
                return Ok(json_lines(&mut out, &marks)?);
            }
            write!(out, "{}", admin::watermarks_table(&marks))?;
        }
        InboxAction::SetWatermark {
            consumer,
            source,
            position,
            route,
            create,
        } => {
            let route = route.unwrap_or_default();
            set_watermark(&pool, &consumer, (&source, &route), position, create).await?;
            let on = if route.is_empty() {
                String::new()
            } else {
                format!(" route {:?}", printable(&route))
            };
            eprintln!(
                "ordo: the mark of consumer {:?} for source {:?}{on} is {position}; it handles what follows it on the route next",
                printable(&consumer),
                printable(&source),
            );
        }
        InboxAction::Adopt { consumer, role } => {
            inbox::adopt_consumer(&pool, &consumer, &role).await?;
            eprintln!(
                "ordo: inbox consumer {:?} belongs to role {:?}",
                printable(&consumer),
                printable(&role)
            );
        }
    }
    Ok(())
}

/// Moves a mark, refusing a (consumer, source) pair that has none unless `create`: a typo
/// would otherwise make a mark nobody reads, and the real one would stay where it was.
async fn set_watermark(
    pool: &PgPool,
    consumer: &str,
    (source, route): (&str, &str),
    position: u64,
    create: bool,
) -> CliResult {
    if !create {
        let marks = match inbox::list_watermarks(pool, Some(consumer)).await {
            Ok(marks) => marks,
            Err(ordo::Error::UnknownConsumer { .. }) => Vec::new(),
            Err(error) => return Err(error.into()),
        };
        if !marks
            .iter()
            .any(|mark| mark.source == source && mark.route == route)
        {
            let known: Vec<String> = marks
                .iter()
                .map(|mark| match mark.route.as_str() {
                    "" => format!("{:?}", printable(&mark.source)),
                    route => format!("{:?} route {:?}", printable(&mark.source), printable(route)),
                })
                .collect();
            let known = if known.is_empty() {
                "it has no mark of any source".to_owned()
            } else {
                format!("its sources: {}", known.join(", "))
            };
            let which = if route.is_empty() {
                format!("source {source:?}")
            } else {
                format!("source {source:?} route {route:?}")
            };
            return Err(format!(
                "consumer {consumer:?} has no mark for {which} ({known}); pass --create to make one"
            )
            .into());
        }
    }
    inbox::set_route_watermark(pool, consumer, source, route, position).await?;
    Ok(())
}
