//! Text from someone else's `INSERT` made safe for a terminal and a log line.

use std::borrow::Cow;
use std::fmt::Write;

/// `text` made safe for a terminal: control characters (C0, DEL, C1, so ESC and CSI too) and
/// the bidirectional overrides that reorder what a line appears to say are shown as escapes
/// (`\n`, `\u{1b}`) instead of acting on the operator's terminal. Subscription names, handler
/// errors (which can carry payload text) and other sessions' queries all reach a table through
/// it.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => {
                let _ = write!(out, "{}", c.escape_unicode());
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

pub(crate) fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}
