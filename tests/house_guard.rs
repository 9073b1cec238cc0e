//! House rules that need no database, checked over the files git tracks:
//!
//! - no project file cites an internal work item by number (a past work period, a sitting, an
//!   issue of the project's own tracker): a reader has no way to look one up, so the text says
//!   a date or a commit instead. `migrations/` is shipped and never edited, so it is not read.
//! - no non-test source file under `src/` passes [`MAX_FILE_LINES`] lines and no function there
//!   passes [`MAX_FN_LINES`]. Today's offenders are listed with their current size
//!   ([`LONG_FILES`], [`LONG_FNS`]): the test fails when another file or function crosses the
//!   line or a listed one grows, and says so when a listed one has shrunk (lower its entry).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The longest a non-test source file under `src/` may be, in lines.
const MAX_FILE_LINES: usize = 400;
/// The longest a function under `src/` may be, in lines from its `fn` line to its closing brace.
const MAX_FN_LINES: usize = 80;

/// Files over [`MAX_FILE_LINES`] when the rule was written (2026-12-07), with their length then.
const LONG_FILES: &[(&str, usize)] = &[("src/error.rs", 490)];

/// Functions over [`MAX_FN_LINES`] when the rule was written (2026-12-07): file, name, length then. A name
/// that occurs twice in a file is held to the larger length.
const LONG_FNS: &[(&str, &str, usize)] = &[
    ("src/bin/ordo/relay/mod.rs", "run", 84),
    ("src/relay/batch.rs", "record", 97),
];

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
