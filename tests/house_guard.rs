//! House rules that need no database, checked over the files git tracks:
//!
//! - no project file cites an internal work item by number (a past work period, a sitting, an
//!   issue of the project's own tracker): a reader has no way to look one up, so the text says
//!   a date or a commit instead. `migrations/` is shipped and never edited, so it is not read.
//! - no non-test source file under `src/` passes [`MAX_FILE_LINES`] lines and no function there
//!   passes [`MAX_FN_LINES`]. Today's offenders are listed with their current size
//!   ([`LONG_FILES`], [`LONG_FNS`]): the test fails when another file or function crosses the
//!   line or a listed one grows, and says so when a listed one has shrunk (lower its entry).
//! - every module of `src/` imports only modules on floors below its own, as the `## Floors`
//!   block of ARCHITECTURE.md draws them (read from the file, so the drawing and the rule are
//!   one): `crate::` paths in code, groups, and names the crate root or `admin` re-exports.
//! - no function in a file under `tests/` passes [`MAX_TEST_FN_LINES`]: a longer test is split
//!   into named steps.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The longest a non-test source file under `src/` may be, in lines.
const MAX_FILE_LINES: usize = 400;
/// The longest a function under `src/` may be, in lines from its `fn` line to its closing brace.
const MAX_FN_LINES: usize = 80;

/// Files over [`MAX_FILE_LINES`], with their length when listed. `src/error.rs` is the public
/// `Error` enum (about 460 of its lines: each variant with what an operator does about it);
/// one enum cannot be split across files without changing the public type.
const LONG_FILES: &[(&str, usize)] = &[("src/error.rs", 490)];

/// Functions over [`MAX_FN_LINES`] when the rule was written (2026-12-07): file, name, length then. A name
/// that occurs twice in a file is held to the larger length.
const LONG_FNS: &[(&str, &str, usize)] = &[];

/// The words that, followed by a number, cite a work item. Spelled in pieces so that this
/// file does not cite one itself.
fn citation_words() -> Vec<String> {
    [
        ["iss", "ue"],
        ["iss", "ues"],
        ["sess", "ion"],
        ["sess", "ions"],
        ["sitt", "ing"],
        ["peri", "od"],
    ]
    .iter()
    .map(|parts| parts.concat())
    .collect()
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file git tracks, but the shipped migrations and build output.
fn tracked_files() -> Vec<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(root())
        .args(["ls-files", "-z"])
        .output()
        .expect("git ls-files runs");
    assert!(out.status.success(), "git ls-files failed: {out:?}");
    String::from_utf8(out.stdout)
        .expect("paths are UTF-8")
        .split('\0')
        .filter(|p| !p.is_empty())
        .filter(|p| !p.starts_with("migrations/") && !p.starts_with("target/"))
        .map(str::to_owned)
        .collect()
}

fn read_text(path: &str) -> Option<String> {
    let bytes = std::fs::read(root().join(path)).ok()?;
    String::from_utf8(bytes).ok()
}

/// After a line break, the comment markers a wrapped comment goes on with.
fn skip_line_prefix(rest: &str) -> &str {
    let rest = rest.trim_start();
    for marker in ["//!", "///", "//", "--", "#", "*", ">"] {
        if let Some(after) = rest.strip_prefix(marker) {
            return after.trim_start();
        }
    }
    rest
}

/// The citations in `text`: (line, the words cited), for a citation word (not inside another
/// word) followed by blanks, at most one line break (and a comment marker after it), an
/// optional `#` and a digit.
fn citations(text: &str) -> Vec<(usize, String)> {
    let lower = text.to_lowercase();
    let words = citation_words();
    let mut found = Vec::new();
    for word in &words {
        let mut from = 0;
        while let Some(at) = lower[from..].find(word.as_str()) {
            let start = from + at;
            let end = start + word.len();
            from = end;
            let before = lower[..start].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '-') {
                continue;
            }
            let rest = &lower[end..];
            if !rest.starts_with([' ', '\t', '\n', '\r']) {
                continue;
            }
            let gap = rest.trim_start_matches([' ', '\t']);
            let gap = match gap.strip_prefix('\n').or_else(|| gap.strip_prefix("\r\n")) {
                Some(after) => skip_line_prefix(after),
                None => gap,
            };
            let gap = gap.strip_prefix('#').unwrap_or(gap);
            if gap.starts_with(|c: char| c.is_ascii_digit()) {
                let line = lower[..start].matches('\n').count() + 1;
                let shown: String = text[start..]
                    .chars()
                    .take(word.len() + 12)
                    .collect::<String>()
                    .replace('\n', " ");
                found.push((line, shown));
            }
        }
    }
    found.sort();
    found
}

#[test]
fn no_file_cites_an_internal_work_item() {
    let mut offences = Vec::new();
    for path in tracked_files() {
        let Some(text) = read_text(&path) else {
            continue;
        };
        for (line, shown) in citations(&text) {
            offences.push(format!("{path}:{line}: {shown}"));
        }
    }
    assert!(
        offences.is_empty(),
        "{} citation(s) of internal work items; say a date or a commit instead, or drop it:\n{}",
        offences.len(),
        offences.join("\n")
    );
}

#[test]
fn the_citation_check_finds_what_it_should() {
    let (issue, session, sitting) = (
        ["Iss", "ue"].concat(),
        ["sess", "ion"].concat(),
        ["sitt", "ing"].concat(),
    );
    let cited = format!(
        "see {issue} #32, and ({session} 31)\n/// as in the {sitting}\n/// 4 of it; {session}s 10 and 11"
    );
    assert_eq!(citations(&cited).len(), 4, "{:?}", citations(&cited));
    let fine = format!(
        "--{sitting}s 4, --{session} 3, the first {sitting}, {issue}s/123 at github.com, 2 {session}s"
    );
    assert_eq!(citations(&fine), Vec::new());
}

/// Source files under `src/` that are not tests.
fn source_files() -> Vec<String> {
    tracked_files()
        .into_iter()
        .filter(|p| p.starts_with("src/") && p.ends_with(".rs"))
        .filter(|p| {
            let path = Path::new(p);
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name != "tests.rs"
                && !name.ends_with("_tests.rs")
                && !path.components().any(|c| c.as_os_str() == "tests")
        })
        .collect()
}

/// Blanks out comments and the insides of string and character literals, keeping line breaks,
/// so that braces are counted only where they are code.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if (c == 'r' || c == 'b')
            && !chars[..i]
                .last()
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
            && raw_string_hashes(&chars[i..]).is_some()
        {
            let (prefix, hashes) = raw_string_hashes(&chars[i..]).expect("checked");
            for _ in 0..prefix {
                out.push(' ');
            }
            i += prefix;
            let closing: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            while i < chars.len() && !chars[i..].starts_with(&closing) {
                out.push(blank(chars[i]));
                i += 1;
            }
            for _ in 0..closing.len().min(chars.len() - i) {
                out.push(' ');
            }
            i += closing.len();
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' {
            // A character literal ('{', '\'', '\u{7b}') or a lifetime ('a).
            let end = if next == Some('\\') {
                chars[i + 2..]
                    .iter()
                    .position(|&c| c == '\'')
                    .map(|p| i + 2 + p)
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(end) => {
                    for _ in i..=end {
                        out.push(' ');
                    }
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// For a raw string literal at the start of `s` (`r"`, `r#"`, `br#"`): the length of its
/// opening and its number of `#`.
fn raw_string_hashes(s: &[char]) -> Option<(usize, usize)> {
    let mut i = 0;
    if s.first() == Some(&'b') {
        i += 1;
    }
    if s.get(i) != Some(&'r') {
        return None;
    }
    i += 1;
    let hashes = s[i..].iter().take_while(|&&c| c == '#').count();
    i += hashes;
    (s.get(i) == Some(&'"')).then_some((i + 1, hashes))
}

/// The name of the function a line declares: the line starts (after blanks) with an optional
/// visibility (`pub`, `pub(crate)`, ...), optional `const`, `async`, `unsafe`, `extern "C"`,
/// then `fn NAME`.
fn declared_fn(line: &str) -> Option<String> {
    let mut rest = line.trim_start();
    if let Some(after) = rest.strip_prefix("pub") {
        let after = after.trim_start();
        rest = if after.starts_with('(') {
            after.split_once(')')?.1.trim_start()
        } else if line.trim_start().starts_with("pub ") {
            after
        } else {
            return None;
        };
    }
    loop {
        let before = rest;
        for qualifier in ["const ", "async ", "unsafe ", "extern \"C\" ", "extern "] {
            if let Some(after) = rest.strip_prefix(qualifier) {
                rest = after.trim_start();
            }
        }
        if rest == before {
            break;
        }
    }
    let after = rest.strip_prefix("fn ")?;
    let name: String = after
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// Every function in `text` with a body: (name, length in lines from its `fn` line to the line
/// of its closing brace).
fn function_lengths(text: &str) -> Vec<(String, usize)> {
    let code = code_only(text);
    let lines: Vec<&str> = code.lines().collect();
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let Some(name) = declared_fn(line) else {
            continue;
        };
        // Find the body's opening brace; a `;` first is a declaration without a body.
        let mut depth = 0usize;
        let mut opened = false;
        let mut end = None;
        'lines: for (offset, body_line) in lines[start..].iter().enumerate() {
            for c in body_line.chars() {
                match c {
                    ';' if !opened => break 'lines,
                    '{' => {
                        opened = true;
                        depth += 1;
                    }
                    '}' if opened => {
                        depth -= 1;
                        if depth == 0 {
                            end = Some(start + offset);
                            break 'lines;
                        }
                    }
                    _ => {}
                }
            }
        }
        if let Some(end) = end {
            found.push((name, end - start + 1));
        }
    }
    found
}

#[test]
fn source_files_and_functions_stay_short() {
    let listed_files: BTreeMap<&str, usize> = LONG_FILES.iter().copied().collect();
    let mut listed_fns: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for &(file, name, lines) in LONG_FNS {
        let entry = listed_fns.entry((file, name)).or_default();
        *entry = (*entry).max(lines);
    }
    let mut failures = Vec::new();
    let mut shrunk = Vec::new();
    let mut long_files = Vec::new();
    let mut long_fns = Vec::new();
    for path in source_files() {
        let Some(text) = read_text(&path) else {
            continue;
        };
        let count = text.lines().count();
        if count > MAX_FILE_LINES {
            long_files.push(format!("(\"{path}\", {count}),"));
            match listed_files.get(path.as_str()) {
                None => failures.push(format!(
                    "{path}: {count} lines, over {MAX_FILE_LINES} and not listed in LONG_FILES"
                )),
                Some(&allowed) if count > allowed => failures.push(format!(
                    "{path}: {count} lines, grown past its listed {allowed}"
                )),
                Some(&allowed) if count < allowed => {
                    shrunk.push(format!("{path}: {count} lines, listed at {allowed}"))
                }
                Some(_) => {}
            }
        }
        for (name, length) in function_lengths(&text) {
            if length <= MAX_FN_LINES {
                continue;
            }
            long_fns.push(format!("(\"{path}\", \"{name}\", {length}),"));
            match listed_fns.get(&(path.as_str(), name.as_str())) {
                None => failures.push(format!(
                    "{path}: fn {name} is {length} lines, over {MAX_FN_LINES} and not listed in LONG_FNS"
                )),
                Some(&allowed) if length > allowed => failures.push(format!(
                    "{path}: fn {name} is {length} lines, grown past its listed {allowed}"
                )),
                Some(&allowed) if length < allowed => shrunk.push(format!(
                    "{path}: fn {name} is {length} lines, listed at {allowed}"
                )),
                Some(_) => {}
            }
        }
    }
    println!(
        "files over {MAX_FILE_LINES} lines ({}):\n{}",
        long_files.len(),
        long_files.join("\n")
    );
    println!(
        "functions over {MAX_FN_LINES} lines ({}):\n{}",
        long_fns.len(),
        long_fns.join("\n")
    );
    if !shrunk.is_empty() {
        println!(
            "shorter than listed (lower or drop the entry):\n{}",
            shrunk.join("\n")
        );
    }
    assert!(
        failures.is_empty(),
        "{} file(s) or function(s) too long:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn function_lengths_count_braces_in_code_only() {
    let text = [
        "pub(crate) async fn a() {",
        "    let s = \"}}}\"; // }",
        "    let c = '{';",
        "    let r = r#\"{\"#;",
        "}",
        "fn declared();",
        "    pub fn b<'a>(x: &'a str) -> &'a str {",
        "        /* { */ x",
        "    }",
    ]
    .join("\n");
    assert_eq!(
        function_lengths(&text),
        vec![("a".to_owned(), 5), ("b".to_owned(), 3)]
    );
}

// ---- Floors: which module of `src/` may import which ----

/// The floors of ARCHITECTURE.md's `## Floors` block, lowest first: each a list of modules.
fn floors() -> Vec<Vec<String>> {
    let text = read_text("ARCHITECTURE.md").expect("ARCHITECTURE.md is readable");
    let section = text
        .split("\n## Floors\n")
        .nth(1)
        .expect("ARCHITECTURE.md has a `## Floors` section");
    let block = section
        .split("```text\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("the Floors section holds a ```text block");
    let mut floors: Vec<Vec<String>> = block
        .lines()
        .map(|line| line.split_whitespace().map(str::to_owned).collect())
        .filter(|floor: &Vec<String>| !floor.is_empty())
        .collect();
    floors.reverse();
    floors
}

/// The module of `src/` a source file belongs to (`src/relay/batch.rs` → `relay`), or `None`
/// for the crate root and the CLI (a crate of its own, over the public API).
fn module_of(path: &str) -> Option<String> {
    let rest = path.strip_prefix("src/")?;
    let first = rest.split('/').next()?;
    let module = first.strip_suffix(".rs").unwrap_or(first);
    (module != "lib" && module != "main" && module != "bin").then(|| module.to_owned())
}

/// The names the crate root re-exports, each with the module it comes from (`Outbox` →
/// `outbox`), read from `src/lib.rs`'s `pub use` statements, so that `crate::Outbox` counts
/// as an import of `outbox`. `crate::admin::NAME` is looked up by `NAME` the same way.
fn root_reexports(modules: &[String]) -> BTreeMap<String, String> {
    let lib = code_only(&read_text("src/lib.rs").expect("src/lib.rs is readable"));
    let mut names = BTreeMap::new();
    for statement in lib.split(';') {
        let Some(at) = statement.find("pub use ") else {
            continue;
        };
        let path = statement[at + "pub use ".len()..].trim();
        let path = path.strip_prefix("crate::").unwrap_or(path);
        let Some(module) = path.split("::").next().map(str::trim) else {
            continue;
        };
        if !modules.iter().any(|m| m == module) {
            continue;
        }
        let tail = match (path.find('{'), path.rfind('}')) {
            (Some(open), Some(close)) => &path[open + 1..close],
            _ => path.rsplit("::").next().unwrap_or(""),
        };
        for item in tail.split(',') {
            let item = item.trim();
            let name = item.rsplit(" as ").next().unwrap_or(item);
            let name = name.rsplit("::").next().unwrap_or(name).trim();
            if !name.is_empty() {
                names.insert(name.to_owned(), module.to_owned());
            }
        }
    }
    names
}

/// The modules a file's code (comments and strings left out) names through `crate::`: the
/// first segment of each path, or of each item of a `crate::{a::X, b}` group, with re-exports
/// of the crate root and of `admin` looked up in `reexports`.
fn imported_modules(
    code: &str,
    modules: &[String],
    reexports: &BTreeMap<String, String>,
) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let place = |segments: &[String]| -> Option<String> {
        let first = segments.first()?;
        if modules.contains(first) {
            return Some(first.clone());
        }
        let name = if first == "admin" {
            segments.get(1)?
        } else {
            first
        };
        reexports.get(name).cloned()
    };
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().last();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let paths: Vec<String> = if rest.trim_start().starts_with('{') {
            let mut depth = 0;
            let mut group = String::new();
            for c in rest.trim_start().chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                group.push(c);
                if depth == 0 {
                    break;
                }
            }
            let inner = &group[1..group.len().saturating_sub(1)];
            let mut items = Vec::new();
            let (mut depth, mut start) = (0, 0);
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        items.push(inner[start..i].to_owned());
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            items.push(inner[start..].to_owned());
            items
        } else {
            vec![rest.chars().take(300).collect()]
        };
        for path in paths {
            let mut segments = Vec::new();
            let mut tail = path.as_str();
            loop {
                let segment = ident(tail);
                if segment.is_empty() {
                    break;
                }
                let after = tail.trim_start()[segment.len()..].to_owned();
                segments.push(segment);
                match after.strip_prefix("::") {
                    Some(next) => tail = &path[path.len() - next.len()..],
                    None => break,
                }
            }
            if let Some(module) = place(&segments) {
                found.push(module);
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

#[test]
fn modules_import_only_the_floors_below_them() {
    let floors = floors();
    let floor_of: BTreeMap<String, usize> = floors
        .iter()
        .enumerate()
        .flat_map(|(level, floor)| floor.iter().map(move |m| (m.clone(), level)))
        .collect();
    let mut modules: Vec<String> = source_files().iter().filter_map(|p| module_of(p)).collect();
    modules.sort();
    modules.dedup();
    let reexports = root_reexports(&modules);
    let mut failures = Vec::new();
    for module in &modules {
        if !floor_of.contains_key(module) {
            failures.push(format!(
                "src/{module}: on no floor of ARCHITECTURE.md's `## Floors` block"
            ));
        }
    }
    for floor in floor_of.keys() {
        if !modules.contains(floor) {
            failures.push(format!(
                "ARCHITECTURE.md's floors name `{floor}`, which is no module of src/"
            ));
        }
    }
    for path in source_files() {
        let Some(module) = module_of(&path) else {
            continue;
        };
        let Some(&own) = floor_of.get(&module) else {
            continue;
        };
        let Some(text) = read_text(&path) else {
            continue;
        };
        for imported in imported_modules(&code_only(&text), &modules, &reexports) {
            if imported == module {
                continue;
            }
            match floor_of.get(&imported) {
                Some(&theirs) if theirs < own => {}
                Some(&theirs) if theirs == own => {
                    failures.push(format!("{path}: imports `{imported}`, on its own floor"))
                }
                Some(_) => failures.push(format!(
                    "{path}: imports `{imported}`, on a floor above `{module}`"
                )),
                None => {}
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} import(s) against ARCHITECTURE.md's floors:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn imports_are_found_in_paths_groups_and_reexports() {
    let modules: Vec<String> = ["error", "outbox", "relay", "write", "ops"]
        .map(str::to_owned)
        .to_vec();
    let reexports = BTreeMap::from([
        ("Outbox".to_owned(), "outbox".to_owned()),
        ("relay_attempts".to_owned(), "relay".to_owned()),
    ]);
    let code = [
        "use crate::error::{Error, Result};",
        "use crate::{write::transaction::OutboxTransaction, ops::{status, render}};",
        "fn f(o: &crate::Outbox) { crate::admin::relay_attempts(); }",
        "fn g() -> mycrate::relay::X { sqlx::Error }",
    ]
    .join("\n");
    assert_eq!(
        imported_modules(&code, &modules, &reexports),
        ["error", "ops", "outbox", "relay", "write"]
    );
    let commented = code_only("// crate::relay::x\nlet s = \"crate::outbox\";");
    assert!(imported_modules(&commented, &modules, &reexports).is_empty());
}

/// The longest a test function under `tests/` may be: past it, a test is a script to split
/// into named steps.
const MAX_TEST_FN_LINES: usize = 120;

#[test]
fn test_functions_stay_short() {
    let mut failures = Vec::new();
    for path in tracked_files() {
        if !(path.starts_with("tests/") && path.ends_with(".rs")) {
            continue;
        }
        let Some(text) = read_text(&path) else {
            continue;
        };
        for (name, length) in function_lengths(&text) {
            if length > MAX_TEST_FN_LINES {
                failures.push(format!("{path}: fn {name} is {length} lines"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "test functions over {MAX_TEST_FN_LINES} lines:\n{}",
        failures.join("\n")
    );
}
