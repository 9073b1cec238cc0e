//! Text from someone else's `INSERT` made safe for a terminal and a log line.

use std::borrow::Cow;
use std::fmt::Write;

/// `text` made safe for a terminal: control characters (C0, DEL, C1, so ESC and CSI too) and
/// the bidirectional overrides that reorder what a line appears to say are shown as escapes
/// (`\n`, `\u{1b}`) instead of acting on the operator's terminal. Subscription names, handler
/// errors (which can carry payload text) and other sessions' queries all reach a table through
/// it.
///
/// What a reader cannot see is shown too, so that names that only look alike read apart:
/// zero-width and other invisible formatting characters, spaces other than the ASCII one, and
/// ASCII spaces at either end (`billing`, `billing\u{20}` and `billing\u{200b}` are three
/// names).
///
/// ```
/// use ordo::admin::printable;
///
/// assert_eq!(printable("billing"), "billing");
/// assert_eq!(printable("billing "), "billing\\u{20}");
/// assert_eq!(printable("bill\u{200b}ing"), "bill\\u{200b}ing");
/// assert_eq!(printable("a\nb"), "a\\nb");
/// ```
pub fn printable(text: &str) -> Cow<'_, str> {
    // ASCII spaces inside the text are ordinary; at its ends they are invisible.
    let starts = text.len() - text.trim_start_matches(' ').len();
    let ends = text.trim_end_matches(' ').len().max(starts);
    let shown_raw =
        |(at, c): (usize, char)| !needs_escape(c) && (c != ' ' || (starts..ends).contains(&at));
    if text.char_indices().all(shown_raw) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for (at, c) in text.char_indices() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if !shown_raw((at, c)) => {
                let _ = write!(out, "{}", c.escape_unicode());
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Whether [`printable`] escapes `c` wherever it stands: a control character, a bidirectional
/// override, an invisible formatting character (zero-width space and joiners, word joiner,
/// soft hyphen, byte order mark, tags, variation selectors) or a space other than the ASCII
/// one. (An ASCII space is escaped only at either end of a text.)
pub fn needs_escape(c: char) -> bool {
    c.is_control() || invisible(c) || (c.is_whitespace() && c != ' ')
}

/// Characters that draw nothing, or only change how their neighbours are drawn.
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{ad}'
            | '\u{34f}'
            | '\u{61c}'
            | '\u{115f}'
            | '\u{1160}'
            | '\u{17b4}'
            | '\u{17b5}'
            | '\u{180b}'..='\u{180f}'
            | '\u{200b}'..='\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{3164}'
            | '\u{fe00}'..='\u{fe0f}'
            | '\u{feff}'
            | '\u{ffa0}'
            | '\u{fff9}'..='\u{fffb}'
            | '\u{1d173}'..='\u{1d17a}'
            | '\u{e0000}'..='\u{e0fff}'
    )
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
    fn names_that_only_look_alike_read_apart() {
        let shown: Vec<String> = [
            "billing",
            "billing ",
            "billing\u{200b}",
            "billing\u{a0}",
            " billing",
        ]
        .iter()
        .map(|name| printable(name).into_owned())
        .collect();
        assert_eq!(
            shown,
            [
                "billing",
                "billing\\u{20}",
                "billing\\u{200b}",
                "billing\\u{a0}",
                "\\u{20}billing"
            ]
        );
        // Spaces inside a text are ordinary; a text of spaces only is shown whole.
        assert_eq!(printable("a b  c"), "a b  c");
        assert_eq!(printable("  "), "\\u{20}\\u{20}");
        assert_eq!(printable("\u{feff}x\u{e0041}"), "\\u{feff}x\\u{e0041}");
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
