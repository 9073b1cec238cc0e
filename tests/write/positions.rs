//! Positions bind and decode as PostgreSQL `bigint`, refusing what no position can be.

use crate::common;

use common::TestDb;
use ordo::{CommitSequence, EventSequence};

#[tokio::test]
async fn positions_bind_and_decode_directly_and_refuse_impossible_values() {
    let db = TestDb::new().await;
    let (event, commit): (EventSequence, CommitSequence) = sqlx::query_as("SELECT $1 + 1, $2")
        .bind(EventSequence::new(41))
        .bind(CommitSequence::new(7))
        .fetch_one(&db.pool)
        .await
        .expect("positions round-trip");
    assert_eq!(
        (event, commit),
        (EventSequence::new(42), CommitSequence::new(7))
    );

    let many: Vec<EventSequence> = sqlx::query_scalar("SELECT unnest($1::bigint[]) ORDER BY 1")
        .bind(vec![EventSequence::new(3), EventSequence::new(1)])
        .fetch_all(&db.pool)
        .await
        .expect("an array of positions");
    assert_eq!(many, vec![EventSequence::new(1), EventSequence::new(3)]);

    let negative = sqlx::query_scalar::<_, EventSequence>("SELECT -1::bigint")
        .fetch_one(&db.pool)
        .await;
    assert!(
        negative.is_err(),
        "a negative position decoded: {negative:?}"
    );

    let too_large = sqlx::query("SELECT $1")
        .bind(CommitSequence::new(u64::MAX))
        .execute(&db.pool)
        .await;
    let message = too_large
        .expect_err("u64::MAX bound as a bigint")
        .to_string();
    assert!(message.contains("CommitSequence"), "{message}");
}
