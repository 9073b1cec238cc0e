//! A batch's results, stored in one transaction fenced by the relay's lease: delivered events
//! become done (their completion rows; the watermark moves past them), failed ones store their
//! attempts and error, parked ones their keys too. A relay that lost its lease stores nothing.

use sqlx::PgPool;
use uuid::Uuid;

use crate::subscription::handle::Position;
use crate::subscription::keyed::progress;

/// Every delivered position at once, fenced like a keyed completion (`FOR SHARE` of the
/// relay's row holds off a takeover until COMMIT). Rows inserted or updated = positions given,
/// unless the fence refused.
pub(crate) const DELIVERED: &str = r#"
INSERT INTO ordo.subscription_progress (subscription, position, state)
SELECT s.name, d.position, 'done'
FROM ordo.subscriptions AS s, unnest($3::bigint[]) AS d(position)
WHERE s.name = $1 AND s.lease_owner = $2 AND s.status = 'active' AND s.position < d.position
FOR SHARE OF s
ON CONFLICT (subscription, position) DO UPDATE
SET state = 'done', last_error = NULL, retry_requested_at = NULL, updated_at = now()
WHERE ordo.subscription_progress.state <> 'done'
"#;

/// A failed delivery's record.
pub(crate) struct Mark {
    pub(crate) at: Position,
    pub(crate) parked: bool,
    pub(crate) attempts: u32,
    pub(crate) keys: Vec<String>,
    pub(crate) error: String,
}

/// What one batch stores.
#[derive(Default)]
pub(crate) struct Marks {
    pub(crate) delivered: Vec<Position>,
    pub(crate) failed: Vec<Mark>,
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
        if !marks.delivered.is_empty() {
            let positions: Vec<i64> = marks
                .delivered
                .iter()
                .map(|at| i64::try_from(at.get()).unwrap_or(i64::MAX))
                .collect();
            let done = sqlx::query(DELIVERED)
                .bind(&self.name)
                .bind(self.owner)
                .bind(&positions)
                .execute(&mut *tx)
                .await?;
            if done.rows_affected() != positions.len() as u64 {
                tx.rollback().await?;
                return Ok(false);
            }
        }
        for mark in marks.failed {
            let failed = progress::Failed {
                at: mark.at,
                stalled: mark.parked,
                attempts: mark.attempts,
                keys: mark.keys,
                error: &mark.error,
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
