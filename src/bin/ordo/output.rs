//! What the commands print: JSON lines safe for a terminal, and writes that end quietly when
//! the reader went away.

use std::io::{self, Write};

use ordo::admin;
use serde::Serialize;

/// `value` as one line of JSON that is also safe on a terminal: serde_json escapes C0 controls,
/// and DEL, C1 controls (8-bit CSI among them), bidirectional overrides and what a reader
/// cannot see (zero-width characters, spaces other than ASCII's) are escaped here too (still
/// valid JSON, the same string once parsed), as `ordo::admin::printable` shows them in tables.
pub(crate) fn json_line(value: &impl Serialize) -> serde_json::Result<String> {
    let line = serde_json::to_string(value)?;
    if !line.chars().any(admin::needs_escape) {
        return Ok(line);
    }
    let mut out = String::with_capacity(line.len() + 16);
    let mut units = [0u16; 2];
    for c in line.chars() {
        if admin::needs_escape(c) {
            // JSON escapes UTF-16 code units: a character past U+FFFF takes two.
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

/// Writes one JSON line; `false` when the reader went away (a closed pipe is not an error).
pub(crate) fn emit(out: &mut impl Write, line: &impl Serialize, flush: bool) -> io::Result<bool> {
    let line = json_line(line).map_err(io::Error::other)?;
    let written = writeln!(out, "{line}").and_then(|()| if flush { out.flush() } else { Ok(()) });
    match written {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == io::ErrorKind::BrokenPipe => Ok(false),
        Err(error) => Err(error),
    }
}

/// Writes `rows` as JSON lines, each safe for a terminal ([`json_line`]): what `--json` prints.
pub(crate) fn json_lines(out: &mut impl Write, rows: &[impl Serialize]) -> io::Result<()> {
    for row in rows {
        writeln!(out, "{}", json_line(row).map_err(io::Error::other)?)?;
    }
    Ok(())
}
