//! Settings that cannot work are refused where they are set up, with an error naming the
//! setting and its bound: intervals that would spin, flood the log or overflow the
//! clock's arithmetic, relay leases outside the subscriptions' bounds, and signing secrets
//! short enough to guess. The command line's refusals are checked through the `ordo` binary;
//! the library's through its public constructors, with the values at each bound accepted.
#![cfg(all(feature = "cli", feature = "http", feature = "nats"))]

use crate::common;

use std::process::{Command, Output};
use std::time::Duration;

use common::TestDb;
use ordo::inbox::{InboxConfig, MAX_REDELIVERY_DELAY, MAX_RETENTION, NatsInbox, Redelivery};
use ordo::relay::RelayConfig;
use ordo::relay::http::WebhookSink;
use ordo::{Error, Inbox, Keys, Outbox, OutboxConfig, RetentionConfig};
use serde_json::Value;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

const ORDO_BIN: &str = env!("CARGO_BIN_EXE_ordo");
const HOUR: Duration = Duration::from_secs(3600);

/// The setting an `InvalidConfig` names, and its reason; a panic for anything else.
fn refusal<T>(result: ordo::Result<T>) -> (&'static str, String) {
    match result {
        Err(Error::InvalidConfig { setting, reason }) => (setting, reason),
        Err(other) => panic!("expected an invalid config, got {other}"),
        Ok(_) => panic!("expected an invalid config, it was accepted"),
    }
}

/// A pool that never connects: every refusal here comes before the database is reached.
fn unreachable_pool() -> PgPool {
    PgPoolOptions::new()
        .max_connections(4)
        .connect_lazy("postgres://ordo@127.0.0.1:1/unreachable")
        .expect("a lazy pool")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_intervals_that_spin_or_overflow_are_refused_naming_the_setting() {
    let cases = [
        (
            OutboxConfig::default().resync_interval(Duration::ZERO),
            "gap_poll/resync_interval",
        ),
        (
            OutboxConfig::default()
                .resync_interval(ordo::MAX_RESYNC_INTERVAL + Duration::from_millis(1)),
            "resync_interval",
        ),
        (
            OutboxConfig::default().notify_debounce(Duration::from_secs(2)),
            "notify_debounce",
        ),
        (
            OutboxConfig::default().gap_fill_timeout(Duration::MAX),
            "gap_fill_timeout",
        ),
        (
            OutboxConfig::default().maintenance_interval(25 * HOUR),
            "maintenance_interval",
        ),
        (
            OutboxConfig::default().retention(RetentionConfig::new().retry_for(2 * HOUR)),
            "retention retry_for",
        ),
    ];
    for (config, expected) in cases {
        let (setting, reason) = refusal(Outbox::<Value>::new(unreachable_pool(), config).await);
        assert_eq!(setting, expected, "{reason}");
        assert!(
            reason.starts_with("must") || reason.contains("allowed"),
            "{reason}"
        );
    }
    let (_, reason) = refusal(
        Outbox::<Value>::new(
            unreachable_pool(),
            OutboxConfig::default().gap_fill_timeout(25 * HOUR),
        )
        .await,
    );
    assert!(reason.contains("24 hours"), "the bound is named: {reason}");

    // Each bound itself is accepted: the outbox starts.
    let db = TestDb::new().await;
    let at_the_bounds = OutboxConfig::default()
        .resync_interval(ordo::MAX_RESYNC_INTERVAL)
        .notify_debounce(Duration::from_secs(1))
        .gap_fill_timeout(ordo::MAX_GAP_FILL_TIMEOUT)
        .maintenance_interval(ordo::MAX_MAINTENANCE_INTERVAL)
        .retention(RetentionConfig::new().retry_for(ordo::MAX_RETRY_FOR));
    let outbox = Outbox::<Value>::new(db.pool.clone(), at_the_bounds)
        .await
        .expect("settings at their bounds are accepted");
    outbox.shutdown().await;
    let report = ordo::admin::plan_retention(
        &db.pool,
        &RetentionConfig::new().retry_for(ordo::MAX_RETRY_FOR + Duration::from_secs(1)),
    )
    .await;
    assert_eq!(refusal(report).0, "retention retry_for");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_lease_outside_the_subscriptions_bounds_or_a_zero_backoff_is_refused() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Value>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    let sink = || {
        WebhookSink::builder("http://127.0.0.1:9/in", b"a webhook secret".to_vec())
            .build()
            .expect("sink")
    };
    let relay = |config: RelayConfig| outbox.relay(config, sink(), |_| Keys::none());
    let too_long = RelayConfig::new("long").lease(ordo::MAX_LEASE + Duration::from_secs(1));
    let (setting, reason) = refusal(relay(too_long).await);
    assert_eq!(setting, "lease");
    assert!(reason.contains("100 ms to 24 hours"), "{reason}");
    let too_short = RelayConfig::new("short")
        .batch_size(1)
        .per_event_budget(Duration::from_millis(1))
        .batch_deadline(Duration::from_millis(1))
        .backoff(Duration::from_millis(1), Duration::from_millis(1))
        .lease(ordo::MIN_LEASE - Duration::from_millis(1));
    assert_eq!(refusal(relay(too_short).await).0, "lease");
    let zero = RelayConfig::new("spins").backoff(Duration::ZERO, Duration::from_secs(1));
    let (setting, reason) = refusal(relay(zero).await);
    assert_eq!(setting, "backoff");
    assert!(reason.contains("more than zero"), "{reason}");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM ordo.subscriptions")
        .fetch_one(&db.pool)
        .await
        .expect("count");
    assert_eq!(rows, 0, "nothing is created for a refused relay");
    outbox.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_settings_that_spin_or_never_end_are_refused_naming_the_setting() {
    let forever = InboxConfig::new("billing").retention(MAX_RETENTION + Duration::from_secs(1));
    let (setting, reason) = refusal(Inbox::new(unreachable_pool(), forever));
    assert_eq!(setting, "InboxConfig::retention");
    assert!(reason.contains("100 years"), "{reason}");
    let inbox = Inbox::new(
        unreachable_pool(),
        InboxConfig::new("billing").retention(MAX_RETENTION),
    )
    .expect("the longest retention is accepted");
    assert_eq!(
        refusal(inbox.spawn_purge(Duration::ZERO)).0,
        "Inbox::spawn_purge"
    );

    let nats = || NatsInbox::builder("nats://127.0.0.1:4222", "orders", "billing");
    let (setting, reason) = refusal(nats().ack_wait(ordo::MAX_LEASE * 2).build());
    assert_eq!(setting, "NatsInbox ack_wait");
    assert!(reason.contains("1 second to 24 hours"), "{reason}");
    let long = Redelivery::default().busy(MAX_REDELIVERY_DELAY + Duration::from_secs(1));
    let (setting, reason) = refusal(nats().redelivery(long).build());
    assert_eq!(setting, "NatsInbox redelivery");
    assert!(
        reason.contains("Redelivery::busy") && reason.contains("24 hours"),
        "{reason}"
    );
    let backoff = Redelivery::default().retry_backoff(Duration::from_secs(1), Duration::MAX);
    let (_, reason) = refusal(nats().redelivery(backoff).build());
    assert!(reason.contains("Redelivery::retry_backoff"), "{reason}");
    let at_the_bounds = Redelivery::default()
        .busy(MAX_REDELIVERY_DELAY)
        .retry_backoff(Duration::from_secs(1), MAX_REDELIVERY_DELAY);
    nats()
        .ack_wait(ordo::MAX_LEASE)
        .redelivery(at_the_bounds)
        .build()
        .expect("settings at their bounds are accepted");
}

/// Runs `ordo` with `args` and the environment `env`, against a database it never reaches
/// (each refusal comes first).
fn ordo(args: &[&str], env: &[(&str, &str)]) -> (Output, String) {
    let mut command = Command::new(ORDO_BIN);
    command
        .args(args)
        .env("DATABASE_URL", "postgres://ordo@127.0.0.1:1/unreachable")
        .env_remove("ORDO_RELAY_URL")
        .env_remove("ORDO_WEBHOOK_SECRET")
        .env_remove("RUST_LOG");
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().expect("run ordo");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output, stderr)
}

#[test]
fn the_command_line_refuses_a_progress_period_that_floods_the_log_or_never_comes() {
    let relay = |progress: &str| {
        ordo(
            &[
                "relay",
                "run",
                "orders",
                "--sink",
                "nats",
                "--url",
                "nats://127.0.0.1:4222",
                "--key-from",
                "none",
                "--progress",
                progress,
            ],
            &[],
        )
    };
    for period in ["1ns", "999ms", "25h"] {
        let (output, stderr) = relay(period);
        assert!(!output.status.success(), "--progress {period} was accepted");
        assert!(
            stderr.contains("--progress")
                && stderr.contains("1s to 24h")
                && stderr.contains("0 for none"),
            "{period}: {stderr}"
        );
        assert!(
            !stderr.contains("cannot connect"),
            "refused before connecting: {stderr}"
        );
    }
    // Accepted, it goes on to the database (which this test never gives it).
    let (output, stderr) = relay("1s");
    assert!(!output.status.success());
    assert!(!stderr.contains("--progress"), "{stderr}");

    let (output, stderr) = ordo(&["fold", "--progress", "86401"], &[]);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("--progress") && stderr.contains("0..=86400"),
        "{stderr}"
    );
}

#[test]
fn the_command_line_refuses_a_short_webhook_secret_naming_its_variable() {
    let args = [
        "relay",
        "run",
        "hooks",
        "--sink",
        "webhook",
        "--url",
        "https://h.example/in",
        "--key-from",
        "none",
    ];
    let (output, stderr) = ordo(&args, &[("ORDO_WEBHOOK_SECRET", "hunter2")]);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("ORDO_WEBHOOK_SECRET is 7 bytes") && stderr.contains("at least 16"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("hunter2"),
        "the secret is never shown: {stderr}"
    );
    let mut named = args.to_vec();
    named.extend(["--secret-env", "HOOKS_SECRET"]);
    let (_, stderr) = ordo(&named, &[("HOOKS_SECRET", "fifteen bytes!!")]);
    assert!(stderr.contains("HOOKS_SECRET is 15 bytes"), "{stderr}");
    let (_, stderr) = ordo(&named, &[("HOOKS_SECRET", "sixteen bytes!!!")]);
    assert!(!stderr.contains("bytes"), "16 bytes are enough: {stderr}");
}
