//! `ordo subscriptions`: list them; pause, resume, reset, adopt, delete one; stalled keys and
//! their backlogs.

use std::io::{self, Write};

use clap::Subcommand;
use ordo::{CommitSequence, EventSequence, Ordering, admin};
use sqlx::PgPool;

use crate::CliResult;
use crate::output::json_lines;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct SubscriptionsArgs {
    #[command(subcommand)]
    action: Option<SubscriptionAction>,
    /// What `list` takes, for the bare command that lists.
    #[command(flatten)]
    list: ListArgs,
}

/// The options of `ordo subscriptions [list]`.
#[derive(clap::Args)]
struct ListArgs {
    /// Print JSON (one object per subscription) instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum SubscriptionAction {
    /// List every subscription and relay (the default).
    List(ListArgs),
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
    #[command(
        group = clap::ArgGroup::new("which").required(true).args(["key", "all"]),
        // clap puts a required group before the positionals it holds.
        override_usage = "ordo subscriptions retry-keys [OPTIONS] <NAME> <KEY|--all>"
    )]
    RetryKeys {
        name: String,
        /// The stalled key (`ordo subscriptions stalled NAME`).
        key: Option<String>,
        /// Every stalled key of the subscription.
        #[arg(long)]
        all: bool,
    },
    /// List a keyed subscription's or relay's stuck keys' backlogs.
    ///
    /// The events behind a stalled (parked) event wait there, out of the window, until it is
    /// retried (requeued): then they follow it, in order. Operators' skips and purges follow.
    Backlog {
        name: String,
        /// Print JSON (one object per key, then one per recorded action) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Drop the stalled (parked) event holding KEY, never delivered.
    ///
    /// The rest of the key's backlog goes on, in order. Recorded, with its position and id
    /// (`ordo subscriptions backlog NAME`).
    SkipStalled {
        name: String,
        /// The stalled key (`ordo subscriptions stalled NAME`); "" for an event with no key.
        key: String,
        /// Confirm: without it, nothing is dropped and the command says what would be.
        #[arg(long)]
        yes: bool,
    },
    /// Drop every event of KEY's backlog, never delivered.
    ///
    /// Its stalled event goes too, and the key's later events flow again. Recorded, with
    /// their positions and ids (`ordo subscriptions backlog NAME`).
    PurgeBacklog {
        name: String,
        /// The stuck key (`ordo subscriptions backlog NAME`).
        key: String,
        /// Confirm: without it, nothing is dropped and the command says what would be.
        #[arg(long)]
        yes: bool,
    },
    /// Assign a subscription or relay from before ordo recorded roles to the role that runs it.
    ///
    /// Until then only the owner (and operators) may run such a row; other roles are refused
    /// at start. Run as an operator.
    Adopt {
        name: String,
        /// The database role that runs it.
        #[arg(long)]
        role: String,
    },
    /// Delete a subscription's row (its dead letters stay until purged).
    Delete {
        name: String,
        /// Delete even while a runner holds a live lease (that runner then stands by).
        #[arg(long)]
        force: bool,
    },
}

pub(crate) async fn run(pool: PgPool, args: SubscriptionsArgs) -> CliResult {
    match args.action.unwrap_or(SubscriptionAction::List(args.list)) {
        SubscriptionAction::List(ListArgs { json }) => {
            let rows = admin::list_subscriptions(&pool).await?;
            let mut out = io::stdout().lock();
            if json {
                return Ok(json_lines(&mut out, &rows)?);
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
                return Ok(json_lines(&mut out, &stalled)?);
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
        SubscriptionAction::Backlog { name, json } => {
            let keys = admin::list_backlog(&pool, &name).await?;
            let actions = admin::backlog_actions(&pool, &name).await?;
            let mut out = io::stdout().lock();
            if json {
                json_lines(&mut out, &keys)?;
                return Ok(json_lines(&mut out, &actions)?);
            }
            write!(out, "{}", admin::backlog_table(&keys, &actions))?;
            Ok(())
        }
        SubscriptionAction::SkipStalled { name, key, yes } => {
            drop_backlog(&pool, &name, &key, yes, false).await
        }
        SubscriptionAction::PurgeBacklog { name, key, yes } => {
            drop_backlog(&pool, &name, &key, yes, true).await
        }
        SubscriptionAction::Adopt { name, role } => {
            admin::adopt_subscription(&pool, &name, &role).await?;
            eprintln!("ordo: {name:?} is run by role {role:?}");
            Ok(())
        }
        SubscriptionAction::Delete { name, force } => {
            admin::delete_subscription(&pool, &name, force).await?;
            eprintln!("ordo: subscription {name:?} deleted");
            Ok(())
        }
    }
}

/// `skip-stalled` (one stalled event) or `purge-backlog` (the key's whole backlog): without
/// `--yes`, says what it would drop and fails.
async fn drop_backlog(pool: &PgPool, name: &str, key: &str, yes: bool, purge: bool) -> CliResult {
    let shown = admin::printable(key);
    if !yes {
        let keys = admin::list_backlog(pool, name).await?;
        let Some(backlog) = keys.iter().find(|backlog| backlog.key == key) else {
            return Err(format!(
                "{name:?} has nothing in a backlog for key \"{shown}\": nothing to drop"
            )
            .into());
        };
        let what = if purge {
            format!(
                "all {} event(s) ({} bytes) of key \"{shown}\"'s backlog",
                backlog.events, backlog.bytes
            )
        } else {
            format!(
                "the stalled event of key \"{shown}\" (its {} other event(s) go on)",
                backlog.events.saturating_sub(1)
            )
        };
        return Err(format!(
            "this drops {what} of {name:?} without delivering them; run it again with --yes to do so"
        )
        .into());
    }
    let done = if purge {
        admin::purge_backlog(pool, name, key).await?
    } else {
        admin::skip_stalled_event(pool, name, key).await?
    };
    eprintln!(
        "ordo: {} of {name:?}, key \"{shown}\": {} event(s) dropped, never delivered (positions {:?}); recorded, see `ordo subscriptions backlog {name}`",
        done.action,
        done.positions.len(),
        done.positions,
    );
    Ok(())
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
