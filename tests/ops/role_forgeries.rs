//! Least privilege, the rest (2026-12-07). The forgeries still open after
//! `tests/ops/least_privilege.rs`, each tried as every role `ordo grant` makes, and each role's own
//! job done before and after:
//! - a consumer role moving another consumer's inbox watermark, marking its messages (handled,
//!   failed, deleted), or pre-recording a message it has not received yet: refused by row
//!   security keyed on the role each consumer name belongs to (`ordo.inbox_consumers`);
//! - a role adopting a subscription row from before roles were recorded: only an operator
//!   assigns it (`ordo subscriptions adopt`), and the upgrade assigns old rows and inbox
//!   consumers to the one role that could have written them;
//! - a writer calling the commit log's append inside its own publishing transaction: refused.
#![cfg(feature = "cli")]

use crate::common;

use std::time::Duration;

use common::Note;
use common::invariants::{ORDO, check_log};
use common::roles::{Roles, denied, denied_ordo, url_as};
use common::subscribers::Seen;
use ordo::inbox::{Inbox, InboxConfig, InboxHandler, InboxMessage, InboxMode, Receipt};
use ordo::{Error, HandlerError, JobConfig, Outbox, OutboxConfig};
use sqlx::{PgConnection, PgPool};

const PATIENCE: Duration = Duration::from_secs(30);

/// Handles every message.
struct Takes;

impl InboxHandler for Takes {
    async fn handle(&self, _tx: &mut PgConnection, _m: &InboxMessage) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// Fails every message.
struct Fails;

impl InboxHandler for Fails {
    async fn handle(&self, _tx: &mut PgConnection, _m: &InboxMessage) -> Result<(), HandlerError> {
        Err("refused by the test".into())
    }
}

async fn rows_affected(pool: &PgPool, sql: &str) -> u64 {
    sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .rows_affected()
}

/// The consumer's rows of the inbox tables, as text, in a stable order.
async fn inbox_rows(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT t::text FROM (
             SELECT consumer, message_id, status, attempts FROM ordo.inbox
             WHERE consumer IN ('billing', 'ledger') ORDER BY consumer, message_id) AS t
         UNION ALL
         SELECT t::text FROM (
             SELECT consumer, source, position, failing_position, attempts FROM ordo.inbox_watermarks
             WHERE consumer IN ('billing', 'ledger') ORDER BY consumer, source) AS t",
    )
    .fetch_all(pool)
    .await
    .expect("the inbox rows")
}

/// A consumer's two inboxes: `billing` (a row per message) and `ledger` (a watermark for
/// source `orders-db`).
struct Inboxes {
    billing: Inbox,
    ledger: Inbox,
}

impl Inboxes {
    fn of(pool: &PgPool) -> Inboxes {
        Inboxes {
            billing: Inbox::new(pool.clone(), InboxConfig::new("billing").max_attempts(1))
                .expect("a row inbox"),
            ledger: Inbox::new(
                pool.clone(),
                InboxConfig::new("ledger").mode(InboxMode::Watermark),
            )
            .expect("a watermark inbox"),
        }
    }

    async fn row(&self, id: &str) -> Receipt {
        self.billing
            .receive(&InboxMessage::new(id, "{}"), &Takes)
            .await
            .expect("a row receipt")
    }

    async fn at(&self, position: u64) -> Receipt {
        let message =
            InboxMessage::new(format!("p{position}"), "{}").with_source("orders-db", position);
        self.ledger
            .receive(&message, &Takes)
            .await
            .expect("a watermark receipt")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_role_moves_or_marks_another_consumers_inbox_and_each_receives_its_own() {
    let roles = Roles::new(1_000_000).await;
    let consumer = roles.pool_as(&roles.consumer, 3).await;
    let mine = Inboxes::of(&consumer);
    for id in ["m1", "m2"] {
        assert_eq!(mine.row(id).await, Receipt::Handled);
    }
    let failed = mine
        .billing
        .receive(&InboxMessage::new("m3", "{}"), &Fails)
        .await
        .expect("a failed receipt");
    assert!(matches!(failed, Receipt::Failed { .. }), "{failed:?}");
    for position in 1..=3 {
        assert_eq!(mine.at(position).await, Receipt::Handled);
    }
    let before = inbox_rows(&roles.admin).await;

    for role in [&roles.other, &roles.writer] {
        let pool = roles.pool_as(role, 2).await;
        // Its own inbox still works, under a name of its own.
        let own =
            Inbox::new(pool.clone(), InboxConfig::new(format!("{role}-inbox"))).expect("an inbox");
        let receipt = own
            .receive(&InboxMessage::new("x", "{}"), &Takes)
            .await
            .expect("its own inbox");
        assert_eq!(receipt, Receipt::Handled, "{role}");
        // Another's rows: nothing matches.
        for sql in [
            "UPDATE ordo.inbox_watermarks SET position = 100 WHERE consumer = 'ledger'",
            "UPDATE ordo.inbox SET status = 'pending', attempts = 0 WHERE consumer = 'billing'",
            "DELETE FROM ordo.inbox WHERE consumer = 'billing'",
        ] {
            assert_eq!(rows_affected(&pool, sql).await, 0, "{role} ran {sql}");
        }
        // New rows in its name: refused by the policies.
        for sql in [
            "INSERT INTO ordo.inbox (consumer, message_id, status, completed_at) \
             VALUES ('billing', 'm9', 'completed', now())",
            "INSERT INTO ordo.inbox_watermarks (consumer, source, position) VALUES ('ledger', 'other-db', 50)",
            "INSERT INTO ordo.inbox_watermarks (consumer, source, position) VALUES ('ledger', 'orders-db', 50) \
             ON CONFLICT (consumer, source, route) DO UPDATE SET position = EXCLUDED.position",
        ] {
            let result = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&pool).await;
            assert!(denied(result), "{role} ran {sql}");
        }
        // The registry: a role names only itself, and changes no name.
        let squat =
            sqlx::query("INSERT INTO ordo.inbox_consumers (name, role) VALUES ('squat', $1)")
                .bind(&roles.consumer)
                .execute(&pool)
                .await;
        assert!(denied(squat), "{role} named a consumer for another role");
        let moved = sqlx::query("UPDATE ordo.inbox_consumers SET role = current_user")
            .execute(&pool)
            .await;
        assert!(denied(moved), "{role} took a consumer name");
        // Through ordo: refused in one line, naming both roles.
        let theirs = Inboxes::of(&pool);
        match theirs
            .billing
            .receive(&InboxMessage::new("m9", "{}"), &Takes)
            .await
        {
            Err(Error::NotOwnInbox {
                consumer,
                owner,
                connected,
            }) => assert_eq!(
                (consumer.as_str(), owner.as_str(), connected.as_str()),
                ("billing", roles.consumer.as_str(), role.as_str())
            ),
            other => panic!("{role} received for billing: {other:?}"),
        }
        let moved = ordo::inbox::set_watermark(&pool, "ledger", "orders-db", 100).await;
        assert!(denied_ordo(moved), "{role} moved the mark");
        pool.close().await;
    }
    for role in [&roles.publisher, &roles.sequencer, &roles.reader] {
        let pool = roles.pool_as(role, 1).await;
        for sql in [
            "UPDATE ordo.inbox_watermarks SET position = 100 WHERE consumer = 'ledger'",
            "INSERT INTO ordo.inbox (consumer, message_id, status, completed_at) \
             VALUES ('billing', 'm9', 'completed', now())",
            "INSERT INTO ordo.inbox_consumers (name) VALUES ('mine')",
        ] {
            let result = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&pool).await;
            assert!(denied(result), "{role} ran {sql}");
        }
        pool.close().await;
    }
    assert_eq!(inbox_rows(&roles.admin).await, before);

    // The consumer goes on: m9 is a new message to it, the mark is where it left it.
    assert_eq!(mine.row("m9").await, Receipt::Handled);
    assert_eq!(mine.row("m1").await, Receipt::Duplicate);
    assert_eq!(mine.at(3).await, Receipt::Duplicate);
    assert_eq!(mine.at(4).await, Receipt::Handled);
    // The operator administers every consumer's rows.
    let operator = roles.pool_as(&roles.operator, 1).await;
    ordo::inbox::replay(&operator, Some("billing"), "m3")
        .await
        .expect("an operator replays the consumer's failed message");
    ordo::inbox::set_watermark(&operator, "ledger", "orders-db", 5)
        .await
        .expect("an operator moves the consumer's mark");
    assert_eq!(mine.at(6).await, Receipt::Handled);
    for pool in [consumer, operator] {
        pool.close().await;
    }
}

/// An upgrade from the schema before this change: subscription rows without a role, and an
/// inbox consumer with rows. Only the consumer role may write the inbox (it is assigned the
/// consumer); several roles could run subscriptions (the row stays unassigned until an
/// operator assigns it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_from_before_roles_are_run_only_by_their_role_or_after_an_operator_assigns_them() {
    let roles = Roles::migrated_to(1_000_000, Some(20261210000100)).await;
    for role in [&roles.writer, &roles.other] {
        let sql = format!(
            "REVOKE INSERT ON ordo.inbox FROM {}",
            common::roles::quote(role)
        );
        common::roles::exec(&roles.admin, &sql).await;
    }
    let writer = roles.pool_as(&roles.writer, 6).await;
    let outbox = Outbox::<Note>::new(writer.clone(), OutboxConfig::default())
        .await
        .expect("a writer's outbox");
    let seen = Seen::default();
    let legacy = outbox
        .subscribe(JobConfig::new("legacy"), seen.clone())
        .await
        .expect("a subscription");
    legacy.shutdown().await;
    let consumer = roles.pool_as(&roles.consumer, 2).await;
    upgrade_from_before_roles(&roles, &consumer).await;
    no_role_takes_the_old_subscription_for_itself(&roles).await;

    // The operator assigns it (the CLI, then again: idempotent); then the writer runs it.
    let operator_url = url_as(&roles.url, &roles.operator);
    let (ok, _, err) = common::ordo_at(
        &operator_url,
        &["subscriptions", "adopt", "legacy", "--role", &roles.writer],
    );
    assert!(ok, "{err}");
    let operator = the_operator_assigns_it_and_the_writer_runs_it(&roles, &outbox, &seen).await;
    the_old_inbox_is_its_consumers_and_an_unassigned_one_waits(&roles, &consumer, &operator_url)
        .await;
    outbox.shutdown().await;
    for pool in [writer, consumer, operator] {
        pool.close().await;
    }
}

/// The consumer's inbox row as the old schema's inbox wrote it, the subscription rows as an
/// ordo from before roles were recorded wrote them, then the upgrade: it assigns the old
/// inbox consumer to the consumer role.
async fn upgrade_from_before_roles(roles: &Roles, consumer: &PgPool) {
    sqlx::query(
        "INSERT INTO ordo.inbox (consumer, message_id, status, completed_at) \
         VALUES ('old-inbox', 'a', 'completed', now())",
    )
    .execute(consumer)
    .await
    .expect("an inbox row at the old schema");
    // As an ordo from before roles were recorded wrote it.
    common::roles::exec(
        &roles.admin,
        "UPDATE ordo.subscriptions SET role = NULL, kind = NULL",
    )
    .await;

    let owner = roles.pool_as(&roles.owner, 1).await;
    ordo::migrate(&owner).await.expect("the upgrade");
    owner.close().await;
    let assigned: Option<String> =
        sqlx::query_scalar("SELECT role FROM ordo.inbox_consumers WHERE name = 'old-inbox'")
            .fetch_one(&roles.admin)
            .await
            .expect("the old consumer's name");
    assert_eq!(assigned.as_deref(), Some(roles.consumer.as_str()));
}

/// No role takes the old subscription for itself, by SQL or by starting on it.
async fn no_role_takes_the_old_subscription_for_itself(roles: &Roles) {
    for role in [&roles.other, &roles.writer, &roles.consumer] {
        let pool = roles.pool_as(role, 2).await;
        let adopted = rows_affected(
            &pool,
            "UPDATE ordo.subscriptions SET role = current_user, kind = 'subscription' WHERE name = 'legacy'",
        )
        .await;
        assert_eq!(adopted, 0, "{role} adopted the old row");
        let theirs = Outbox::<Note>::new(pool.clone(), OutboxConfig::default().sequencer(false))
            .await
            .expect("an outbox");
        match theirs
            .subscribe(JobConfig::new("legacy"), Seen::default())
            .await
        {
            Err(Error::Unadopted {
                name,
                connected,
                adopt,
                ..
            }) => {
                assert_eq!(
                    (name.as_str(), connected.as_str()),
                    ("legacy", role.as_str())
                );
                assert_eq!(
                    adopt,
                    format!("ordo subscriptions adopt legacy --role {role}")
                );
            }
            other => panic!("{role} ran the old row: {other:?}"),
        }
        theirs.shutdown().await;
        match ordo::admin::adopt_subscription(&pool, "legacy", role).await {
            Err(Error::Unadopted { .. }) => {}
            other => panic!("{role} assigned the old row: {other:?}"),
        }
        pool.close().await;
    }
    let stored: (Option<String>, Option<String>) =
        sqlx::query_as("SELECT role, kind FROM ordo.subscriptions WHERE name = 'legacy'")
            .fetch_one(&roles.admin)
            .await
            .expect("the old row");
    assert_eq!(stored, (None, None));
}

/// The operator assigns the old subscription again (idempotent), refuses another role and a
/// missing one; then the writer runs it. The operator's pool.
async fn the_operator_assigns_it_and_the_writer_runs_it(
    roles: &Roles,
    outbox: &Outbox<Note>,
    seen: &Seen,
) -> PgPool {
    let operator = roles.pool_as(&roles.operator, 1).await;
    ordo::admin::adopt_subscription(&operator, "legacy", &roles.writer)
        .await
        .expect("assigned again: nothing to do");
    match ordo::admin::adopt_subscription(&operator, "legacy", &roles.other).await {
        Err(Error::InvalidConfig { reason, .. }) => assert!(reason.contains("already"), "{reason}"),
        other => panic!("an assigned row was assigned again: {other:?}"),
    }
    match ordo::admin::adopt_subscription(&operator, "legacy", "no_such_role_anywhere").await {
        Err(Error::InvalidConfig { reason, .. }) => {
            assert!(reason.contains("does not exist"), "{reason}")
        }
        other => panic!("a missing role was accepted: {other:?}"),
    }
    let legacy = outbox
        .subscribe(JobConfig::new("legacy"), seen.clone())
        .await
        .expect("the writer runs the row assigned to it");
    let mut tx = outbox.begin().await.expect("begin");
    tx.publish(Note { writer: 1, n: 1 }).expect("publish");
    tx.commit().await.expect("commit");
    let (state, done) = legacy.wait_for(PATIENCE, |s| s.position.get() >= 1).await;
    assert!(done, "{state:?}");
    legacy.shutdown().await;

    operator
}

/// The inbox: the consumer goes on with its old name; another role is refused; an
/// unassigned old name waits for the operator (`ordo inbox adopt` as `operator_url`).
async fn the_old_inbox_is_its_consumers_and_an_unassigned_one_waits(
    roles: &Roles,
    consumer: &PgPool,
    operator_url: &str,
) {
    let old_inbox = Inbox::new(consumer.clone(), InboxConfig::new("old-inbox")).expect("inbox");
    for (id, receipt) in [("a", Receipt::Duplicate), ("b", Receipt::Handled)] {
        let received = old_inbox
            .receive(&InboxMessage::new(id, "{}"), &Takes)
            .await
            .expect("the consumer's receipt");
        assert_eq!(received, receipt, "{id}");
    }
    let other = roles.pool_as(&roles.other, 1).await;
    match Inbox::new(other.clone(), InboxConfig::new("old-inbox"))
        .expect("inbox")
        .receive(&InboxMessage::new("c", "{}"), &Takes)
        .await
    {
        Err(Error::NotOwnInbox { owner, .. }) => assert_eq!(owner, roles.consumer),
        other => panic!("another role received for the old consumer: {other:?}"),
    }
    other.close().await;
    common::roles::exec(
        &roles.admin,
        "INSERT INTO ordo.inbox_consumers (name, role) VALUES ('unknown-inbox', NULL)",
    )
    .await;
    let unknown = Inbox::new(consumer.clone(), InboxConfig::new("unknown-inbox")).expect("inbox");
    match unknown.receive(&InboxMessage::new("c", "{}"), &Takes).await {
        Err(Error::Unadopted { adopt, .. }) => assert_eq!(
            adopt,
            format!("ordo inbox adopt unknown-inbox --role {}", roles.consumer)
        ),
        other => panic!("the consumer took an unassigned name: {other:?}"),
    }
    match ordo::inbox::adopt_consumer(consumer, "unknown-inbox", &roles.consumer).await {
        Err(Error::Unadopted { .. }) => {}
        other => panic!("the consumer assigned a name itself: {other:?}"),
    }
    let (ok, _, err) = common::ordo_at(
        operator_url,
        &["inbox", "adopt", "unknown-inbox", "--role", &roles.consumer],
    );
    assert!(ok, "{err}");
    assert_eq!(
        unknown
            .receive(&InboxMessage::new("c", "{}"), &Takes)
            .await
            .expect("received once assigned"),
        Receipt::Handled
    );
}

/// (last_commit_seq, logged_through_sequence).
async fn fold_state(pool: &PgPool) -> (i64, i64) {
    sqlx::query_as("SELECT last_commit_seq, logged_through_sequence FROM ordo.sequencer_state")
        .fetch_one(pool)
        .await
        .expect("sequencer state")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commit_log_is_never_appended_inside_a_publishing_transaction() {
    let roles = Roles::new(1_000_000).await;
    for role in [&roles.writer, &roles.other] {
        let pool = roles.pool_as(role, 1).await;
        let (_, cursor) = fold_state(&roles.admin).await;
        let mut tx = pool.begin().await.expect("begin");
        let sequence: i64 = sqlx::query_scalar(
            "INSERT INTO ordo.events (payload) VALUES ('{\"writer\": 1, \"n\": 1}') RETURNING sequence",
        )
        .fetch_one(&mut *tx)
        .await
        .expect("publish");
        let appended = sqlx::query("SELECT * FROM ordo.append_commit_log($1, $2)")
            .bind(cursor)
            .bind(sequence)
            .fetch_all(&mut *tx)
            .await;
        match appended {
            Err(sqlx::Error::Database(error)) => {
                assert_eq!(error.code().as_deref(), Some("OR001"), "{error}");
                assert!(error.message().contains("published events"), "{error}");
            }
            other => panic!("{role} appended inside its publishing transaction: {other:?}"),
        }
        tx.rollback().await.expect("rollback");
        pool.close().await;
    }
    assert_eq!(fold_state(&roles.admin).await, (0, 0));

    // An append first, then publishing, in one transaction: the events come after the cursor
    // it set, and the real fold (the sequencer role's, each append a statement of its own)
    // logs them with everything the writers publish.
    let writer = roles.pool_as(&roles.writer, 4).await;
    let mut tx = writer.begin().await.expect("begin");
    let moved = sqlx::query("SELECT * FROM ordo.append_commit_log(0, 0)")
        .fetch_all(&mut *tx)
        .await
        .expect("an append that publishes nothing");
    assert_eq!(moved.len(), 1);
    sqlx::query("INSERT INTO ordo.events (payload) VALUES ('{\"writer\": 2, \"n\": 1}'), ('{\"writer\": 2, \"n\": 2}')")
        .execute(&mut *tx)
        .await
        .expect("publish after the append");
    tx.commit().await.expect("commit");
    let web = Outbox::<Note>::new(writer.clone(), OutboxConfig::default().sequencer(false))
        .await
        .expect("a writer's outbox");
    for n in 0..10 {
        let mut tx = web.begin().await.expect("begin");
        tx.publish(Note { writer: 3, n }).expect("publish");
        tx.commit().await.expect("commit");
    }
    let sequencer = roles.pool_as(&roles.sequencer, 4).await;
    let fold = Outbox::<Note>::new(sequencer.clone(), OutboxConfig::default())
        .await
        .expect("the sequencer folds");
    let events: i64 =
        sqlx::query_scalar("SELECT count(*) FROM ordo.events WHERE payload IS NOT NULL")
            .fetch_one(&roles.admin)
            .await
            .expect("events");
    let logged = common::eventually(PATIENCE, || async {
        fold_state(&roles.admin).await.0 >= events
    })
    .await;
    assert!(logged, "{:?} of {events}", fold_state(&roles.admin).await);
    fold.shutdown().await;
    web.shutdown().await;
    check_log(&roles.admin, &ORDO)
        .await
        .expect("the commit log");
    for pool in [writer, sequencer] {
        pool.close().await;
    }
}
