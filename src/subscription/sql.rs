//! The subscription runner's statements.

/// Creates the row if it is new; existing rows are left alone.
pub(crate) const CREATE: &str = r#"
INSERT INTO ordo.subscriptions (name, lane, position) VALUES ($1, $2, $3)
ON CONFLICT (name) DO NOTHING
"#;

pub(crate) const LANE: &str = "SELECT lane FROM ordo.subscriptions WHERE name = $1";

/// Takes the lease if it is free, expired, or already ours. Returns the row as it stands.
pub(crate) const CLAIM: &str = r#"
UPDATE ordo.subscriptions
SET lease_owner = $2,
    lease_expires_at = now() + make_interval(secs => $3::float8 / 1000),
    updated_at = now()
WHERE name = $1
  AND (lease_owner IS NULL OR lease_owner = $2 OR lease_expires_at < now())
RETURNING position, status, attempts, last_error
"#;

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
