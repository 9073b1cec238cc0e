//! `ordo status`: positions, lag, stalls and dead letters, as text, JSON or Prometheus.

use std::io::{self, Write};
use std::time::Duration;

use ordo::admin;
use sqlx::PgPool;

use crate::output::json_line;
use crate::{CliResult, interrupted};

#[derive(clap::Args)]
pub(crate) struct StatusArgs {
    /// Print one JSON object.
    #[arg(long, conflicts_with = "prometheus")]
    json: bool,
    /// Print the figures in Prometheus text exposition format.
    #[arg(long)]
    prometheus: bool,
    /// Refresh every this many seconds until interrupted.
    #[arg(long, value_name = "SECONDS", conflicts_with = "check")]
    watch: Option<f64>,
    /// For monitoring: exit non-zero when anything is stuck (a lane stall, a halted
    /// subscription or relay, a stalled key or parked event, a sink down, an inbox mark held),
    /// or a consumer's stuck keys' backlogs pass --max-backlog events.
    #[arg(long)]
    check: bool,
    /// With --check: the most events a consumer's backlogs may hold.
    #[arg(long, value_name = "EVENTS", requires = "check")]
    max_backlog: Option<u64>,
}

pub(crate) async fn run(pool: PgPool, args: StatusArgs) -> CliResult {
    let watch = match args.watch {
        None => None,
        Some(every) => Some(
            Duration::try_from_secs_f64(every)
                .ok()
                .filter(|d| d.as_secs_f64() >= 0.1)
                .ok_or("--watch takes a number of seconds, at least 0.1")?,
        ),
    };
    loop {
        let status = admin::status(&pool).await?;
        let text = if args.json {
            format!("{}\n", json_line(&status)?)
        } else if args.prometheus {
            admin::prometheus_text(&status)
        } else {
            admin::status_table(&status)
        };
        let mut out = io::stdout().lock();
        if args.watch.is_some() && !args.json && !args.prometheus {
            // Clear the screen and go home, as `watch` does.
            write!(out, "\x1b[2J\x1b[H")?;
        }
        write!(out, "{text}")?;
        out.flush()?;
        drop(out);
        let Some(every) = watch else {
            return if args.check {
                check(&status, args.max_backlog)
            } else {
                Ok(())
            };
        };
        tokio::select! {
            _ = interrupted() => return Ok(()),
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// `--check`: an error (a non-zero exit) naming what is stuck, or which backlog is too big.
fn check(status: &ordo::OutboxStatus, max_backlog: Option<u64>) -> CliResult {
    let mut failing = status.stuck();
    if let Some(limit) = max_backlog {
        for sub in &status.subscriptions {
            let events = sub.backlog.map_or(0, |backlog| backlog.events);
            if events > limit {
                failing.push(format!(
                    "\"{}\" holds {events} events in its stuck keys' backlogs, over --max-backlog {limit}",
                    admin::printable(&sub.name)
                ));
            }
        }
    }
    match failing.first() {
        None => Ok(()),
        Some(first) => Err(format!(
            "status check failed: {} thing(s) stuck or over a limit; the first: {first}",
            failing.len()
        )
        .into()),
    }
}
