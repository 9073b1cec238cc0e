//! A watermark consumer's wait on a gap: the refused position noted on the mark's row, and the
//! wait logged once it is worth an operator's look.

use sqlx::{Postgres, Transaction};

use super::Place;
use crate::error::Result;
use crate::inbox::rows::position_column;
use crate::inbox::sql;
use crate::telemetry::printable;

/// Records on the mark's row (locked in `tx`) that `position` was refused as a gap, and logs
/// the wait once it has lasted [`GAP_SHOWN_AFTER`](super::GAP_SHOWN_AFTER), then at most once
/// a minute across every receiver. A position that never comes (its message lost upstream)
/// leaves the inbox waiting for ever: the log, `ordo status` and `ordo inbox watermarks` say so,
/// and `ordo inbox set-watermark` ends it. A wait for a position that *arrived* and is failing
/// is not a gap: it is said as such, with no advice to move the mark past it (that would skip
/// the message).
pub(super) async fn note_gap(
    mut tx: Transaction<'static, Postgres>,
    consumer: &str,
    place: &Place<'_>,
    expected: u64,
) -> Result<()> {
    type Noted = (chrono::DateTime<chrono::Utc>, bool, Option<i64>);
    let noted: Option<Noted> = sqlx::query_as(sql::NOTE_GAP)
        .persistent(false)
        .bind(consumer)
        .bind(place.source)
        .bind(position_column(place.position))
        .bind(place.route)
        .bind(position_column(expected))
        .fetch_optional(&mut *tx)
        .await?;
    tx.commit().await?;
    let Some((since, true, failing)) = noted else {
        return Ok(());
    };
    let since = since.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let failing = failing.and_then(|failing| u64::try_from(failing).ok());
    if let Some(failing) = failing.filter(|failing| *failing <= expected) {
        tracing::warn!(
            consumer = %printable(consumer),
            source = %printable(place.source),
            route = %printable(place.route),
            failing,
            received = place.position,
            %since,
            "inbox waits on a failing message: position {failing} arrived and its handler fails \
             (tried again on each redelivery), later ones are refused until it succeeds or fails \
             for good; fix its cause (ordo inbox watermarks shows its error)"
        );
        return Ok(());
    }
    tracing::warn!(
        consumer = %printable(consumer),
        source = %printable(place.source),
        route = %printable(place.route),
        expected,
        received = place.position,
        %since,
        "inbox waits on a gap: position {expected} from this source has not arrived, later \
         ones are refused (Gap) until it does; if it never will (lost upstream), move the mark \
         to it: ordo inbox set-watermark CONSUMER SOURCE {expected}"
    );
    Ok(())
}
