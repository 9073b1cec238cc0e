//! `ordo status` warns of what an operator must act on that is not a stall: a schema
//! migrated by a newer ordo, and events in the default partition (the partitions made ahead
//! ran out). Both are warnings, not failures; both are in `OutboxStatus` too. And a dirty
//! migration's error names ordo's own history table, `ordo._sqlx_migrations`.
#![cfg(feature = "cli")]

use crate::common;

use common::TestDb;
use ordo::RetentionConfig;

/// A version later than any migration this build embeds.
const FUTURE: i64 = 29_991_231_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_warns_when_a_newer_ordo_migrated_the_database() {
    let db = TestDb::new().await;
    let status = ordo::admin::status(&db.pool).await.expect("status");
    assert!(status.unknown_migrations.is_empty(), "{status:#?}");
    assert!(status.warnings.is_empty(), "{status:#?}");

    // What a newer ordo's migrate leaves behind.
    sqlx::query(
        "INSERT INTO ordo._sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES ($1, 'from a newer ordo', true, '\\x00'::bytea, 1)",
    )
    .bind(FUTURE)
    .execute(&db.pool)
    .await
    .expect("record a migration this build does not know");
    let status = ordo::admin::status(&db.pool).await.expect("status");
    assert_eq!(status.unknown_migrations, vec![FUTURE]);
    let [warning] = status.warnings.as_slice() else {
        panic!("one warning: {status:#?}");
    };
    assert!(
        warning.contains("ordo._sqlx_migrations")
            && warning.contains(&FUTURE.to_string())
            && warning.contains("a newer ordo migrated this database"),
        "{warning}"
    );

    let (ok, out, err) = db.ordo(&["status"]);
    assert!(ok, "a warning, not a failure: {err}");
    assert!(
        out.contains("warning: ordo._sqlx_migrations holds 1 migration(s) this ordo does not know"),
        "{out}"
    );
    let (ok, metrics, _) = db.ordo(&["status", "--prometheus"]);
    assert!(
        ok && metrics.contains("ordo_unknown_migrations 1"),
        "{metrics}"
    );
    let (ok, json, _) = db.ordo(&["status", "--json"]);
    assert!(
        ok && json.contains(&format!("\"unknown_migrations\":[{FUTURE}]")),
        "{json}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_warns_of_events_in_the_default_partition_and_says_what_to_run() {
    // Partitions of 100 sequences: the migration's three cover 1 to 300.
    let db = TestDb::with_partition_size(Some(100)).await;
    sqlx::query(
        "INSERT INTO ordo.events (payload)
         SELECT jsonb_build_object('n', g) FROM generate_series(1, 350) AS g",
    )
    .execute(&db.pool)
    .await
    .expect("write past the partitions");
    let status = ordo::admin::status(&db.pool).await.expect("status");
    assert_eq!(status.default_partition_events, 50, "{status:#?}");
    let [warning] = status.warnings.as_slice() else {
        panic!("one warning: {status:#?}");
    };
    assert!(
        warning.contains("ordo.events_default holds 50 events (sequences 301 to 350)")
            && warning.contains("ordo retention --apply"),
        "{warning}"
    );
    let (ok, out, err) = db.ordo(&["status"]);
    assert!(ok, "a warning, not a failure: {err}");
    assert!(
        out.contains("warning: ordo.events_default holds 50 events"),
        "{out}"
    );
    let (ok, metrics, _) = db.ordo(&["status", "--prometheus"]);
    assert!(
        ok && metrics.contains("ordo_default_partition_events 50"),
        "{metrics}"
    );

    // What the warning says to do ends it.
    ordo::admin::run_retention(&db.pool, &RetentionConfig::new())
        .await
        .expect("fold the default partition");
    let status = ordo::admin::status(&db.pool).await.expect("status");
    assert_eq!(status.default_partition_events, 0, "{status:#?}");
    assert!(status.warnings.is_empty(), "{status:#?}");
    let (ok, out, _) = db.ordo(&["status"]);
    assert!(ok && !out.contains("warning:"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dirty_migration_is_reported_naming_ordos_history_table() {
    let db = TestDb::new().await;
    let newest: i64 = sqlx::query_scalar(
        "UPDATE ordo._sqlx_migrations SET success = false
         WHERE version = (SELECT max(version) FROM ordo._sqlx_migrations)
         RETURNING version",
    )
    .fetch_one(&db.pool)
    .await
    .expect("mark the newest migration unfinished");
    let error = ordo::migrate(&db.pool)
        .await
        .err()
        .map(|error| error.to_string())
        .unwrap_or_default();
    assert!(
        error.contains(&format!("migration {newest} is partially applied"))
            && error.contains(&format!(
                "DELETE FROM ordo._sqlx_migrations WHERE version = {newest}"
            ))
            && !error.contains("`_sqlx_migrations`"),
        "{error}"
    );
    // Another process is told the same, and not left waiting: the failed run's connection,
    // which held the migrator's advisory lock, was closed rather than pooled.
    let (ok, _, err) = db.ordo(&["migrate"]);
    assert!(!ok && err.contains("ordo._sqlx_migrations"), "{err}");
}
