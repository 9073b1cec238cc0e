//! The maintainer task of an [`Outbox`](crate::Outbox): runs retention every interval, and at
//! once when the head eats into the partitions ahead; every interval it also removes secret
//! payload keys from the events every reader has passed (`ops::secrets`).
//!
//! It takes one pooled connection at a time (see [`run_retention`]), so it never holds one
//! while waiting for another. A role that may not create tables (SQLSTATE 42501) is told once,
//! clearly, that partitions must be made by an operator role; the outbox goes on, and the
//! maintainer keeps watching the room ahead so that it can warn before the partitions run out.
//! With maintenance turned off it only watches.

use std::time::Duration;

use sqlx::PgPool;
use tokio::time::Instant;

use super::{
    INSUFFICIENT_PRIVILEGE, RetentionConfig, RetentionReport, plan_retention, run_retention,
    sqlstate,
};
use crate::task::StopSignal;

/// Between full runs, a cheap look at the head: a burst that eats into the partitions ahead
/// triggers a run at once instead of waiting out the interval.
const LOOK: Duration = Duration::from_millis(250);
/// The least time between two warnings about the same shortage.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// The maintainer's memory between looks.
struct Watch {
    /// (covered until, partition size) after the last run.
    covered: Option<(u64, u64)>,
    /// The role was refused DDL: only a scheduled run tries again, silently.
    denied: bool,
    last_warning: Option<Instant>,
}

/// `create`: whether this outbox may create and drop partitions (`partition_maintenance`).
pub(crate) async fn maintain(
    pool: PgPool,
    config: RetentionConfig,
    every: Duration,
    create: bool,
    mut stop: StopSignal,
) {
    let mut watch = Watch {
        covered: None,
        denied: false,
        last_warning: None,
    };
    let mut next_run = Instant::now();
    loop {
        let due = Instant::now() >= next_run;
        let crowded = create && !watch.denied && crowded(&pool, &config, watch.covered).await;
        if due || crowded {
            let outcome = if create {
                run_retention(&pool, &config).await
            } else {
                plan_retention(&pool, &config).await
            };
            match outcome {
                Ok(report) => watch.ran(&report, create),
                Err(error) if sqlstate(&error).as_deref() == Some(INSUFFICIENT_PRIVILEGE) => {
                    if watch.denied {
                        tracing::debug!("partition maintenance still not allowed for this role");
                    } else {
                        tracing::warn!(
                            %error,
                            "this outbox's database role may not create or drop partitions of ordo.events: \
                             partitions must be made by an operator role that owns ordo.events \
                             (`ordo retention --apply`, from cron say). This outbox goes on and warns when \
                             partitions run short; OutboxConfig::partition_maintenance(false) stops it trying"
                        );
                    }
                    watch.denied = true;
                    if let Ok(report) = plan_retention(&pool, &config).await {
                        watch.ran(&report, false);
                    }
                }
                Err(error) => tracing::warn!(%error, "partition maintenance failed; will retry"),
            }
            if due {
                // Whatever the role may do with partitions: the scrub is a function it is
                // granted.
                crate::ops::secrets::maintain(&pool, &stop).await;
            }
            next_run = Instant::now() + every;
        }
        tokio::select! {
            biased;
            _ = stop.stopped() => return,
            _ = tokio::time::sleep(LOOK.min(every)) => {}
        }
    }
}

/// Whether a run would create a partition now: the head came within `ahead` partitions of
/// where the partitions end.
async fn crowded(pool: &PgPool, config: &RetentionConfig, covered: Option<(u64, u64)>) -> bool {
    let Some((until, size)) = covered else {
        return false;
    };
    match crate::insert_lane::heads::head(pool).await {
        Ok(head) => head + u64::from(config.ahead) * size >= until,
        Err(_) => false,
    }
}

impl Watch {
    fn ran(&mut self, report: &RetentionReport, applied: bool) {
        self.covered = Some((report.covered_until, report.partition_size));
        if applied && self.denied {
            self.denied = false;
            tracing::info!("partition maintenance is allowed again for this outbox's role");
        }
        let changed =
            !report.created.is_empty() || !report.folded.is_empty() || !report.dropped.is_empty();
        if changed {
            tracing::info!(
                created = ?report.created, folded = ?report.folded, dropped = ?report.dropped,
                "partitions maintained"
            );
        }
        let Some(warning) = &report.warning else {
            self.last_warning = None;
            return;
        };
        if self
            .last_warning
            .is_none_or(|at| at.elapsed() >= WARN_EVERY)
        {
            tracing::warn!(
                head = report.head,
                partitions_ahead = report.partitions_ahead,
                default_rows = report.default_rows,
                "{warning}"
            );
            self.last_warning = Some(Instant::now());
        }
    }
}
