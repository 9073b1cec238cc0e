//! A retention report as a table.

use std::fmt::Write;

use super::{Column, Left, Right, printable, table};
use crate::ops::retention::RetentionReport;

/// A retention report as `ordo retention` prints it: the positions that bound it, each
/// partition with its verdict, and what was created or folded. `applied`: the report is of a
/// run ([`run_retention`](crate::admin::run_retention)), not a plan.
pub fn retention_table(report: &RetentionReport, applied: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "partition size {}; lowest stored sequence {}; needed from sequence {} by {}",
        report.partition_size,
        report.events_floor,
        report.needed_from,
        printable(&report.needed_by)
    );
    let _ = writeln!(
        out,
        "head {}; {} partition(s) ahead of it; range partitions end before {}; {} event(s) in the default partition",
        report.head, report.partitions_ahead, report.covered_until, report.default_rows
    );
    if let Some(warning) = &report.warning {
        let _ = writeln!(out, "WARNING: {warning}");
    }
    let columns = [
        Column("PARTITION", 28, Left),
        Column("FROM", 14, Right),
        Column("TO", 14, Right),
    ];
    let rows = report.partitions.iter().map(|partition| {
        let verdict = match (partition.drop, applied) {
            (true, true) if report.dropped.contains(&partition.name) => "dropped".to_owned(),
            (true, true) => "kept: no longer droppable when its turn came".to_owned(),
            (true, false) => "would drop (past retention)".to_owned(),
            (false, _) => format!("kept: {}", printable(&partition.reason)),
        };
        let from = partition
            .from
            .map_or("MINVALUE".to_owned(), |f| f.to_string());
        (
            [partition.name.clone(), from, partition.to.to_string()],
            verdict,
        )
    });
    table(&mut out, &columns, "VERDICT", rows);
    for folded in &report.folded {
        let _ = writeln!(out, "folded the default partition into {folded}");
    }
    for created in &report.created {
        let _ = writeln!(out, "created {created}");
    }
    if !applied {
        let _ = writeln!(out, "(a plan: run with --apply to create, fold and drop)");
    }
    out
}
