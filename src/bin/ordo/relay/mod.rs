//! `ordo relay`: a relay run standalone, and its parked events, requeued or replayed. A relay
//! keeps its position in `ordo.subscriptions` under its name, and its parked events are its
//! stalled keys, so the operator's commands are the subscription functions under the names an
//! operator of a relay looks for.
//!
//! ```text
//! ordo relay [list] [--json]                  the relays (rows of kind relay), as `ordo subscriptions`
//! ordo relay run NAME --sink nats|rabbitmq|webhook|kafka --key-from SOURCE [...] [--config FILE]
//!                                             a relay until SIGINT/SIGTERM (see relay_run.rs)
//! ordo relay parked NAME [--json]             parked events, by key, with their errors
//! ordo relay requeue NAME KEY | --all         deliver the parked event of KEY (or every one) again
//! ordo relay replay NAME --from POSITION      deliver again everything from POSITION on
//! ordo relay resume NAME                      run a halted (or paused) relay again
//! ordo relay attempts NAME POSITION|EVENT-ID [--json]
//!                                             was it delivered, and its failed attempts
//! ```

use std::future::Future;
use std::io::{self, Write};

use clap::Subcommand;
use ordo::admin;
use ordo::relay::{RelayEvent, RelayEventState};
use ordo::{CommitSequence, EventSequence, Ordering, Position, RunStatus};
use sqlx::PgPool;

use crate::output::json_lines;

mod keys;
mod routing;
mod run;
mod settings;
mod sinks;

type CliResult = Result<(), Box<dyn std::error::Error>>;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct RelayArgs {
    #[command(subcommand)]
    action: Option<RelayAction>,
    /// What `list` takes, for the bare command that lists.
    #[command(flatten)]
    list: ListArgs,
}

/// The options of `ordo relay [list]`.
#[derive(clap::Args)]
struct ListArgs {
    /// Print JSON (one object per relay) instead of a table.
    #[arg(long)]
    json: bool,
}

impl RelayArgs {
    /// Whether this is `ordo relay run`, which logs its progress by default.
    pub(crate) fn runs_a_relay(&self) -> bool {
        matches!(self.action, Some(RelayAction::Run(_)))
    }
}

#[derive(Subcommand)]
enum RelayAction {
    /// List the relays (the default), as `ordo subscriptions` shows them.
    List(ListArgs),
    /// Run a relay until SIGINT or SIGTERM.
    ///
    /// It delivers every event of `ordo.events` (however it was written, plain SQL included)
    /// to NATS JetStream, RabbitMQ, Kafka or a webhook, at least once, the event id as the message
    /// id, in order per key. Settings by flags or --config FILE (flags win); secrets only from
    /// the environment. Any number of processes may run the same relay: one delivers, the
    /// others stand by.
    Run(Box<run::RunArgs>),
    /// List a relay's parked events (one line per key they hold), oldest first.
    Parked {
        name: String,
        /// Print JSON (one object per key) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Deliver the parked event holding KEY again (or every parked event, with --all).
    ///
    /// Its attempts count from zero; the events waiting behind it follow in order.
    #[command(
        group = clap::ArgGroup::new("which").required(true).args(["key", "all"]),
        // clap puts a required group before the positionals it holds.
        override_usage = "ordo relay requeue [OPTIONS] <NAME> <KEY|--all>"
    )]
    Requeue {
        name: String,
        /// The key (`ordo relay parked NAME`).
        key: Option<String>,
        /// Every parked event of the relay.
        #[arg(long)]
        all: bool,
    },
    /// Deliver again every event from POSITION (on the relay's lane) on.
    ///
    /// Receivers deduplicate by message id, so only what they lost takes effect.
    Replay {
        name: String,
        /// The first position to deliver again (at least 1).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        from: u64,
    },
    /// Run a halted (or paused) relay again, clearing its last error.
    ///
    /// A relay halts when its position is below the retention floor (retention dropped the
    /// events it needs): first `replay --from` the floor its error names, then resume.
    Resume { name: String },
    /// Was an event delivered, and if not, why.
    ///
    /// Where it stands now (delivered, parked, failing, waiting) and its failed attempts (the
    /// newest 20), each with its time, error, and the host and pid of the process that sent
    /// it.
    Attempts {
        name: String,
        /// The event's position on the relay's lane (`ordo relay parked NAME`), or its id.
        event: String,
        /// Print JSON (one object) instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `args`, connecting with `database` only once the arguments are found sound: a
/// standalone relay's settings are refused before any connection is made.
pub(crate) async fn run<D>(database: D, args: RelayArgs) -> CliResult
where
    D: Future<Output = Result<PgPool, Box<dyn std::error::Error>>>,
{
    let action = args.action.unwrap_or(RelayAction::List(args.list));
    if let RelayAction::Run(run) = action {
        let plan = run.plan()?;
        return run::serve(database.await?, plan).await;
    }
    let pool = database.await?;
    let relays = admin::list_subscriptions(&pool).await?;
    let named = |name: &str| relay_named(&relays, name);
    match action {
        RelayAction::Run(_) => Ok(()),
        RelayAction::List(ListArgs { json }) => {
            let relays: Vec<_> = relays
                .into_iter()
                .filter(|row| row.kind.as_deref() != Some("subscription"))
                .collect();
            let mut out = io::stdout().lock();
            if json {
                return Ok(json_lines(&mut out, &relays)?);
            }
            write!(out, "{}", admin::subscriptions_table(&relays))?;
            Ok(())
        }
        RelayAction::Parked { name, json } => {
            named(&name)?;
            let parked = admin::list_stalled_keys(&pool, &name).await?;
            let mut out = io::stdout().lock();
            if json {
                return Ok(json_lines(&mut out, &parked)?);
            }
            write!(out, "{}", admin::stalled_keys_table(&parked))?;
            Ok(())
        }
        RelayAction::Requeue { name, key, all: _ } => {
            named(&name)?;
            let asked = admin::retry_stalled_keys(&pool, &name, key.as_deref()).await?;
            eprintln!("ordo: {asked} parked events of relay {name:?} requeued");
            Ok(())
        }
        RelayAction::Replay { name, from } => replay(&pool, &name, named(&name)?, from).await,
        RelayAction::Resume { name } => {
            named(&name)?;
            admin::resume_subscription(&pool, &name).await?;
            eprintln!("ordo: relay {name:?} resumed");
            Ok(())
        }
        RelayAction::Attempts { name, event, json } => {
            named(&name)?;
            attempts(&pool, &name, &event, json).await
        }
    }
}

/// `ordo relay replay NAME --from FROM`: the relay `row` moved back to deliver again from
/// `from` on its lane.
async fn replay(pool: &PgPool, name: &str, row: &ordo::SubscriptionStatus, from: u64) -> CliResult {
    let to = from - 1;
    let position = match row.lane {
        Ordering::Commit => Position::Commit(CommitSequence::new(to)),
        _ => Position::Insert(EventSequence::new(to)),
    };
    match admin::reset_subscription(pool, name, position, false).await {
        Ok(()) => {}
        // The library answers for `subscriptions reset --to`: say it in replay's terms.
        Err(ordo::Error::PastHead { lane, head, .. }) => {
            return Err(format!(
                "relay {name:?} has nothing to deliver from {lane} position {from}: its lane ends at {head}; --from takes 1 to {head}"
            )
            .into());
        }
        Err(error) => return Err(error.into()),
    }
    eprintln!(
        "ordo: relay {name:?} delivers again from {} position {from}",
        row.lane
    );
    if row.status != RunStatus::Active {
        eprintln!(
            "ordo: relay {name:?} is {}: `ordo relay resume {name}` runs it again",
            row.status
        );
    }
    Ok(())
}

/// The relay `name` among the rows, or why not: no such row, or a subscription's (which the
/// relay commands would move as if it were a relay's).
fn relay_named<'a>(
    rows: &'a [ordo::SubscriptionStatus],
    name: &str,
) -> Result<&'a ordo::SubscriptionStatus, Box<dyn std::error::Error>> {
    let Some(row) = rows.iter().find(|row| row.name == name) else {
        return Err(format!(
            "no relay named {:?} in ordo.subscriptions (`ordo relay` lists them)",
            admin::printable(name)
        )
        .into());
    };
    if row.kind.as_deref() == Some("subscription") {
        return Err(format!(
            "{:?} is a subscription, not a relay: use `ordo subscriptions` (stalled, retry-keys, reset, resume)",
            admin::printable(name)
        )
        .into());
    }
    Ok(row)
}

/// `ordo relay attempts`: the event by position or id, where it stands, its attempts.
async fn attempts(pool: &PgPool, name: &str, event: &str, json: bool) -> CliResult {
    let which = match (event.parse::<u64>(), event.parse::<uuid::Uuid>()) {
        (Ok(position), _) => RelayEvent::Position(position),
        (_, Ok(id)) => RelayEvent::Id(id),
        _ => {
            return Err(format!(
                "{}: neither a position nor an event id",
                admin::printable(&format!("{event:?}"))
            )
            .into());
        }
    };
    let found = admin::relay_attempts(pool, name, which).await?;
    let mut out = io::stdout().lock();
    if json {
        json_lines(&mut out, std::slice::from_ref(&found))?;
        return Ok(());
    }
    let id = found
        .event_id
        .map_or_else(|| "(not stored)".to_owned(), |id| id.to_string());
    let since = found
        .since
        .map_or_else(String::new, |at| format!(" since {}", at.to_rfc3339()));
    let state = match found.state {
        RelayEventState::Delivered => "delivered",
        RelayEventState::Parked => "parked",
        RelayEventState::Failing => "failing, tried again",
        RelayEventState::Waiting => "not delivered yet (not sent, or in flight)",
        RelayEventState::Refused => "refused, never sent (an earlier event has its id)",
        RelayEventState::Backlogged => {
            "in its key's backlog, behind a parked event (sent in order once that one is requeued)"
        }
        _ => "unknown",
    };
    writeln!(
        out,
        "relay {}, {} position {}, event {id}: {state}{since}",
        admin::printable(&format!("{name:?}")),
        found.position.lane(),
        found.position.get()
    )?;
    if let Some((first, others)) = found.id_holders.split_first() {
        let others: Vec<String> = others.iter().map(u64::to_string).collect();
        writeln!(
            out,
            "{} events carry this id, at sequences {first} (the one relays send) and {}",
            found.id_holders.len(),
            others.join(", ")
        )?;
    }
    if found.attempts.is_empty() {
        writeln!(out, "no failed attempt recorded")?;
        return Ok(());
    }
    writeln!(
        out,
        "{:>7}  {:<32}  {:<20}  {:>7}  ERROR",
        "ATTEMPT", "FAILED AT", "HOST", "PID"
    )?;
    for attempt in &found.attempts {
        let parked = if attempt.parked { " (parked)" } else { "" };
        writeln!(
            out,
            "{:>7}  {:<32}  {:<20}  {:>7}  {}{parked}",
            attempt.attempt,
            attempt.failed_at.to_rfc3339(),
            admin::printable(&attempt.host),
            attempt.pid,
            admin::printable(&attempt.error)
        )?;
    }
    Ok(())
}
