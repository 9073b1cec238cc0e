//! `ordo secrets`: the payload keys removed from stored events once every subscription and
//! relay has passed them (`ordo.secret_keys`).
//!
//! ```text
//! ordo secrets [list] [--json]                    the secret keys, every-type ones first
//! ordo secrets add KEY... [--type TYPE]           name keys secret (for TYPE, or every type)
//! ordo secrets remove KEY... [--type TYPE]        stop treating them as secret
//! ordo secrets scrub                              remove them from passed events now
//! ```

use std::io::{self, Write};

use clap::Subcommand;
use ordo::admin;
use sqlx::PgPool;

use crate::output::json_lines;

type CliResult = Result<(), Box<dyn std::error::Error>>;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct SecretsArgs {
    #[command(subcommand)]
    action: Option<SecretsAction>,
    /// What `list` takes, for the bare command that lists.
    #[command(flatten)]
    list: ListArgs,
}

/// The options of `ordo secrets [list]`.
#[derive(clap::Args)]
struct ListArgs {
    /// Print JSON (one object per key) instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum SecretsAction {
    /// List the secret payload keys (the default).
    List(ListArgs),
    /// Name top-level payload keys secret.
    ///
    /// They are removed from a stored event once every subscription and relay has passed it
    /// (the history already passed included).
    Add {
        #[arg(required = true)]
        keys: Vec<String>,
        /// Only for events of this type (default: every type).
        #[arg(long = "type", value_name = "TYPE")]
        event_type: Option<String>,
    },
    /// Stop treating keys as secret (payloads already scrubbed stay so).
    Remove {
        #[arg(required = true)]
        keys: Vec<String>,
        /// The keys named for this type (default: the every-type ones).
        #[arg(long = "type", value_name = "TYPE")]
        event_type: Option<String>,
    },
    /// Remove the secret keys from every event all readers passed, now.
    ///
    /// A running Outbox does it every maintenance interval.
    Scrub,
}

pub(crate) async fn run(pool: PgPool, args: SecretsArgs) -> CliResult {
    match args.action.unwrap_or(SecretsAction::List(args.list)) {
        SecretsAction::List(ListArgs { json }) => {
            let secrets = admin::list_secret_keys(&pool).await?;
            let mut out = io::stdout().lock();
            if json {
                return Ok(json_lines(&mut out, &secrets)?);
            }
            write!(out, "{}", admin::secret_keys_table(&secrets))?;
            Ok(())
        }
        SecretsAction::Add { keys, event_type } => {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            let added = admin::add_secret_keys(&pool, event_type.as_deref(), &keys).await?;
            eprintln!("ordo: {added} secret keys added");
            Ok(())
        }
        SecretsAction::Remove { keys, event_type } => {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            let removed = admin::remove_secret_keys(&pool, event_type.as_deref(), &keys).await?;
            if removed == 0 {
                let scope = event_type.as_deref().map_or_else(
                    || "of every type".to_owned(),
                    |t| format!("for type {:?}", admin::printable(t)),
                );
                return Err(format!(
                    "no secret key {} is named {scope}: `ordo secrets` lists them",
                    admin::printable(&format!("{keys:?}"))
                )
                .into());
            }
            eprintln!("ordo: {removed} secret keys removed");
            Ok(())
        }
        SecretsAction::Scrub => {
            let report = admin::scrub_secrets(&pool).await?;
            match report.scrubbed_below {
                Some(below) => eprintln!(
                    "ordo: {} events scrubbed; every event below sequence {below} is",
                    report.rewritten
                ),
                None => eprintln!("ordo: nothing to scrub: no secret keys are configured"),
            }
            Ok(())
        }
    }
}
