//! The consumer inbox's upkeep, on a real PostgreSQL: purging completed rows (explicitly and
//! in the background) and nothing else; bad configuration and unstorable messages refused.

use crate::common;

use std::time::Duration;

use common::inbox::{Recording, all_effects, effects, effects_table, status};
use common::{TestDb, eventually};
use ordo::inbox::{Inbox, InboxConfig, InboxMessage, Receipt};

const PATIENCE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_removes_old_completed_rows_only() {
    let db = TestDb::new().await;
    effects_table(&db.pool).await;
    let config = InboxConfig::new("billing")
        .max_attempts(1)
        .retention(Duration::from_secs(3600));
    let inbox = Inbox::new(db.pool.clone(), config).expect("inbox");
    let ok = Recording::default();
    let failing = Recording::failing(u32::MAX);
    for id in ["old-1", "old-2", "new-1"] {
        let handled = inbox.receive(&InboxMessage::new(id, "{}"), &ok).await;
        assert_eq!(handled.expect("receive"), Receipt::Handled);
    }
    let failed = inbox
        .receive(&InboxMessage::new("failed-1", "{}"), &failing)
        .await;
    assert!(matches!(failed.expect("receive"), Receipt::Failed { .. }));
    let pending = Inbox::new(db.pool.clone(), InboxConfig::new("billing").max_attempts(5))
        .expect("inbox")
        .receive(&InboxMessage::new("pending-1", "{}"), &failing)
        .await;
    assert!(matches!(pending.expect("receive"), Receipt::Retry { .. }));
    // Everything but new-1 is two hours old; another consumer's old rows are not ours.
    sqlx::query(
        "UPDATE ordo.inbox SET received_at = now() - interval '2 hours',
             updated_at = now() - interval '2 hours',
             completed_at = CASE WHEN status = 'completed' THEN now() - interval '2 hours' END
         WHERE message_id <> 'new-1'",
    )
    .execute(&db.pool)
    .await
    .expect("age the rows");
    sqlx::query(
        "INSERT INTO ordo.inbox (consumer, message_id, status, completed_at)
         VALUES ('audit', 'old-1', 'completed', now() - interval '2 hours')",
    )
    .execute(&db.pool)
    .await
    .expect("another consumer's row");

    assert_eq!(inbox.purge().await.expect("purge"), 2);
    let left: Vec<(String, String)> =
        sqlx::query_as("SELECT consumer || '/' || message_id, status FROM ordo.inbox ORDER BY 1")
            .fetch_all(&db.pool)
            .await
            .expect("rows");
    let left: Vec<(&str, &str)> = left.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    assert_eq!(
        left,
        [
            ("audit/old-1", "completed"),
            ("billing/failed-1", "failed"),
            ("billing/new-1", "completed"),
            ("billing/pending-1", "pending"),
        ]
    );
    // A message redelivered after its row was purged is no longer recognised: it runs again.
    let again = inbox.receive(&InboxMessage::new("old-1", "{}"), &ok).await;
    assert_eq!(again.expect("receive"), Receipt::Handled);
    assert_eq!(effects(&db.pool, "old-1").await, 2);

    // The background task does the same.
    sqlx::query("UPDATE ordo.inbox SET completed_at = now() - interval '2 hours' WHERE status = 'completed'")
        .execute(&db.pool)
        .await
        .expect("age");
    let purger = inbox
        .spawn_purge(Duration::from_millis(20))
        .expect("a purge interval above zero");
    let purged = eventually(PATIENCE, || async {
        status(&db.pool, "billing", "new-1").await.is_none()
            && status(&db.pool, "billing", "old-1").await.is_none()
    })
    .await;
    purger.shutdown().await;
    assert!(purged, "the background purge did not run");
    assert_eq!(
        status(&db.pool, "billing", "failed-1").await.as_deref(),
        Some("failed")
    );
    assert_eq!(all_effects(&db.pool).await, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configuration_and_unstorable_messages_are_refused_with_the_reason() {
    let db = TestDb::new().await;
    let refused = |config: InboxConfig| Inbox::new(db.pool.clone(), config).err();
    for config in [
        InboxConfig::new(""),
        InboxConfig::new("c").max_attempts(0),
        InboxConfig::new("c").retention(Duration::from_millis(10)),
    ] {
        let error = refused(config).expect("refused");
        assert!(
            matches!(error, ordo::Error::InvalidConfig { .. }),
            "{error}"
        );
    }
    let inbox = Inbox::new(db.pool.clone(), InboxConfig::new("c")).expect("inbox");
    let handler = Recording::default();
    for message in [
        InboxMessage::new("", "{}"),
        InboxMessage::new("x".repeat(201), "{}"),
        InboxMessage::new("m", "{}").with_source("", 1),
        InboxMessage::new("m", "{}").with_source("s", 0),
        InboxMessage::new("m", "{\"a\":\"\0\"}"),
    ] {
        let error = inbox
            .receive(&message, &handler)
            .await
            .expect_err("refused");
        assert!(
            matches!(error, ordo::Error::InvalidInboxMessage { .. }),
            "{error}"
        );
    }
    assert_eq!(handler.calls(), 0);
}
