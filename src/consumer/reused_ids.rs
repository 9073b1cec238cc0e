//! Events whose id belongs to an earlier event, found as a relay reads its lane (see
//! `relay::reused_ids` for why, and what the relay does with them).

use sqlx::PgPool;

use super::source::Item;
use crate::telemetry::HotStatement;

/// For each event of a read (`$1` ids, `$2` their insert sequences) whose id a real event at a
/// lower sequence also holds: its sequence and the lowest such sequence. One index scan per
/// partition with the whole array (materialised, so no nested loop probes the array per row),
/// then the few rows found matched to the read.
pub(crate) const REUSED: &str = r#"
WITH held AS MATERIALIZED (
    SELECT e.id, e.sequence FROM ordo.events AS e
    WHERE e.id = ANY ($1::uuid[]) AND e.payload IS NOT NULL
)
SELECT b.sequence, min(h.sequence) AS first
FROM unnest($1::uuid[], $2::bigint[]) AS b(id, sequence)
JOIN held AS h ON h.id = b.id AND h.sequence < b.sequence
GROUP BY b.sequence
"#;

/// Marks the events of `read` whose id an earlier event holds as refused (the earlier one's
/// sequence) and skipped. Every event at a lower sequence than one read is resolved by then
/// (both lanes pass a sequence only once everything below it is), so the look-up misses no
/// earlier holder.
pub(crate) async fn refuse<P>(pool: &PgPool, read: &mut [Item<P>]) -> Result<(), sqlx::Error> {
    let (ids, sequences): (Vec<uuid::Uuid>, Vec<i64>) = read
        .iter()
        .filter(|item| !item.skipped)
        .filter_map(|item| item.event.as_ref().ok())
        .map(|event| {
            (
                event.id,
                i64::try_from(event.sequence.get()).unwrap_or(i64::MAX),
            )
        })
        .unzip();
    if ids.is_empty() {
        return Ok(());
    }
    let reused: Vec<(i64, i64)> = sqlx::query_as(REUSED)
        .bind(&ids)
        .bind(&sequences)
        .fetch_all(pool)
        .await?;
    for (sequence, first) in reused {
        let (Ok(sequence), Ok(first)) = (u64::try_from(sequence), u64::try_from(first)) else {
            continue;
        };
        if let Some(item) = read.iter_mut().find(|item| item.sequence.get() == sequence) {
            item.refused = Some(first);
            item.skipped = true;
        }
    }
    Ok(())
}

/// This file's statements on ordo's hot paths, with sample arguments, for `ops::plans`
/// (`tests/ops/plans.rs` fails if PostgreSQL would JIT-compile any).
pub(crate) const HOT_PATH: &[HotStatement] = &[HotStatement {
    name: "relay: ids reused by a read",
    sql: REUSED,
    types: "uuid[], bigint[]",
    args: "ARRAY['0190c9d2-0000-7000-8000-000000000001']::uuid[], ARRAY[10]::bigint[]",
    session: &[],
}];
