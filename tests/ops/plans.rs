//! No statement on ordo's hot paths is planned for JIT compilation on a stock server.
//!
//! PostgreSQL compiles a plan whose cost estimate crosses `jit_above_cost`, which costs
//! hundreds of milliseconds on statements that execute in microseconds (the commit lane once
//! stalled for half a second at every start and every lost compare-and-set because of it).
//! Estimates are at their worst on a fresh database, so each statement is planned there, as a
//! custom plan and as a generic one (what a prepared statement may switch to), and again once
//! the tables hold data and statistics.

use crate::common;

use common::{Note, TestDb};
use ordo::{HotStatement, Outbox, OutboxConfig, Start};
use sqlx::{Acquire, PgConnection};

/// The plan's total cost, and whether the server would JIT-compile it.
async fn plan(conn: &mut PgConnection, mode: &str, statement: &HotStatement) -> (f64, bool) {
    let explained = explain(conn, mode, statement).await;
    let top = &explained[0];
    let cost = top["Plan"]["Total Cost"].as_f64().expect("a total cost");
    (cost, top.get("JIT").is_some())
}

/// `EXPLAIN (FORMAT JSON)` of `statement` prepared under `plan_cache_mode = mode`.
async fn explain(
    conn: &mut PgConnection,
    mode: &str,
    statement: &HotStatement,
) -> serde_json::Value {
    let (sql, types, args) = (statement.sql, statement.types, statement.args);
    let mut tx = conn.begin().await.expect("begin");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SET LOCAL plan_cache_mode = {mode}"
    )))
    .execute(&mut *tx)
    .await
    .expect("plan cache mode");
    // Planned as on the connections it runs on.
    for (name, value) in statement.session {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("SET LOCAL {name} = {value}")))
            .execute(&mut *tx)
            .await
            .expect("session setting");
    }
    let prepare = if types.is_empty() {
        format!("PREPARE hot AS {sql}")
    } else {
        format!("PREPARE hot({types}) AS {sql}")
    };
    sqlx::raw_sql(sqlx::AssertSqlSafe(prepare))
        .execute(&mut *tx)
        .await
        .unwrap_or_else(|e| panic!("prepare failed: {e}\n{sql}"));
    let execute = if args.is_empty() {
        "EXECUTE hot".to_owned()
    } else {
        format!("EXECUTE hot({args})")
    };
    let explained: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (FORMAT JSON) {execute}"
    )))
    .fetch_one(&mut *tx)
    .await
    .unwrap_or_else(|e| panic!("explain failed: {e}\n{sql}"));
    // Not committed: PREPARE is session state, so drop it explicitly.
    sqlx::raw_sql("DEALLOCATE hot")
        .execute(&mut *tx)
        .await
        .expect("deallocate");
    tx.rollback().await.expect("rollback");
    explained
}

/// Index conditions with an array (`= ANY (...)`) under the inner side of a nested loop: each
/// outer row would walk the whole array again.
fn arrays_probed_per_row(node: &serde_json::Value, inner: bool, found: &mut Vec<String>) {
    let condition = node["Index Cond"]
        .as_str()
        .or_else(|| node["Recheck Cond"].as_str());
    if inner
        && let Some(condition) = condition
        && condition.contains("ANY")
    {
        found.push(format!(
            "{} on {}: {condition}",
            node["Node Type"], node["Relation Name"]
        ));
    }
    let loop_join = node["Node Type"] == "Nested Loop";
    for child in node["Plans"].as_array().into_iter().flatten() {
        let child_inner = inner || (loop_join && child["Parent Relationship"] == "Inner");
        arrays_probed_per_row(child, child_inner, found);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_hot_path_plan_walks_an_array_once_per_row_even_when_generic() {
    // Written as one join, the generic plan probed the commit_xid index once per group with
    // the whole array as a second key: 2.3 s for one append of 5,000 groups instead of 19 ms.
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.expect("acquire");
    let mut found = Vec::new();
    for statement in ordo::hot_path_statements() {
        for mode in ["force_custom_plan", "force_generic_plan"] {
            let explained = explain(&mut conn, mode, &statement).await;
            let mut here = Vec::new();
            arrays_probed_per_row(&explained[0]["Plan"], false, &mut here);
            found.extend(
                here.into_iter()
                    .map(|scan| format!("{} ({mode}): {scan}", statement.name)),
            );
        }
    }
    assert!(found.is_empty(), "arrays walked per row: {found:#?}");
}

async fn check_every_statement(db: &TestDb, when: &str) {
    let mut conn = db.pool.acquire().await.expect("acquire");
    let jit: String = sqlx::query_scalar("SHOW jit")
        .fetch_one(&mut *conn)
        .await
        .expect("jit");
    let threshold: f64 = sqlx::query_scalar::<_, String>("SHOW jit_above_cost")
        .fetch_one(&mut *conn)
        .await
        .expect("jit_above_cost")
        .parse()
        .expect("a number");
    let mut failures = Vec::new();
    for statement in ordo::hot_path_statements() {
        for mode in ["force_custom_plan", "force_generic_plan"] {
            let (cost, compiled) = plan(&mut conn, mode, &statement).await;
            // The cost bound holds whether or not this server was built with LLVM.
            if compiled || cost >= threshold {
                failures.push(format!(
                    "{} ({mode}): cost {cost:.0} (jit_above_cost {threshold:.0}, jit {jit}), compiled: {compiled}",
                    statement.name
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{when}: statements planned for JIT compilation:\n{}",
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_hot_path_statement_is_jit_compiled_on_a_fresh_database() {
    let db = TestDb::new().await;
    check_every_statement(&db, "fresh database").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_hot_path_statement_is_jit_compiled_once_the_tables_hold_data() {
    let db = TestDb::new().await;
    let outbox = Outbox::<Note>::new(db.pool.clone(), OutboxConfig::default())
        .await
        .expect("outbox");
    for batch in 0..20u32 {
        let mut tx = outbox.begin().await.expect("begin");
        tx.publish_all((0..500).map(|n| Note {
            writer: 0,
            n: batch * 500 + n,
        }))
        .expect("publish");
        tx.commit().await.expect("commit");
    }
    let mut committed = outbox.listen_committed(Start::Beginning);
    let mut seen = 0u64;
    while seen < 10_000 {
        use futures::StreamExt;
        let item = committed.next().await.expect("stream open").expect("event");
        seen = item.commit_sequence.get();
    }
    outbox.shutdown().await;
    sqlx::raw_sql("ANALYZE")
        .execute(&db.pool)
        .await
        .expect("analyze");
    check_every_statement(&db, "10,000 events, analyzed").await;
}

/// The rows a plan's scans of `relation` returned, summed over the plan tree.
fn rows_read_from(node: &serde_json::Value, relation: &str) -> f64 {
    let own = if node["Relation Name"].as_str() == Some(relation) {
        node["Actual Rows"].as_f64().unwrap_or(0.0) * node["Actual Loops"].as_f64().unwrap_or(1.0)
    } else {
        0.0
    };
    let below: f64 = node["Plans"]
        .as_array()
        .map(|plans| plans.iter().map(|p| rows_read_from(p, relation)).sum())
        .unwrap_or(0.0);
    own + below
}

/// A range of the log reads the chunks that hold it, not every chunk that begins within 1,024
/// positions below it: with one-event appends (a trickle of single-event transactions) that
/// was a thousand chunks per call, and every catch-up of a folding peer paid for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_range_reads_only_the_chunks_that_hold_it() {
    let db = TestDb::new().await;
    // One full chunk (positions 1 to 1,024), then 2,000 chunks of one entry each.
    sqlx::raw_sql(
        "INSERT INTO ordo.commit_chunks
             (first_commit_seq, last_commit_seq, min_sequence, max_sequence, sequences, group_last)
         SELECT 1, 1024, 1, 1024, array_agg(g ORDER BY g), array_agg(g % 2 = 0 ORDER BY g)
         FROM generate_series(1, 1024) AS g;
         INSERT INTO ordo.commit_chunks
             (first_commit_seq, last_commit_seq, min_sequence, max_sequence, sequences, group_last)
         SELECT g, g, g, g, ARRAY[g], ARRAY[true] FROM generate_series(1025, 3024) AS g;
         ANALYZE ordo.commit_chunks;",
    )
    .execute(&db.pool)
    .await
    .expect("chunks");

    // What comes back: the range exactly, from inside the full chunk on into the small ones.
    for (after, upto) in [
        (3000, 3010),
        (500, 1030),
        (0, 3),
        (1023, 1025),
        (3020, 4000),
    ] {
        let rows: Vec<(i64, i64, bool)> =
            sqlx::query_as("SELECT * FROM ordo.commit_log_range($1, $2)")
                .bind(after)
                .bind(upto)
                .fetch_all(&db.pool)
                .await
                .expect("range");
        let expected: Vec<(i64, i64, bool)> = (after + 1..=upto.min(3024))
            .map(|p| (p, p, p > 1024 || p % 2 == 0))
            .collect();
        assert_eq!(rows, expected, "commit_log_range({after}, {upto})");
    }

    // What it reads: the ten one-entry chunks holding 3,001 to 3,010 (and the index descent's
    // one row), not the thousand that begin within 1,024 positions below.
    let explained: serde_json::Value = sqlx::query_scalar(
        "EXPLAIN (ANALYZE, FORMAT JSON) SELECT * FROM ordo.commit_log_range(3000, 3010)",
    )
    .fetch_one(&db.pool)
    .await
    .expect("explain");
    let read = rows_read_from(&explained[0]["Plan"], "commit_chunks");
    assert!(
        read <= 12.0,
        "read {read} chunk rows for 10 positions: {explained}"
    );
}

/// Sequential scans, in a plan, of the tables that grow without bound: the partitions of
/// `ordo.events` and the commit log's chunks.
fn growing_tables_scanned(node: &serde_json::Value, found: &mut Vec<String>) {
    let relation = node["Relation Name"].as_str().unwrap_or_default();
    if node["Node Type"] == "Seq Scan"
        && (relation.starts_with("events") || relation == "commit_chunks")
    {
        found.push(relation.to_owned());
    }
    for child in node["Plans"].as_array().into_iter().flatten() {
        growing_tables_scanned(child, found);
    }
}

/// The fold's statements read by index even in a generic plan made from the statistics of a
/// few hundred events: autovacuum's first ANALYZE of a fresh database (or of a partition that
/// has just started to fill) sees about that many, and a plan made from them scanned
/// `events_p0` sequentially in every append, and went on doing so while the partition grew,
/// until the next ANALYZE up to a minute later (13 to 198 ms per append, the
/// fold up to 12,000 events behind eight writers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fold_reads_by_index_even_with_plans_made_while_the_events_were_few() {
    let db = TestDb::new().await;
    for n in 0..300 {
        // One transaction each, as writers commit them: 300 transaction ids.
        sqlx::query("INSERT INTO ordo.events (payload) VALUES (jsonb_build_object('n', $1::int))")
            .bind(n)
            .execute(&db.pool)
            .await
            .expect("insert");
    }
    sqlx::raw_sql("ANALYZE ordo.events")
        .execute(&db.pool)
        .await
        .expect("analyze");
    let mut conn = db.pool.acquire().await.expect("acquire");
    let mut checked = 0;
    let mut found = Vec::new();
    for statement in ordo::hot_path_statements() {
        if std::env::var_os("ORDO_PLANS_ALL").is_none() && statement.session.is_empty() {
            continue;
        }
        checked += 1;
        let explained = explain(&mut conn, "force_generic_plan", &statement).await;
        let mut here = Vec::new();
        growing_tables_scanned(&explained[0]["Plan"], &mut here);
        found.extend(
            here.into_iter()
                .map(|relation| format!("{}: Seq Scan on {relation}", statement.name)),
        );
    }
    assert!(checked >= 3, "the sequencer's statements were not found");
    assert!(
        found.is_empty(),
        "generic plans that read a growing table sequentially: {found:#?}"
    );
}
