//! `ordo retention`: the partitions, and what retention would do; `--apply` does it.

use std::io::{self, Write};
use std::time::Duration;

use ordo::admin;
use sqlx::PgPool;

use crate::output::json_lines;

use crate::CliResult;
use crate::parse::{ahead_in_range, parse_duration};

#[derive(clap::Args)]
pub(crate) struct RetentionArgs {
    /// Drop partitions sealed longer ago than this: every event in them committed at least
    /// that long ago (e.g. 30d, 12h, 45m, 90s, "1h 30m"). Without it nothing is dropped;
    /// partitions ahead are still created with --apply.
    #[arg(long, value_parser = parse_duration)]
    keep: Option<Duration>,
    /// Partitions to keep ready above the head (1 to ordo::MAX_AHEAD).
    #[arg(long, default_value_t = 2, value_parser = ahead_in_range)]
    ahead: u32,
    /// Drop even what subscriptions still need (they will halt). Never splits a transaction.
    #[arg(long)]
    force: bool,
    /// Create, fold and drop; without it, only show the plan.
    #[arg(long)]
    apply: bool,
    /// How long to keep retrying a partition whose lock is busy (each try waits 100 ms).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    retry_for: Duration,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(pool: PgPool, args: RetentionArgs) -> CliResult {
    let mut config = ordo::RetentionConfig::new()
        .ahead(args.ahead)
        .force(args.force)
        .retry_for(args.retry_for);
    if let Some(keep) = args.keep {
        config = config.keep(keep);
    }
    let report = if args.apply {
        admin::run_retention(&pool, &config).await?
    } else {
        admin::plan_retention(&pool, &config).await?
    };
    if let Some(warning) = &report.warning {
        // On stderr too, so that a cron job's mail carries it.
        eprintln!("ordo retention: WARNING: {warning}");
    }
    let mut out = io::stdout().lock();
    if args.json {
        json_lines(&mut out, std::slice::from_ref(&report))?;
        return Ok(());
    }
    write!(out, "{}", admin::retention_table(&report, args.apply))?;
    Ok(())
}
