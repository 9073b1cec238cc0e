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

/// `text` for one field of a log line or an error message: at most `max` characters of it,
/// made [`printable`], with how long it was when it was longer
/// (`abc… (10240 bytes in all)`). Header values, ids and notification payloads come from
/// someone else's `INSERT` or broker message; cut, one of 10 kB cannot flood a log and none
/// can forge a line.
pub(crate) fn clipped(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => printable(text).into_owned(),
        Some((end, _)) => format!("{}… ({} bytes in all)", printable(&text[..end]), text.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_value_is_only_made_printable() {
        assert_eq!(clipped("commit", 64), "commit");
        assert_eq!(clipped("a\nb\u{202e}c", 64), "a\\nb\\u{202e}c");
        assert_eq!(clipped("", 64), "");
    }

    #[test]
    fn a_long_value_is_cut_and_its_length_said() {
        let long = format!("x\n{}", "é".repeat(5_000));
        let shown = clipped(&long, 10);
        assert_eq!(
            shown,
            format!("x\\n{}… (10002 bytes in all)", "é".repeat(8))
        );
        assert!(!shown.contains('\n'));
        // Exactly `max` characters is not cut.
        assert_eq!(clipped("abcd", 4), "abcd");
        assert_eq!(clipped("abcde", 4), "abcd… (5 bytes in all)");
    }
}
