//! `ordo grant`: least-privilege roles.

use ordo::admin;
use sqlx::PgPool;

use crate::CliResult;

#[derive(clap::Args)]
#[command(group = clap::ArgGroup::new("roles").required(true).multiple(true))]
pub(crate) struct GrantArgs {
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

pub(crate) async fn run(pool: PgPool, args: GrantArgs) -> CliResult {
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
