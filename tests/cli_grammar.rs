//! One CLI grammar (issue 30): every command's `--help` is walked, each command is documented
//! in `docs/operations.md`, every list command lists when bare, every unknown name or id is an
//! error naming it, and a missing argument names each way to give it.
#![cfg(feature = "cli")]

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use common::TestDb;

/// `ordo ARGS` with no database: (succeeded, stdout, stderr).
fn ordo_offline(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_ordo"))
        .args(args)
        .env_remove("DATABASE_URL")
        .output()
        .expect("run ordo");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The subcommands `help` lists under `Commands:`, with their one-line summaries.
fn listed(help: &str) -> Vec<(String, String)> {
    help.lines()
        .skip_while(|line| *line != "Commands:")
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| {
            let line = line.trim_start();
            let (name, summary) = line.split_once(char::is_whitespace)?;
            Some((name.to_owned(), summary.trim().to_owned()))
        })
        .filter(|(name, _)| name != "help")
        .collect()
}

/// Every command path (`["relay", "parked"]`), walking `--help` from the top; each help must
/// print, start with the summary its parent listed, and show its own path in its usage.
fn walk() -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut todo: Vec<(Vec<String>, Option<String>)> = vec![(Vec::new(), None)];
    while let Some((path, summary)) = todo.pop() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let (ok, help, err) = ordo_offline(&args);
        assert!(ok, "ordo {args:?}: {err}");
        if let Some(summary) = summary {
            assert!(
                help.starts_with(&summary),
                "`ordo {} --help` does not start with the summary its parent lists ({summary:?}):\n{help}",
                path.join(" ")
            );
            assert!(
                summary.len() <= 110,
                "`ordo {}`'s summary is one short sentence, its detail after a blank line: {summary:?}",
                path.join(" ")
            );
        }
        let usage = format!("Usage: ordo {}", path.join(" "));
        assert!(help.contains(usage.trim_end()), "{usage} in:\n{help}");
        let children = listed(&help);
        if !path.is_empty() {
            paths.push(path.clone());
        }
        for (name, summary) in children {
            let mut child = path.clone();
            child.push(name);
            todo.push((child, Some(summary)));
        }
    }
    paths.sort();
    paths
}

/// What running a command should do, against a migrated database with nothing in it.
enum Expect {
    /// It succeeds (a list command run bare, or a harmless one).
    Succeeds,
    /// It fails, and its error contains each of these (the name it could not find, the
    /// alternatives it needs).
    FailsNaming(&'static [&'static str]),
    /// Not run here (it runs until a signal); covered by its own tests.
    NotRun(&'static str),
}
use Expect::{FailsNaming, NotRun, Succeeds};

/// Every command, with at least one case each: the walk fails on a command missing here.
const CASES: &[(&str, Expect)] = &[
    ("migrate", Succeeds),
    ("tail --limit 1", Succeeds),
    ("fold", NotRun("runs until SIGINT; tests/cli.rs")),
    ("status", Succeeds),
    ("retention", Succeeds),
    (
        "grant",
        FailsNaming(&["--writer", "--reader", "--operator"]),
    ),
    ("subscriptions", Succeeds),
    ("subscriptions list", Succeeds),
    (
        "subscriptions resume no-such",
        FailsNaming(&["\"no-such\""]),
    ),
    ("subscriptions pause no-such", FailsNaming(&["\"no-such\""])),
    (
        "subscriptions reset no-such --to 0",
        FailsNaming(&["\"no-such\""]),
    ),
    (
        "subscriptions stalled no-such",
        FailsNaming(&["\"no-such\""]),
    ),
    (
        "subscriptions retry-keys no-such",
        FailsNaming(&["<KEY|--all>"]),
    ),
    (
        "subscriptions retry-keys no-such --all",
        FailsNaming(&["\"no-such\""]),
    ),
    (
        "subscriptions delete no-such",
        FailsNaming(&["\"no-such\""]),
    ),
    (
        "subscriptions adopt no-such --role postgres",
        FailsNaming(&["\"no-such\""]),
    ),
    ("dead-letters", Succeeds),
    ("dead-letters list", Succeeds),
    (
        "dead-letters list --subscription no-such",
        FailsNaming(&["\"no-such\""]),
    ),
    (
        "dead-letters retry",
        FailsNaming(&["<ID|--subscription <SUBSCRIPTION>>"]),
    ),
    ("dead-letters retry 999", FailsNaming(&["999"])),
    (
        "dead-letters retry --subscription no-such",
        FailsNaming(&["\"no-such\""]),
    ),
    (
        "dead-letters purge",
        FailsNaming(&["--older-than", "--all"]),
    ),
    (
        "dead-letters purge --all --subscription no-such",
        FailsNaming(&["\"no-such\""]),
    ),
    ("inbox", Succeeds),
    ("inbox failed", Succeeds),
    (
        "inbox failed --consumer no-such",
        FailsNaming(&["\"no-such\""]),
    ),
    ("inbox replay", FailsNaming(&["<ID|--all>"])),
    ("inbox replay no-such-id", FailsNaming(&["\"no-such-id\""])),
    (
        "inbox replay --all --consumer no-such",
        FailsNaming(&["\"no-such\""]),
    ),
    ("inbox watermarks", Succeeds),
    (
        "inbox watermarks --consumer no-such",
        FailsNaming(&["\"no-such\""]),
    ),
    (
        "inbox set-watermark no-such orders 5",
        FailsNaming(&["\"no-such\"", "\"orders\"", "--create"]),
    ),
    (
        "inbox adopt no-such --role no-such-role",
        FailsNaming(&["\"no-such-role\"", "does not exist"]),
    ),
    ("relay", Succeeds),
    ("relay list", Succeeds),
    ("relay run", FailsNaming(&["NAME", "--config"])),
    (
        "relay run mine --sink webhook",
        NotRun("runs until SIGTERM; tests/relay_cli.rs"),
    ),
    ("relay parked no-such", FailsNaming(&["\"no-such\""])),
    (
        "relay parked projection",
        FailsNaming(&["\"projection\"", "a subscription, not a relay"]),
    ),
    ("relay requeue no-such", FailsNaming(&["<KEY|--all>"])),
    ("relay requeue no-such --all", FailsNaming(&["\"no-such\""])),
    (
        "relay replay no-such --from 1",
        FailsNaming(&["\"no-such\""]),
    ),
    ("relay resume no-such", FailsNaming(&["\"no-such\""])),
    ("relay attempts no-such 1", FailsNaming(&["\"no-such\""])),
    ("secrets", Succeeds),
    ("secrets list", Succeeds),
    ("secrets add", FailsNaming(&["<KEYS>"])),
    ("secrets add password", Succeeds),
    (
        "secrets remove token",
        FailsNaming(&["token", "ordo secrets"]),
    ),
    ("secrets remove password", Succeeds),
    ("secrets scrub", Succeeds),
];

#[test]
fn every_command_has_a_walked_help_a_documented_row_and_a_grammar_case() {
    let paths = walk();
    assert!(paths.len() > 30, "the walk found the commands: {paths:?}");
    let operations =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
            .expect("docs/operations.md");
    let covered: BTreeSet<String> = CASES
        .iter()
        .map(|(args, _)| command_of(args, &paths))
        .collect();
    for path in &paths {
        let command = path.join(" ");
        assert!(
            operations.contains(&format!("| `ordo {command}")) || parent_row(&operations, path),
            "docs/operations.md has no row for `ordo {command}` in its command table"
        );
        assert!(
            covered.contains(&command),
            "no grammar case for `ordo {command}` in tests/cli_grammar.rs CASES"
        );
    }
}

/// A command documented as a row of its parent's (`ordo relay [list]`, `ordo subscriptions
/// pause|resume NAME`).
fn parent_row(operations: &str, path: &[String]) -> bool {
    let Some((leaf, parent)) = path.split_last() else {
        return false;
    };
    let parent = parent.join(" ");
    operations.lines().any(|line| {
        line.starts_with(&format!("| `ordo {parent} "))
            && (line.contains(&format!("[{leaf}]"))
                || line.contains(&format!("{leaf}\\|"))
                || line.contains(&format!("\\|{leaf} ")))
    })
}

/// The command path a case runs: the longest walked path its words start with.
fn command_of(args: &str, paths: &[Vec<String>]) -> String {
    let words: Vec<&str> = args.split_whitespace().collect();
    paths
        .iter()
        .filter(|path| path.len() <= words.len() && path.iter().zip(&words).all(|(p, w)| p == w))
        .max_by_key(|path| path.len())
        .map(|path| path.join(" "))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_lists_when_bare_and_names_what_it_cannot_find() {
    let db = TestDb::new().await;
    sqlx::query("INSERT INTO ordo.subscriptions (name, lane, position, kind) VALUES ('projection', 'insert', 0, 'subscription')")
        .execute(&db.pool)
        .await
        .expect("a subscription's row");
    let mut failures = Vec::new();
    for (args, expect) in CASES {
        let words: Vec<&str> = args.split_whitespace().collect();
        let (ok, out, err) = match expect {
            NotRun(covered_by) => {
                eprintln!("not run here: `ordo {args}` ({covered_by})");
                continue;
            }
            _ => db.ordo(&words),
        };
        let shown = format!("`ordo {args}`: ok={ok}\nstdout: {out}\nstderr: {err}");
        match expect {
            Succeeds if !ok => failures.push(shown),
            FailsNaming(_) if ok => failures.push(shown),
            FailsNaming(parts) => {
                if let Some(part) = parts.iter().find(|part| !err.contains(**part)) {
                    failures.push(format!("missing {part:?} in {shown}"));
                }
                if err.contains(" at line ") {
                    failures.push(format!("PostgreSQL's source line shown: {shown}"));
                }
            }
            _ => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_output_escapes_what_a_terminal_would_act_on() {
    let db = TestDb::new().await;
    // An error text carrying an 8-bit CSI (clear screen), DEL and a right-to-left override, as
    // a handler's error quoting a payload can: serde_json leaves all three raw.
    let hostile = "boom \u{9b}2J \u{7f} \u{202e}gnp.exe";
    sqlx::query(
        "INSERT INTO ordo.dead_letters (subscription, lane, position, sequence, error, attempts) \
         VALUES ('billing', 'insert', 1, 1, $1, 1)",
    )
    .bind(hostile)
    .execute(&db.pool)
    .await
    .expect("a dead letter");
    for args in [
        &["dead-letters", "list", "--json"][..],
        &[
            "dead-letters",
            "list",
            "--json",
            "--subscription",
            "billing",
        ][..],
    ] {
        let (ok, out, err) = db.ordo(args);
        assert!(ok, "{args:?}: {err}");
        let raw: Vec<char> = out
            .chars()
            .filter(|c| *c != '\n' && (c.is_control() || ('\u{202a}'..='\u{202e}').contains(c)))
            .collect();
        assert!(raw.is_empty(), "{args:?} printed {raw:?} raw: {out}");
        let line: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON line");
        assert_eq!(line["error"], hostile, "the same text once parsed");
    }
}
