//! Operating keyed subscriptions: their stalled keys, listed and retried.

use std::collections::HashMap;

use sqlx::{PgPool, Row};

use super::status::{StalledKey, SubscriptionStatus};
use crate::error::{Error, Result};
use crate::position::{Position, read_lane};

/// Stalled events with their subscription's lane, one row per event.
const STALLED: &str = r#"
SELECT p.subscription, s.lane, p.position, p.keys, p.attempts, coalesce(p.last_error, '') AS error,
       p.retry_requested_at IS NOT NULL AS retry_requested, p.updated_at,
       p.position = s.position + 1 + (
           SELECT count(*) FROM ordo.subscription_progress AS d
           WHERE d.subscription = p.subscription AND d.state = 'done'
             AND d.position > s.position AND d.position < p.position
       ) AS holds_watermark
FROM ordo.subscription_progress AS p
JOIN ordo.subscriptions AS s ON s.name = p.subscription
WHERE p.state = 'stalled' AND ($1::text IS NULL OR p.subscription = $1)
ORDER BY p.subscription, p.position
"#;

/// Asks the runner to retry the stalled events holding key `$2` (every stalled event when
/// NULL); returns their positions.
const REQUEST_RETRY: &str = r#"
UPDATE ordo.subscription_progress
SET retry_requested_at = now(), updated_at = now()
WHERE subscription = $1 AND state = 'stalled' AND ($2::text IS NULL OR $2 = ANY(keys))
RETURNING position
"#;

const EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM ordo.subscriptions WHERE name = $1)";

/// Every stalled key, by subscription (all subscriptions when `name` is `None`).
pub(crate) async fn stalled_by_subscription(
    pool: &PgPool,
    name: Option<&str>,
) -> Result<HashMap<String, Vec<StalledKey>>, sqlx::Error> {
    let rows = sqlx::query(STALLED).bind(name).fetch_all(pool).await?;
    let mut stalled: HashMap<String, Vec<StalledKey>> = HashMap::new();
    for row in rows {
        let lane = read_lane(&row, "lane")?;
        let position = Position::read(&row, "position", lane)?;
        let attempts = crate::consumer::sql::attempts_read(row.try_get("attempts")?);
        let error: String = row.try_get("error")?;
        let retry_requested = row.try_get("retry_requested")?;
        let since = row.try_get("updated_at")?;
        let holds_watermark = row
            .try_get::<Option<bool>, _>("holds_watermark")?
            .unwrap_or(false);
        let mut keys: Vec<String> = row.try_get("keys")?;
        if keys.is_empty() {
            // An event with no key, or one whose payload does not decode.
            keys.push(String::new());
        }
        let list = stalled.entry(row.try_get("subscription")?).or_default();
        list.extend(keys.into_iter().map(|key| StalledKey {
            key,
            position,
            attempts,
            error: error.clone(),
            retry_requested,
            since,
            holds_watermark,
        }));
    }
    Ok(stalled)
}

/// Fills each status's [`stalled`](SubscriptionStatus::stalled) keys from the database.
pub(crate) async fn attach_stalled(
    pool: &PgPool,
    statuses: &mut [SubscriptionStatus],
) -> Result<(), sqlx::Error> {
    let mut stalled = stalled_by_subscription(pool, None).await?;
    for status in statuses {
        status.stalled = stalled.remove(&status.name).unwrap_or_default();
    }
    Ok(())
}

/// A keyed subscription's stalled keys, oldest event first: each waits on an event whose
/// attempts ran out under [`OnExhaustion::Halt`](crate::OnExhaustion::Halt). An event with
/// several keys is listed once per key; an event with no key (or one whose payload does not
/// decode, which holds every key) is listed with the empty key.
///
/// # Errors
/// [`Error::UnknownSubscription`] if there is no such subscription; [`Error::Database`] if a
/// statement fails.
pub async fn list_stalled_keys(pool: &PgPool, name: &str) -> Result<Vec<StalledKey>> {
    ensure_exists(pool, name).await?;
    let mut stalled = stalled_by_subscription(pool, Some(name)).await?;
    Ok(stalled.remove(name).unwrap_or_default())
}

/// Asks a keyed subscription's runner to retry its stalled events: those holding `key`, or
/// every one when `key` is `None`. The runner that holds the lease takes the request within a
/// second (or at its next claim), counts the event's attempts from zero and runs it again;
/// the events waiting behind it follow in order. Returns how many stalled events the request
/// covers (with `key: None`, 0 when nothing is stalled).
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> ordo::Result<()> {
/// let asked = ordo::admin::retry_stalled_keys(&pool, "notify-recipients", Some("alice")).await?;
/// println!("{asked} stalled events will run again");
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::UnknownSubscription`] if there is no such subscription;
/// [`Error::UnknownStalledKey`] if `key` is given and no stalled event holds it (a typo, or a
/// key that was never stalled, would otherwise ask nothing and say so only as a 0);
/// [`Error::Database`] if a statement fails.
pub async fn retry_stalled_keys(pool: &PgPool, name: &str, key: Option<&str>) -> Result<u64> {
    ensure_exists(pool, name).await?;
    let positions: Vec<i64> = sqlx::query_scalar(REQUEST_RETRY)
        .bind(name)
        .bind(key)
        .fetch_all(pool)
        .await?;
    if let (Some(key), true) = (key, positions.is_empty()) {
        return Err(Error::UnknownStalledKey {
            subscription: name.to_owned(),
            key: key.to_owned(),
        });
    }
    Ok(positions.len() as u64)
}

async fn ensure_exists(pool: &PgPool, name: &str) -> Result<()> {
    let exists: bool = sqlx::query_scalar(EXISTS)
        .bind(name)
        .fetch_one(pool)
        .await?;
    if exists {
        Ok(())
    } else {
        Err(Error::UnknownSubscription {
            name: name.to_owned(),
        })
    }
}
