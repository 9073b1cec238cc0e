//! One CLI grammar: every command's `--help` is walked, each command is documented in
//! `docs/operations.md`, every list command lists when bare and takes what its `list` takes,
//! every unknown name, key or id is an error naming it, a missing argument names each way to
//! give it, and every usage line is true (its positionals in order, no option shown as
//! required that the environment gives).
#![cfg(feature = "cli")]

use crate::common;

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

/// What running a command should do, against a migrated database with nothing in it but a
/// subscription `projection` and a relay `mailer`.
enum Expect {
    /// It succeeds (a list command run bare, or a harmless one).
    Succeeds,
    /// It succeeds and prints each of these (a heading, so that an empty list says so).
    Prints(&'static [&'static str]),
    /// It fails, and its error contains each of these (the name it could not find, the
    /// alternatives it needs).
    FailsNaming(&'static [&'static str]),
    /// Not run here (it runs until a signal); covered by its own tests.
    NotRun(&'static str),
}
use Expect::{FailsNaming, NotRun, Prints, Succeeds};

/// Every command, with at least one case each: the walk fails on a command missing here.
const CASES: &[(&str, Expect)] = &[
    ("migrate", Succeeds),
    ("tail --limit 1", Succeeds),
    ("fold", NotRun("runs until SIGINT; tests/cli/processes.rs")),
    ("status", Succeeds),
    ("retention", Succeeds),
    (
        "grant",
        FailsNaming(&["--writer", "--reader", "--operator"]),
    ),
    ("subscriptions", Succeeds),
    ("subscriptions --json", Prints(&["\"name\":\"projection\""])),
    ("subscriptions list", Succeeds),
    (
        "subscriptions list --json",
        Prints(&["\"name\":\"projection\""]),
    ),
    (
        "subscriptions --json list",
        FailsNaming(&["'list' cannot be used with '--json'"]),
    ),
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
        "subscriptions retry-keys projection no-such-key",
        FailsNaming(&["\"no-such-key\"", "\"projection\""]),
    ),
    ("subscriptions retry-keys projection --all", Succeeds),
    (
        "subscriptions backlog no-such",
        FailsNaming(&["\"no-such\""]),
    ),
    (
        "subscriptions backlog projection",
        Prints(&["KEY", "EVENTS"]),
    ),
    (
        "subscriptions skip-stalled projection k",
        FailsNaming(&["\"k\"", "nothing to drop"]),
    ),
    (
        "subscriptions skip-stalled no-such k --yes",
        FailsNaming(&["\"no-such\""]),
    ),
    (
        "subscriptions purge-backlog projection k",
        FailsNaming(&["\"k\"", "nothing to drop"]),
    ),
    (
        "subscriptions purge-backlog projection k --yes",
        FailsNaming(&["\"k\"", "\"projection\""]),
    ),
    ("status --check", Succeeds),
    ("status --max-backlog 5", FailsNaming(&["--check"])),
    (
        "subscriptions delete no-such",
        FailsNaming(&["\"no-such\""]),
    ),
    (
        "subscriptions adopt no-such --role postgres",
        FailsNaming(&["\"no-such\""]),
    ),
    ("dead-letters", Succeeds),
    ("dead-letters --json", Succeeds),
    (
        "dead-letters --subscription projection",
        Prints(&["SUBSCRIPTION"]),
    ),
    (
        "dead-letters --subscription no-such",
        FailsNaming(&["\"no-such\""]),
    ),
    ("dead-letters list", Succeeds),
    ("dead-letters list --json", Succeeds),
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
    ("inbox", Prints(&["watermarks", "failed messages"])),
    (
        "inbox --json",
        Prints(&["{\"watermarks\":[],\"failed\":[]}"]),
    ),
    ("inbox --consumer no-such", FailsNaming(&["\"no-such\""])),
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
    ("relay", Prints(&["mailer"])),
    ("relay --json", Prints(&["\"name\":\"mailer\""])),
    ("relay list", Succeeds),
    ("relay list --json", Prints(&["\"name\":\"mailer\""])),
    ("relay run", FailsNaming(&["NAME", "--config"])),
    (
        "relay run mine --sink webhook",
        NotRun("runs until SIGTERM; tests/relay/cli.rs"),
    ),
    ("relay parked no-such", FailsNaming(&["\"no-such\""])),
    (
        "relay parked projection",
        FailsNaming(&["\"projection\"", "a subscription, not a relay"]),
    ),
    ("relay requeue no-such", FailsNaming(&["<KEY|--all>"])),
    ("relay requeue no-such --all", FailsNaming(&["\"no-such\""])),
    (
        "relay requeue mailer no-such-key",
        FailsNaming(&["\"no-such-key\"", "\"mailer\""]),
    ),
    (
        "relay replay no-such --from 1",
        FailsNaming(&["\"no-such\""]),
    ),
    ("relay resume no-such", FailsNaming(&["\"no-such\""])),
    ("relay attempts no-such 1", FailsNaming(&["\"no-such\""])),
    (
        "relay attempts mailer 99999",
        FailsNaming(&["position 99999", "ends at 0"]),
    ),
    (
        "relay replay mailer --from 99999",
        FailsNaming(&["from commit position 99999", "--from takes 1 to 0"]),
    ),
    ("secrets", Prints(&["TYPE", "KEY"])),
    ("secrets --json", Succeeds),
    ("secrets list", Prints(&["TYPE", "KEY"])),
    ("secrets list --json", Succeeds),
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
            "no grammar case for `ordo {command}` in tests/cli/grammar.rs CASES"
        );
    }
}

/// The long options `help` lists under `Options:`.
fn options(help: &str) -> BTreeSet<String> {
    help.lines()
        .skip_while(|line| *line != "Options:")
        .skip(1)
        .filter_map(|line| {
            let line = line.trim_start();
            let line = line.strip_prefix("-h, ").unwrap_or(line);
            let option = line.split_whitespace().next()?;
            option.starts_with("--").then(|| option.to_owned())
        })
        .collect()
}

/// The positional arguments `help` lists under `Arguments:`, in order (`NAME`, `KEY`).
fn positionals(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| *line != "Arguments:")
        .skip(1)
        .take_while(|line| line.is_empty() || line.starts_with(' '))
        .filter(|line| line.starts_with("  ") && !line.starts_with("   "))
        .filter_map(|line| {
            let name = line.split_whitespace().next()?;
            Some(
                name.trim_matches(|c| matches!(c, '<' | '>' | '[' | ']' | '.'))
                    .to_owned(),
            )
        })
        .collect()
}

#[test]
fn every_parent_that_lists_takes_what_its_list_takes() {
    let paths = walk();
    let mut parents = 0;
    for path in paths
        .iter()
        .filter(|path| path.last().is_some_and(|p| p == "list"))
    {
        let parent = &path[..path.len() - 1];
        let help = |words: &[String]| {
            let mut args: Vec<&str> = words.iter().map(String::as_str).collect();
            args.push("--help");
            ordo_offline(&args).1
        };
        let (of_list, of_parent) = (options(&help(path)), options(&help(parent)));
        let missing: Vec<&String> = of_list.difference(&of_parent).collect();
        assert!(
            missing.is_empty(),
            "`ordo {}` lists but refuses {missing:?}, which `ordo {}` takes",
            parent.join(" "),
            path.join(" ")
        );
        parents += 1;
    }
    assert!(
        parents >= 4,
        "the walk found the listing parents: {parents}"
    );
}

#[test]
fn every_usage_line_shows_the_positionals_in_the_order_they_are_given() {
    for path in walk() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let (_, help, _) = ordo_offline(&args);
        let usage = help
            .lines()
            .find(|line| line.starts_with("Usage: "))
            .unwrap_or_default();
        let at = |name: &str| {
            ["<", "[", "|"].iter().find_map(|open| {
                let found = usage.find(&format!("{open}{name}"))?;
                let after = usage[found + open.len() + name.len()..].chars().next();
                matches!(after, Some('>' | ']' | '|' | '.')).then_some(found)
            })
        };
        let order: Vec<(String, Option<usize>)> = positionals(&help)
            .into_iter()
            .map(|name| {
                let found = at(&name);
                (name, found)
            })
            .collect();
        for (name, found) in &order {
            assert!(found.is_some(), "{usage:?} does not show {name}:\n{help}");
        }
        assert!(
            order.windows(2).all(|pair| pair[0].1 < pair[1].1),
            "{usage:?} shows the positionals out of their order {:?}",
            order.iter().map(|(name, _)| name).collect::<Vec<_>>()
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
    sqlx::query(
        "INSERT INTO ordo.subscriptions (name, lane, position, kind) VALUES \
         ('projection', 'insert', 0, 'subscription'), ('mailer', 'commit', 0, 'relay')",
    )
    .execute(&db.pool)
    .await
    .expect("a subscription's and a relay's rows");
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
        // DATABASE_URL is set: an option the environment gives is not shown as required.
        if err
            .lines()
            .any(|line| line.starts_with("Usage:") && line.contains("--database-url"))
        {
            failures.push(format!("--database-url in a usage line: {shown}"));
        }
        match expect {
            Succeeds if !ok => failures.push(shown),
            Prints(_) if !ok => failures.push(shown),
            Prints(parts) => {
                if let Some(part) = parts.iter().find(|part| !out.contains(**part)) {
                    failures.push(format!("missing {part:?} in {shown}"));
                }
            }
            FailsNaming(_) if ok => failures.push(shown),
            FailsNaming(parts) => {
                if let Some(part) = parts.iter().find(|part| !err.contains(**part)) {
                    failures.push(format!("missing {part:?} in {shown}"));
                }
                if err.contains(" at line ") {
                    failures.push(format!("PostgreSQL's source line shown: {shown}"));
                }
                if args.contains(" replay ") && err.contains("--force") {
                    failures.push(format!("a replay answered in reset's terms: {shown}"));
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
