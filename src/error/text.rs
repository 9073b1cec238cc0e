//! Database and migration errors in words: the conversion from `sqlx::Error` (naming a schema
//! that is not migrated), PostgreSQL's message without sqlx's source line (with a hint where a
//! transaction-mode pooler caused it), and a failure's text as ordo stores it.

use super::Error;

/// Every database error converts here, so that the one that means "not migrated" says so
/// wherever it surfaces.
impl From<sqlx::Error> for Error {
    fn from(error: sqlx::Error) -> Self {
        match missing_ordo_relation(&error) {
            Some(relation) => Error::NotMigrated {
                relation,
                source: error,
            },
            None => Error::Database(error),
        }
    }
}

/// The ordo relation or schema a failed statement found missing (SQLSTATE 42P01
/// `undefined_table`, 3F000 `invalid_schema_name`), if that is why it failed.
fn missing_ordo_relation(error: &sqlx::Error) -> Option<String> {
    let db = error.as_database_error()?;
    let code = db.code()?;
    let message = db.message();
    let ours = match code.as_ref() {
        "42P01" => message.contains("\"ordo."),
        "3F000" => message.contains("\"ordo\""),
        _ => false,
    };
    ours.then(|| {
        message
            .strip_suffix(" does not exist")
            .unwrap_or(message)
            .to_owned()
    })
}

/// A database error as an operator should read it: PostgreSQL's message, hint and SQLSTATE,
/// without the source line sqlx appends (a line of PostgreSQL's C code, easily read as a line
/// of the user's SQL).
pub(super) fn describe(error: &sqlx::Error) -> String {
    let Some(db) = error.as_database_error() else {
        return error.to_string();
    };
    let mut text = db.message().to_owned();
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        // Not the detail: it can quote a failing row, payload and all.
        if let Some(hint) = pg.hint() {
            text.push_str("; hint: ");
            text.push_str(hint);
        }
    }
    if let Some(code) = db.code() {
        text.push_str(" [SQLSTATE ");
        text.push_str(&code);
        text.push(']');
    }
    if let Some(pooler) = pooler_hint(error) {
        text.push_str(": ");
        text.push_str(pooler);
    }
    text
}

/// The one-line hint for a sqlx error that a transaction-mode pooler causes: a named prepared
/// statement that already exists on, or is missing from, the server connection the pooler
/// chose (`42P05`, `26000`).
fn pooler_hint(error: &sqlx::Error) -> Option<&'static str> {
    let sqlx::Error::Database(db) = error else {
        return None;
    };
    match db.code().as_deref() {
        Some("42P05" | "26000") if db.message().contains("sqlx_s_") => Some(
            "this looks like a transaction-mode pooler (PgBouncer pool_mode = transaction) \
             between ordo and PostgreSQL: connect to the server itself or to a session-mode pool \
             (docs/operations.md, \"Connection poolers\")",
        ),
        _ => None,
    }
}

/// A failure's text as ordo stores and logs it (a handler's error in `last_error`, a dead
/// letter, a stalled key, an inbox row, a log line): its `Display`, except that a PostgreSQL
/// error anywhere in its chain loses the source position sqlx appends to it (`… at line 2650`,
/// a line of PostgreSQL's C code that users read as a line of their SQL) and shows its SQLSTATE
/// instead. Nothing else of the text changes.
pub(crate) fn failure_text(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let chain = std::iter::successors(Some(error), |error| error.source());
    for pg in chain.filter_map(postgres_error) {
        let Some(line) = pg.line() else { continue };
        let shown = format!("{} at line {line}", pg.message());
        let meant = format!("{} [SQLSTATE {}]", pg.message(), pg.code());
        if let Some(at) = text.find(&shown) {
            text.replace_range(at..at + shown.len(), &meant);
        }
    }
    text
}

/// The PostgreSQL error `error` is, or wraps directly as a `sqlx::Error`.
fn postgres_error<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a sqlx::postgres::PgDatabaseError> {
    if let Some(pg) = error.downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        return Some(pg);
    }
    error
        .downcast_ref::<sqlx::Error>()?
        .as_database_error()?
        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
}

/// A migration error in words that name ordo's history table, without PostgreSQL's source
/// line (see [`failure_text`]). sqlx's own message for a dirty
/// migration says to remove its row from `_sqlx_migrations`, which is the application's table
/// (if it has one), not `ordo._sqlx_migrations` where ordo records its migrations.
pub(super) fn migrate_reason(error: &sqlx::migrate::MigrateError) -> String {
    match error {
        sqlx::migrate::MigrateError::Dirty(version) => format!(
            "migration {version} is partially applied (its row in {table} says success = false): \
             repair by hand what it left half done, then delete that row (DELETE FROM {table} \
             WHERE version = {version}) and migrate again (`ordo migrate`)",
            table = crate::schema::MIGRATIONS_TABLE
        ),
        // A failed statement of a migration: PostgreSQL's message and SQLSTATE, not the line
        // of its C source sqlx appends.
        other => failure_text(other),
    }
}
