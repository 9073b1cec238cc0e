//! Secrets do not outlive delivery: payload keys named secret (a password-reset URL, an
//! invitation token) are removed from the stored events once every reader has passed them.
//!
//! The configuration is a table, `ordo.secret_keys` (an event type, or NULL for every type, and
//! a top-level payload key), so applications that write `ordo.events` from other languages
//! share it. The work is one SQL function, `ordo.scrub_secrets` (migration
//! `20261202000100_secret_keys`), that each call advances by one bounded step: it removes the
//! keys from the events below a cursor's next stop, where the stop is never past
//! `ordo.needed_from()`, the lowest event sequence the sequencer or any subscription or relay
//! still needs (the same reckoning retention uses: a commit-lane position is mapped to event
//! sequences through the commit log). A relay's parked event is above its watermark, so it
//! keeps its secrets until it is requeued and delivered.
//!
//! Every [`Outbox`](crate::Outbox) runs it in its maintainer, every
//! [`maintenance_interval`](crate::OutboxConfig::maintenance_interval); with no secret key
//! configured that is one read of an empty table.

use serde::Serialize;
use sqlx::{PgPool, Row};

use crate::error::{Error, Result};
use crate::task::StopSignal;
use crate::telemetry::HotStatement;

/// One step: removes the secret keys from at most `$1` events every reader has passed; with
/// `$2`, waits for another scrubber's step rather than leave the work to it.
pub(crate) const SCRUB: &str =
    "SELECT rewritten, scrubbed_below, caught_up FROM ordo.scrub_secrets($1, $2)";

/// Adds `$2` for type `$1` (NULL: every type); an existing one stays as it is.
const ADD: &str = r#"
INSERT INTO ordo.secret_keys (event_type, key)
SELECT $1, k FROM unnest($2::text[]) AS k
ON CONFLICT ((coalesce(event_type, '')), key) DO NOTHING
"#;

/// Removes `$2` for type `$1` (NULL: the every-type ones).
const REMOVE: &str = r#"
DELETE FROM ordo.secret_keys
WHERE event_type IS NOT DISTINCT FROM $1 AND key = ANY($2::text[])
"#;

const LIST: &str = r#"
SELECT event_type, key FROM ordo.secret_keys ORDER BY event_type NULLS FIRST, key
"#;

/// Sequences looked at per step: a short transaction that rewrites at most this many rows.
pub(crate) const STEP: i64 = 1_000;
/// Steps per maintenance run at most (a million events): a large backlog is worked off over
/// several runs rather than holding the maintainer.
const STEPS_PER_RUN: u32 = 1_000;

/// A secret payload key, as [`list_secret_keys`] returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SecretKey {
    /// The event type it applies to; `None`: every type (untyped events included).
    pub event_type: Option<String>,
    /// The top-level payload key.
    pub key: String,
}

/// What [`scrub_secrets`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ScrubReport {
    /// Stored events whose payload lost secret keys.
    pub rewritten: u64,
    /// Every event below this sequence has had its secret keys removed (`None`: no secret key
    /// is configured).
    pub scrubbed_below: Option<u64>,
}

fn checked<'a>(keys: &'a [&'a str]) -> Result<Vec<&'a str>> {
    for key in keys {
        if key.is_empty() || key.len() > 200 {
            return Error::invalid_config("secret key", "a key must be 1 to 200 bytes");
        }
    }
    Ok(keys.to_vec())
}

/// Names `keys` secret in the payloads of events of `event_type` (`None`: of every type): once
/// every subscription and relay has passed such an event, the keys are removed from its stored
/// payload (`ordo.events.payload`), at the next scrub (every
/// [`maintenance_interval`](crate::OutboxConfig::maintenance_interval) of a running
/// [`Outbox`](crate::Outbox), or [`scrub_secrets`]). Returns how many were new; keys already
/// secret stay as they are. A new key applies to the events already passed too: the next scrubs
/// walk the stored history again, rewriting only the events that hold a secret key.
///
/// Only top-level keys of object payloads are removed. Make the secret fields of your payload
/// type optional (`Option<_>` or `#[serde(default)]`), so that a scrubbed event still decodes
/// for a reader that meets it again. An event a dead letter names keeps its secrets until the
/// dead letter is retried or purged; a relay's parked event until it is requeued and
/// delivered. Events delivered before the scrub kept
/// the keys in transit (the receiver got them); a reader that starts later, or a
/// [replay](crate::admin::reset_subscription) below the scrubbed position, gets the events
/// without them.
///
/// Plain SQL does the same: `INSERT INTO ordo.secret_keys (event_type, key) VALUES (NULL,
/// 'password_reset_url')`. The table belongs to operators (the owner role and its members).
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> ordo::Result<()> {
/// // Every event type: a reset link is secret wherever it appears.
/// ordo::admin::add_secret_keys(&pool, None, &["password_reset_url"]).await?;
/// // Only the invitations carry this token.
/// ordo::admin::add_secret_keys(&pool, Some("MemberInvited"), &["invite_token"]).await?;
/// for secret in ordo::admin::list_secret_keys(&pool).await? {
///     println!("{:?} {}", secret.event_type, secret.key);
/// }
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::InvalidConfig`] for an empty key or one longer than 200 bytes;
/// [`Error::Database`] if the table cannot be written (SQLSTATE 42501: the role is not an
/// operator).
pub async fn add_secret_keys(
    pool: &PgPool,
    event_type: Option<&str>,
    keys: &[&str],
) -> Result<u64> {
    let keys = checked(keys)?;
    let added = sqlx::query(ADD)
        .bind(event_type)
        .bind(keys)
        .execute(pool)
        .await?;
    Ok(added.rows_affected())
}

/// Stops treating `keys` of `event_type` (`None`: the every-type ones) as secret; returns how
/// many were removed. Payloads already scrubbed stay scrubbed.
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> ordo::Result<()> {
/// ordo::admin::remove_secret_keys(&pool, Some("MemberInvited"), &["invite_token"]).await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::Database`] if the table cannot be written (the role is not an operator).
pub async fn remove_secret_keys(
    pool: &PgPool,
    event_type: Option<&str>,
    keys: &[&str],
) -> Result<u64> {
    let removed = sqlx::query(REMOVE)
        .bind(event_type)
        .bind(keys)
        .execute(pool)
        .await?;
    Ok(removed.rows_affected())
}

/// The secret payload keys, the every-type ones first.
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> ordo::Result<()> {
/// let secrets = ordo::admin::list_secret_keys(&pool).await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::Database`] if `ordo.secret_keys` cannot be read.
pub async fn list_secret_keys(pool: &PgPool) -> Result<Vec<SecretKey>> {
    let rows = sqlx::query(LIST).fetch_all(pool).await?;
    rows.into_iter()
        .map(|row| {
            Ok(SecretKey {
                event_type: row.try_get("event_type")?,
                key: row.try_get("key")?,
            })
        })
        .collect()
}

/// Removes the secret keys from every stored event that every reader has passed, now, in
/// short steps of at most 1,000 events each (one transaction each), until it has caught up.
/// A running [`Outbox`](crate::Outbox) does this by itself every
/// [`maintenance_interval`](crate::OutboxConfig::maintenance_interval); call it to scrub at
/// once (a test, an operator's `ordo secrets scrub`). Safe beside other scrubbers: steps run
/// one at a time, so when this returns every event passed when it started is scrubbed.
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> ordo::Result<()> {
/// let report = ordo::admin::scrub_secrets(&pool).await?;
/// println!("{} events scrubbed, every one below {:?} done", report.rewritten, report.scrubbed_below);
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::Database`] if a step fails (SQLSTATE 42501: the role may not execute
/// `ordo.scrub_secrets`: run it as a writer, consumer or operator role). Steps done stay
/// done.
pub async fn scrub_secrets(pool: &PgPool) -> Result<ScrubReport> {
    scrub(pool, u32::MAX, None).await
}

/// Up to `steps` steps, stopping early on `stop`; without `stop` (an operator's call), each
/// step waits for another scrubber's, with it (a maintainer) it leaves the work to that one.
async fn scrub(pool: &PgPool, steps: u32, stop: Option<&StopSignal>) -> Result<ScrubReport> {
    let mut report = ScrubReport::default();
    for _ in 0..steps {
        let row = sqlx::query(SCRUB)
            .bind(STEP)
            .bind(stop.is_none())
            .fetch_one(pool)
            .await?;
        let rewritten: i64 = row.try_get("rewritten")?;
        let below: Option<i64> = row.try_get("scrubbed_below")?;
        report.rewritten += u64::try_from(rewritten).unwrap_or(0);
        report.scrubbed_below = below.and_then(|below| u64::try_from(below).ok());
        if row.try_get::<bool, _>("caught_up")? || stop.is_some_and(StopSignal::is_stopped) {
            break;
        }
    }
    Ok(report)
}

/// The maintainer's scrub: bounded, logged, never failing the maintainer.
pub(crate) async fn maintain(pool: &PgPool, stop: &StopSignal) {
    match scrub(pool, STEPS_PER_RUN, Some(stop)).await {
        Ok(report) if report.rewritten > 0 => tracing::info!(
            rewritten = report.rewritten,
            scrubbed_below = report.scrubbed_below,
            "secret keys removed from delivered events"
        ),
        Ok(_) => {}
        Err(error)
            if crate::ops::retention::sqlstate(&error).as_deref()
                == Some(crate::ops::retention::INSUFFICIENT_PRIVILEGE) =>
        {
            refused(pool, &error).await;
        }
        Err(error) => tracing::warn!(
            %error,
            "removing secret keys from delivered events failed; will retry"
        ),
    }
}

/// The maintainer's role may not run `ordo.scrub_secrets`: a sequencer (`ordo fold`) or reader
/// role is not granted it, and needs it no more than it needs to say so while no key is
/// secret. With keys configured, the keys stay in delivered events until a role that may
/// scrubs them: that is worth a warning, naming who may.
async fn refused(pool: &PgPool, error: &Error) {
    let configured: std::result::Result<bool, sqlx::Error> =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM ordo.secret_keys)")
            .fetch_one(pool)
            .await;
    if let Ok(false) = configured {
        tracing::debug!(%error, "this role may not scrub secret keys, and none is configured");
        return;
    }
    tracing::warn!(
        %error,
        "secret payload keys are configured but this outbox's database role may not remove them \
         from delivered events (ordo.scrub_secrets): they stay until a role that may runs it, an \
         Outbox of a writer or consumer role (`ordo grant --writer`, `--consumer`) or \
         `ordo secrets scrub` as an operator"
    );
}

/// This file's statements on ordo's hot paths, with sample arguments, for `ops::plans`
/// (`tests/ops/plans.rs` fails if PostgreSQL would JIT-compile any).
pub(crate) const HOT_PATH: &[HotStatement] = &[
    // Its inner statements run with `jit = off` (a setting of the function, checked by
    // tests/relay/secrets.rs): EXPLAIN does not see inside a function.
    HotStatement {
        name: "maintenance: scrub secrets",
        sql: SCRUB,
        types: "bigint, boolean",
        args: "1000, false",
        session: &[],
    },
];
