//! A batch's results, stored in one transaction fenced by the relay's lease: delivered events
//! become done (the stored watermark moves to cover them when the schedule's watermark does,
//! otherwise a completion row each, which the flush folds into the watermark), failed ones store their
//! attempts and error, parked ones their keys too. A relay that lost its lease stores nothing.

use sqlx::PgPool;
use uuid::Uuid;

use crate::consumer::progress;
use crate::position::Position;
use crate::telemetry::HotStatement;

/// Every delivered position above the stored watermark at once, fenced like a keyed
/// completion (`FOR SHARE` of the relay's row holds off a takeover until COMMIT). The fence is
/// the row itself: a position at or below the watermark needs no row (an earlier write of this
/// relay may have moved the watermark past it), so the answer is whether the row was there.
pub(crate) const DELIVERED: &str = r#"
WITH fence AS (
    SELECT s.name, s.position FROM ordo.subscriptions AS s
    WHERE s.name = $1 AND s.lease_owner = $2 AND s.status = 'active'
    FOR SHARE
), stored AS (
    INSERT INTO ordo.subscription_progress (subscription, position, state)
    SELECT f.name, d.position, 'done'
    FROM fence AS f, unnest($3::bigint[]) AS d(position)
    WHERE f.position < d.position
    ON CONFLICT (subscription, position) DO UPDATE
    SET state = 'done', last_error = NULL, retry_requested_at = NULL, updated_at = now()
    WHERE ordo.subscription_progress.state <> 'done'
)
SELECT EXISTS (SELECT 1 FROM fence)
"#;

/// The watermark moved to `$3` (never back) in place of completion rows, when a batch's
/// delivered events are all at or below the schedule's contiguous watermark once it landed:
/// every event up to there was delivered, by this batch or one before it. Progress rows at or
/// below it go, as in a flush, and the routes it passed (`$4`, their last positions `$5`)
/// are stored with it, so that `ordo.relay_routes` always matches the stored watermark
/// (`chain.rs`). Fenced by the lease; the answer is whether the row was there.
pub(crate) const ADVANCE: &str = r#"
WITH moved AS (
    UPDATE ordo.subscriptions
    SET position = GREATEST(position, $3), updated_at = now()
    WHERE name = $1 AND lease_owner = $2 AND status = 'active'
    RETURNING position
), pruned AS (
    DELETE FROM ordo.subscription_progress AS p
    WHERE p.subscription = $1 AND p.position <= $3 AND EXISTS (SELECT 1 FROM moved)
      AND (p.state = 'done'
           OR (p.retry_requested_at IS NULL
               AND NOT EXISTS (SELECT 1 FROM ordo.key_backlogs AS b
                               WHERE b.subscription = $1 AND b.position = p.position)))
), routed AS (
    INSERT INTO ordo.relay_routes AS r (relay, route, position)
    SELECT $1, p.route, p.position
    FROM unnest($4::text[], $5::bigint[]) AS p(route, position)
    WHERE EXISTS (SELECT 1 FROM moved)
    ON CONFLICT (relay, route) DO UPDATE SET position = GREATEST(r.position, excluded.position)
)
SELECT EXISTS (SELECT 1 FROM moved)
"#;

/// A failed delivery's record.
pub(crate) struct Mark {
    pub(crate) at: Position,
    /// The event's insert-lane sequence (for its attempt history, pruned by retention).
    pub(crate) sequence: u64,
    pub(crate) parked: bool,
    pub(crate) attempts: u32,
    pub(crate) keys: Vec<String>,
    pub(crate) error: String,
    /// Taken back from a stuck key's backlog.
    pub(crate) aside: bool,
}

/// What one batch stores.
#[derive(Default)]
pub(crate) struct Marks {
    pub(crate) delivered: Vec<Position>,
    pub(crate) failed: Vec<Mark>,
    /// Store this watermark instead of a row per delivered position (see [`ADVANCE`]).
    pub(crate) advance_to: Option<Position>,
    /// With `advance_to`: the routes it passes and the last position of each.
    pub(crate) routes: (Vec<String>, Vec<i64>),
    /// Delivered events taken back from a backlog: their copies leave it.
    pub(crate) taken: Vec<i64>,
}

/// Writes marks for one relay owner (owned, so a task of its own can run it).
pub(crate) struct Writer {
    pool: PgPool,
    name: String,
    owner: Uuid,
}

impl Writer {
    pub(crate) fn new(pool: &PgPool, name: &str, owner: Uuid) -> Self {
        Self {
            pool: pool.clone(),
            name: name.to_owned(),
            owner,
        }
    }

    /// Stores `marks` in one transaction; false (nothing stored) when the fence refused.
    pub(crate) async fn write(self, marks: Marks) -> Result<bool, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        if !marks.taken.is_empty()
            && !crate::consumer::backlog::taken(&mut tx, &self.name, self.owner, &marks.taken)
                .await?
        {
            tx.rollback().await?;
            return Ok(false);
        }
        let fenced = match marks.advance_to {
            Some(to) => Some(
                sqlx::query_scalar(ADVANCE)
                    .bind(&self.name)
                    .bind(self.owner)
                    .bind(to)
                    .bind(&marks.routes.0)
                    .bind(&marks.routes.1)
                    .fetch_one(&mut *tx)
                    .await?,
            ),
            None if !marks.delivered.is_empty() => {
                let positions: Vec<i64> = marks
                    .delivered
                    .iter()
                    .map(|at| i64::try_from(at.get()).unwrap_or(i64::MAX))
                    .collect();
                Some(
                    sqlx::query_scalar(DELIVERED)
                        .bind(&self.name)
                        .bind(self.owner)
                        .bind(&positions)
                        .fetch_one(&mut *tx)
                        .await?,
                )
            }
            None => None,
        };
        if fenced == Some(false) {
            tx.rollback().await?;
            return Ok(false);
        }
        for mark in marks.failed {
            // In the marks' transaction: an attempt is in the history if and only if it
            // counted (a write whose fence refused stores neither).
            super::attempts::record(&mut tx, &self.name, self.owner, &mark).await?;
            let failed = progress::Failed {
                at: mark.at,
                stalled: mark.parked,
                attempts: mark.attempts,
                keys: mark.keys,
                error: &mark.error,
                aside: mark.aside,
            };
            if !progress::failed_in(&mut tx, &self.name, self.owner, failed).await? {
                tx.rollback().await?;
                return Ok(false);
            }
        }
        tx.commit().await?;
        Ok(true)
    }
}

/// This file's statements on ordo's hot paths, with sample arguments, for `ops::plans`
/// (`tests/ops/plans.rs` fails if PostgreSQL would JIT-compile any).
pub(crate) const HOT_PATH: &[HotStatement] = &[HotStatement {
    name: "relay: delivered marks",
    sql: DELIVERED,
    types: "text, uuid, bigint[]",
    args: "'s', '0190c9d2-0000-7000-8000-000000000001'::uuid, ARRAY[10, 11, 12]::bigint[]",
    session: &[],
}];
