//! `ordo dead-letters`: list, retry or purge the events subscriptions gave up on.

use std::io::{self, Write};
use std::time::Duration;

use clap::Subcommand;
use ordo::admin;
use sqlx::PgPool;

use crate::output::json_lines;

use crate::CliResult;
use crate::parse::parse_duration;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct DeadLettersArgs {
    #[command(subcommand)]
    action: Option<DeadLetterAction>,
    /// What `list` takes, for the bare command that lists.
    #[command(flatten)]
    list: ListArgs,
}

/// The options of `ordo dead-letters [list]`.
#[derive(clap::Args)]
struct ListArgs {
    /// Only this subscription's.
    #[arg(long)]
    subscription: Option<String>,
    /// Print JSON (one object per dead letter) instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum DeadLetterAction {
    /// List dead letters, oldest first (the default).
    List(ListArgs),
    /// Hand a dead letter's event (or each of a subscription's) to its handler again, once.
    ///
    /// The runner of the subscription (serial or keyed, running and active) takes the request
    /// within a third of its lease; until then `ordo dead-letters` lists it as pending. The
    /// dead letter goes when the handler succeeds, and stays with the new error when not.
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

pub(crate) async fn run(pool: PgPool, args: DeadLettersArgs) -> CliResult {
    match args.action.unwrap_or(DeadLetterAction::List(args.list)) {
        DeadLetterAction::List(ListArgs { subscription, json }) => {
            let rows = admin::list_dead_letters(&pool, subscription.as_deref()).await?;
            let mut out = io::stdout().lock();
            if json {
                return Ok(json_lines(&mut out, &rows)?);
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
