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
/// `Error::ServerRewound` naming `names`, then checks that the stream is over. Returns the
/// error's text.
///
/// No event may come before the error, except at a position the rewind voids (`from` on): an
/// early listener (`OutboxConfig::early_commit_listeners`) may have this process's own commit,
/// at the position the fold computed on the log it knew, before the fold finds that log gone.
pub async fn ends_with_rewind(
    which: &str,
    stream: &mut CommitStream<Note>,
    names: &str,
    from: i64,
    patience: Duration,
) -> String {
    let ended = loop {
        match timeout(patience, stream.next())
            .await
            .unwrap_or_else(|_| panic!("{which} hears of the rewind"))
        {
            Some(Err(error)) => break error,
            Some(Ok(item))
                if i64::try_from(item.commit_sequence.get()).is_ok_and(|p| p >= from) => {}
            Some(Ok(item)) => panic!(
                "{which}: an event below the rewind ({from}) reached the listener at {}",
                item.commit_sequence
            ),
            None => panic!("{which}: the stream ended without an error"),
        }
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
    text
}

/// Checks that `which` (built with `OnRewind::Stop`) refuses new transactions after a rewind.
pub async fn stays_stopped(which: &str, outbox: &Outbox<Note>) {
    assert!(
        matches!(outbox.begin().await, Err(Error::ServerRewound { .. })),
        "{which}: the outbox refuses new transactions"
    );
}

/// Checks that `which` (built with the default `OnRewind::Resume`) goes on by itself after a
/// rewind, from what `pool`'s server holds: `begin` works again within `patience`, and a
/// listener opened now reads the server's event at the rewound position `from` (not the one
/// the process had seen there), and, when a process folds (`folded`), an event committed
/// through the outbox after it.
pub async fn goes_on_from_the_server(
    which: &str,
    outbox: &Outbox<Note>,
    pool: &PgPool,
    from: i64,
    folded: bool,
    patience: Duration,
) {
    let began = tokio::time::Instant::now();
    let mut tx = loop {
        match outbox.begin().await {
            Ok(tx) => break tx,
            Err(Error::ServerRewound { .. }) if began.elapsed() < patience => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => panic!("{which}: begin after the rewind: {error}"),
        }
    };
    tx.publish(Note { writer: 9, n: 0 }).expect("publish");
    tx.commit().await.expect("a commit after the rewind");
    // Once the server's log holds the position again (a process folds what it holds).
    let held = loop {
        let held: Option<String> = sqlx::query_scalar(
            "SELECT e.id::text FROM ordo.commit_log AS l \
             JOIN ordo.events AS e ON e.sequence = l.sequence WHERE l.commit_seq = $1",
        )
        .bind(from)
        .fetch_optional(pool)
        .await
        .expect("the server's event at the rewound position");
        match held {
            Some(held) => break held,
            None if began.elapsed() < patience => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            None => panic!("{which}: the server's log holds no position {from}"),
        }
    };
    let after = ordo::CommitSequence::new(u64::try_from(from - 1).expect("a position"));
    let mut stream = outbox.listen_committed(ordo::Start::After(after));
    let first = next_in(which, &mut stream, patience).await;
    assert_eq!(first.commit_sequence.get(), from as u64, "{which}: dense");
    assert_eq!(
        first.event.id.to_string(),
        held,
        "{which}: the server's event at position {from}"
    );
    if !folded {
        return;
    }
    loop {
        let item = next_in(which, &mut stream, patience).await;
        if item.event.payload == (Note { writer: 9, n: 0 }) {
            return;
        }
    }
}

async fn next_in(
    which: &str,
    stream: &mut CommitStream<Note>,
    patience: Duration,
) -> ordo::CommitOrderedEnvelope<Note> {
    match timeout(patience, stream.next()).await {
        Ok(Some(Ok(item))) => item,
        Ok(Some(Err(error))) => panic!("{which}: a listener opened after the rewind: {error}"),
        Ok(None) => panic!("{which}: a listener opened after the rewind ended"),
        Err(_) => panic!("{which}: a listener opened after the rewind heard nothing"),
    }
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
    // Stamped as another transaction's: the peer published them in a transaction of its own
    // (a transaction that published may not append: `ordo.append_commit_log` refuses it), and
    // all of this must still land in one commit, before any other process reads the head.
    sqlx::query(
        "INSERT INTO ordo.events (payload, commit_xid) \
         SELECT jsonb_build_object('writer', 3, 'n', n), \
                pg_current_xact_id()::text::bigint + 1000000 \
         FROM generate_series(0, $1 - 1) AS n \
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
