//! What the commands print: JSON lines safe for a terminal, and writes that end quietly when
//! the reader went away.

use std::io::{self, Write};

use serde::Serialize;

/// `value` as one line of JSON that is also safe on a terminal: serde_json escapes C0 controls,
/// and DEL, C1 controls (8-bit CSI among them) and bidirectional overrides are escaped here too
/// (still valid JSON, the same string once parsed).
pub(crate) fn json_line(value: &impl Serialize) -> serde_json::Result<String> {
    let line = serde_json::to_string(value)?;
    if !line.chars().any(|c| c.is_control() || is_bidi_override(c)) {
        return Ok(line);
    }
    let mut out = String::with_capacity(line.len() + 16);
    for c in line.chars() {
        if c.is_control() || is_bidi_override(c) {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

fn is_bidi_override(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
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
