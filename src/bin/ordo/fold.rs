//! `ordo fold`: a commit-lane sequencer until SIGINT or SIGTERM.

use std::time::Duration;

use ordo::{Outbox, OutboxConfig};
use sqlx::PgPool;

use crate::{CliResult, interrupted};

#[derive(clap::Args)]
pub(crate) struct FoldArgs {
    /// Seconds between progress lines on stderr: 1 to 86400 (a day), or 0 for none. Whole
    /// seconds, so no period floods the log as a sub-second one would.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    progress: u64,
}

pub(crate) async fn run(pool: PgPool, args: FoldArgs) -> CliResult {
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
