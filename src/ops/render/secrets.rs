//! The secret payload keys as a table.

use super::{Column, Left, printable, table};
use crate::ops::secrets::SecretKey;

/// The secret payload keys as `ordo secrets` prints them: one line each, the every-type ones
/// first, safe for a terminal. With none, the heading alone.
pub fn secret_keys_table(keys: &[SecretKey]) -> String {
    let mut out = String::new();
    let columns = [Column("TYPE", 24, Left)];
    let rows = keys.iter().map(|secret| {
        let scope = secret
            .event_type
            .as_deref()
            .map_or_else(|| "(every type)".to_owned(), |t| printable(t).into_owned());
        ([scope], printable(&secret.key).into_owned())
    });
    table(&mut out, &columns, "KEY", rows);
    out
}
