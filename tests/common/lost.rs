//! Losses made by hand: what a failover to a standby that lacked the last transactions, or a
//! crash that lost unflushed ones, leaves in the commit log, for the tests of how every
//! process notices it.

use std::time::Duration;

use futures::StreamExt;
use ordo::{CommitStream, Error, Outbox};
use sqlx::PgPool;
use tokio::time::timeout;

use super::Note;

/// Waits up to `patience` for `which`'s commit-lane listener to end with
/// `Error::ServerRewound` naming `names` (no event may come before it), then checks that the
/// stream is over and that the outbox refuses new transactions. Returns the error's text.
pub async fn ends_with_rewind(
    which: &str,
    outbox: &Outbox<Note>,
    stream: &mut CommitStream<Note>,
    names: &str,
    patience: Duration,
) -> String {
    let ended = match timeout(patience, stream.next())
        .await
        .unwrap_or_else(|_| panic!("{which} hears of the rewind"))
    {
        Some(Err(error)) => error,
        Some(Ok(item)) => panic!(
            "{which}: an event past the rewind reached the listener at {}",
            item.commit_sequence
        ),
        None => panic!("{which}: the stream ended without an error"),
    };
    let text = ended.to_string();
    assert!(
        matches!(ended, Error::ServerRewound { .. }),
        "{which}: the rewind: {text}"
    );
    assert!(text.contains(names), "{which}: names {names:?}: {text}");
    assert!(
        stream.next().await.is_none(),
        "{which}: then the stream is over"
    );
    assert!(
        matches!(outbox.begin().await, Err(Error::ServerRewound { .. })),
        "{which}: the outbox refuses new transactions"
    );
    text
}

/// What a failover or a crash leaves, made by hand in one transaction on one server: the
/// appends from the one holding `lose_from` on lost (and their events with them when
/// `events`: a standby that had not received them, or a crash that lost transactions committed
/// with `synchronous_commit` off), then a peer publishing `new` events and folding everything,
/// all before any other process reads the head again; on a newer server history when
/// `history` names one (a promoted standby), on the same one otherwise. Returns the first
/// position the lost appends held.
pub async fn lose_by_hand(
    pool: &PgPool,
    events: bool,
    lose_from: i64,
    new: i64,
    history: Option<i32>,
) -> i64 {
    let mut tx = pool.begin().await.expect("begin");
    let (from, lost_low, lost_high): (i64, i64, i64) = sqlx::query_as(
        "WITH lost AS (
             DELETE FROM ordo.commit_chunks WHERE last_commit_seq >= $1
             RETURNING first_commit_seq, min_sequence, max_sequence, sequences),
         gone AS (
             DELETE FROM ordo.events AS e USING lost
             WHERE $2 AND e.sequence = ANY (lost.sequences)),
         span AS (
             SELECT min(first_commit_seq) AS first, min(min_sequence) AS low,
                    max(max_sequence) AS high
             FROM lost)
         UPDATE ordo.sequencer_state AS s
         SET last_commit_seq = span.first - 1, logged_through_sequence = span.low - 1
         FROM span
         RETURNING span.first, span.low, span.high",
    )
    .bind(lose_from)
    .bind(events)
    .fetch_one(&mut *tx)
    .await
    .expect("lose the last appends");
    if events {
        sqlx::query("SELECT ordo.fill_placeholders($1, $2)")
            .bind(lost_low)
            .bind(lost_high)
            .execute(&mut *tx)
            .await
            .expect("placeholders where the lost events were");
    }
    sqlx::query(
        "INSERT INTO ordo.events (payload) \
         SELECT jsonb_build_object('writer', 3, 'n', n) FROM generate_series(0, $1 - 1) AS n \
         ORDER BY n",
    )
    .bind(new)
    .execute(&mut *tx)
    .await
    .expect("the promoted server's own events");
    sqlx::query(
        "SELECT count(*) FROM ordo.append_commit_log(
             (SELECT logged_through_sequence FROM ordo.sequencer_state),
             (SELECT max(sequence) FROM ordo.events))",
    )
    .execute(&mut *tx)
    .await
    .expect("the peer's fold");
    if let Some(history) = history {
        sqlx::query("INSERT INTO ordo.commit_histories (history, from_commit_seq) VALUES ($1, $2)")
            .bind(history)
            .bind(from)
            .execute(&mut *tx)
            .await
            .expect("the promoted server's history");
    }
    tx.commit().await.expect("commit");
    from
}
