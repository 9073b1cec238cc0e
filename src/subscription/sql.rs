//! The subscription runner's statements.

use std::time::Duration;

/// Creates the row if it is new; existing rows are left alone.
pub(crate) const CREATE: &str = r#"
INSERT INTO ordo.subscriptions (name, lane, position) VALUES ($1, $2, $3)
ON CONFLICT (name) DO NOTHING
"#;

pub(crate) const LANE: &str = "SELECT lane FROM ordo.subscriptions WHERE name = $1";

/// Takes the lease if it is free, expired, or already ours. Returns the row as it stands.
///
/// `SKIP LOCKED`: the claim never queues behind a row lock. A row locked by another transaction
/// (an owner between its checkpoint and its COMMIT, possibly stalled) is treated as taken; the
/// standby claims again at its next turn, by when the server has ended a stalled owner's
/// transaction (see [`begin_bounded`]). A plain `UPDATE` here waited on the lock for as long
/// as the owner stalled, expired lease or not.
pub(crate) const CLAIM: &str = r#"
WITH free AS (
    SELECT name FROM ordo.subscriptions
    WHERE name = $1
      AND (lease_owner IS NULL OR lease_owner = $2 OR lease_expires_at < now())
    FOR UPDATE SKIP LOCKED
)
UPDATE ordo.subscriptions AS s
SET lease_owner = $2,
    lease_expires_at = now() + make_interval(secs => $3::float8 / 1000),
    updated_at = now()
FROM free
WHERE s.name = free.name
RETURNING s.position, s.status, s.attempts, s.last_error
"#;

/// The `BEGIN` of a handler's transaction: the server ends the session if the transaction sits
/// idle (the runner stalled, or a handler awaits something else) longer than the lease, so a
/// stalled owner never keeps the subscription's row locked past its lease. The client cannot
/// enforce this: a stalled client is the case in point. Sent with the `BEGIN`, it costs no
/// round trip. The text is built from a number only (the lease in whole milliseconds, at least
/// 1, since 0 turns the timeout off).
pub(crate) fn begin_bounded(lease: Duration) -> sqlx::AssertSqlSafe<String> {
    let ms = lease.as_millis().max(1);
    sqlx::AssertSqlSafe(format!(
        "BEGIN; SET LOCAL idle_in_transaction_session_timeout = {ms}"
    ))
}

/// Extends a lease we hold; no row means we lost it. Also reports the row's state, so an
/// operator's pause, resume or reset is seen while idle.
pub(crate) const RENEW: &str = r#"
UPDATE ordo.subscriptions
SET lease_expires_at = now() + make_interval(secs => $3::float8 / 1000)
WHERE name = $1 AND lease_owner = $2
RETURNING position, status, attempts, last_error
"#;

/// The checkpoint, in the handler's transaction, fenced by the lease and the expected position
/// (an operator's reset moves the position, which also fails the fence).
pub(crate) const CHECKPOINT: &str = r#"
UPDATE ordo.subscriptions
SET position = $3,
    attempts = 0,
    last_error = NULL,
    lease_expires_at = now() + make_interval(secs => $5::float8 / 1000),
    updated_at = now()
WHERE name = $1 AND lease_owner = $2 AND position = $4 AND status = 'active'
"#;

/// A failed attempt, recorded for operators (fenced like a checkpoint). It also extends the
/// lease: a runner backing off between retries is alive, not gone.
pub(crate) const FAILED: &str = r#"
UPDATE ordo.subscriptions
SET attempts = $3, last_error = $4, updated_at = now(),
    lease_expires_at = now() + make_interval(secs => $5::float8 / 1000)
WHERE name = $1 AND lease_owner = $2
"#;

pub(crate) const HALT: &str = r#"
UPDATE ordo.subscriptions
SET status = 'halted', attempts = $3, last_error = $4, updated_at = now()
WHERE name = $1 AND lease_owner = $2 AND position = $5
"#;

/// One dead letter, with the payload as stored (it may not decode).
pub(crate) const DEAD_LETTER: &str = r#"
INSERT INTO ordo.dead_letters (subscription, lane, position, sequence, event_id, payload, error, attempts)
SELECT $1, $2, $3, e.sequence, e.id, e.payload, $5, $6
FROM ordo.events AS e WHERE e.sequence = $4
"#;

pub(crate) const RELEASE: &str = r#"
UPDATE ordo.subscriptions SET lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
WHERE name = $1 AND lease_owner = $2
"#;

/// Dead letters an operator asked to retry, with their events (as the lane reads them), their
/// position, attempts so far and, on the commit lane, whether the event ends its group (true
/// where the log no longer holds it).
pub(crate) const RETRIES: &str = r#"
SELECT d.id AS dead_letter, d.position, d.attempts, e.sequence, e.commit_xid, e.id,
       e.payload::text AS payload, e.headers::text AS headers, e.recorded_at, e.event_type,
       coalesce((SELECT c.group_last FROM ordo.commit_log_range(d.position - 1, d.position) AS c
                 WHERE d.lane = 'commit'), true) AS group_last
FROM ordo.dead_letters AS d
JOIN ordo.events AS e ON e.sequence = d.sequence
WHERE d.subscription = $1 AND d.retry_requested_at IS NOT NULL
ORDER BY d.id
LIMIT 100
"#;

/// A retried dead letter was handled: it goes, in the handler's transaction. The fence (the
/// lease owner) is checked by [`RETRY_FENCE`] in the same transaction.
pub(crate) const RETRY_DONE: &str = "DELETE FROM ordo.dead_letters WHERE id = $1";

/// The lease fence for a retry, which moves no position: extends our lease, no row if lost.
pub(crate) const RETRY_FENCE: &str = r#"
UPDATE ordo.subscriptions
SET lease_expires_at = now() + make_interval(secs => $3::float8 / 1000)
WHERE name = $1 AND lease_owner = $2
"#;

/// A retry failed (or its event is gone): the row stays, with the error, one more attempt, and
/// the request cleared.
pub(crate) const RETRY_FAILED: &str = r#"
UPDATE ordo.dead_letters
SET retry_requested_at = NULL, attempts = attempts + 1, error = $2
WHERE id = $1
"#;

/// Retry requests whose event is no longer in `ordo.events` (retention dropped it).
pub(crate) const RETRY_ORPHANS: &str = r#"
UPDATE ordo.dead_letters AS d
SET retry_requested_at = NULL,
    error = 'retry refused: ordo.events no longer holds sequence ' || d.sequence || ' (retention dropped it)'
WHERE d.subscription = $1 AND d.retry_requested_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM ordo.events AS e WHERE e.sequence = d.sequence)
"#;
