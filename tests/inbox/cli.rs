//! `ordo inbox`, run as a real process: failed messages listed, replayed one and all.
#![cfg(feature = "cli")]

use crate::common;

use common::TestDb;
use common::inbox::{Recording, effects_table, status};
use ordo::inbox::{Inbox, InboxConfig, InboxMessage, InboxMode, Receipt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordo_inbox_lists_failed_messages_and_replays_one_or_all() {
    let db = TestDb::new().await;
    effects_table(&db.pool).await;
    let failing = Recording::failing(u32::MAX);
    for consumer in ["billing", "audit"] {
        let config = InboxConfig::new(consumer).max_attempts(1);
        let inbox = Inbox::new(db.pool.clone(), config).expect("inbox");
        for id in ["m-1", "m-2"] {
            let receipt = inbox.receive(&InboxMessage::new(id, "{}"), &failing).await;
            assert!(matches!(receipt.expect("receive"), Receipt::Failed { .. }));
        }
    }

    let (ok, out, err) = db.ordo(&["inbox", "failed", "--consumer", "billing", "--json"]);
    assert!(ok, "{err}");
    let ids: Vec<String> = out
        .lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            value["id"].as_str().expect("an id").to_owned()
        })
        .collect();
    assert_eq!(ids, ["m-1", "m-2"]);
    let (ok, table, _) = db.ordo(&["inbox", "failed"]);
    assert!(ok);
    assert!(table.contains("planned failure 1"), "{table}");
    assert_eq!(table.lines().count(), 5, "{table}");

    let (ok, _, err) = db.ordo(&["inbox", "replay", "m-1", "--consumer", "billing"]);
    assert!(ok, "{err}");
    assert_eq!(
        status(&db.pool, "billing", "m-1").await.as_deref(),
        Some("pending")
    );
    assert_eq!(
        status(&db.pool, "audit", "m-1").await.as_deref(),
        Some("failed")
    );
    let (ok, _, err) = db.ordo(&["inbox", "replay", "m-1", "--consumer", "billing"]);
    assert!(!ok, "a message that is not failed was replayed");
    assert!(err.contains("no failed message \"m-1\""), "{err}");
    let (ok, _, err) = db.ordo(&["inbox", "replay", "--all"]);
    assert!(ok, "{err}");
    assert!(err.contains("3 message(s)"), "{err}");
    let (ok, out, _) = db.ordo(&["inbox", "failed", "--json"]);
    assert!(ok && out.is_empty(), "{out}");
    let (ok, _, _) = db.ordo(&["inbox", "replay"]);
    assert!(!ok, "replay without an id or --all was accepted");

    let config = InboxConfig::new("replica").mode(InboxMode::Watermark);
    let replica = Inbox::new(db.pool.clone(), config).expect("inbox");
    let ok_handler = Recording::default();
    let message = InboxMessage::new("x", "{}").with_source("orders", 1);
    let receipt = replica
        .receive(&message, &ok_handler)
        .await
        .expect("receive");
    assert_eq!(receipt, Receipt::Handled);
    let (ok, out, _) = db.ordo(&["inbox", "watermarks"]);
    assert!(ok);
    assert!(
        out.lines()
            .any(|l| l.contains("replica") && l.contains("orders")),
        "{out}"
    );
}
