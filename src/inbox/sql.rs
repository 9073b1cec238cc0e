//! The inbox's statements, each behind a named constant, in one place.

use crate::telemetry::HotStatement;

/// The advisory lock key of one message of one consumer: a 64-bit hash, so that it stays
/// clear of an application's own small advisory keys. Two messages whose keys collide only
/// answer [`Receipt::Busy`](super::Receipt::Busy) while the other runs.
macro_rules! message_key {
    () => {
        "hashtextextended('ordo.inbox' || chr(10) || $1 || chr(10) || $2, 0)"
    };
}

/// The lock and the claim, in one round trip.
///
/// The lock is session-level, so that it spans the claim (committed on its own) and the
/// handler's transaction; `try`, so that a receiver never waits behind another. Without it,
/// nothing is claimed. `held` says which.
///
/// The claim, committed before the handler runs, makes the row `processing`, so that it is
/// visible and an attempt that dies without an outcome is seen and counted by the next one
/// (a `processing` row found while we hold the lock has nobody working on it). It returns no
/// `attempts` when the row is `completed` or `failed`. The statement's snapshot may predate the
/// lock, but `ON CONFLICT DO UPDATE` judges the latest committed version of the row, so a
/// completion committed just before we got the lock is seen.
///
/// Committed asynchronously (`synchronous_commit` off for this statement's own transaction):
/// the handler's transaction commits synchronously later, which flushes the WAL up to it, the
/// claim included; a claim lost in a server crash only forgets that attempt.
pub(crate) const LOCK_AND_CLAIM: &str = concat!(
    "WITH lock AS (SELECT pg_try_advisory_lock(",
    message_key!(),
    r#") AS held),
claim AS (
    INSERT INTO ordo.inbox AS i (consumer, message_id, status, source, position)
    SELECT $1, $2, 'processing', $3, $4
    FROM lock, (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
    WHERE lock.held
    ON CONFLICT (consumer, message_id) DO UPDATE
    SET status = 'processing',
        attempts = i.attempts + (i.status = 'processing')::int,
        last_error = CASE WHEN i.status = 'processing' THEN $5 ELSE i.last_error END,
        updated_at = now()
    WHERE i.status IN ('pending', 'processing')
    RETURNING i.attempts
)
SELECT lock.held, claim.attempts FROM lock LEFT JOIN claim ON true
"#
);

pub(crate) const UNLOCK: &str = concat!("SELECT pg_advisory_unlock(", message_key!(), ")");

/// What a stale claim means, stored as its error.
pub(crate) const ABANDONED: &str = "an earlier attempt ended without an outcome (the process or its connection died in the handler)";

pub(crate) const READ: &str = r#"
SELECT status, attempts, last_error FROM ordo.inbox WHERE consumer = $1 AND message_id = $2
"#;

/// In the handler's transaction, before the handler runs: the record that commits with its
/// effects. No row means the claim was taken from us (an operator, or a receiver that found
/// our connection dead): the transaction is abandoned.
pub(crate) const COMPLETE: &str = r#"
UPDATE ordo.inbox
SET status = 'completed', completed_at = now(), updated_at = now(),
    payload = NULL, headers = NULL, last_error = NULL
WHERE consumer = $1 AND message_id = $2 AND status = 'processing'
"#;

/// A failed attempt, after the handler's transaction rolled back: one more attempt, the error,
/// and the payload (for operators and replays); `failed` at the maximum (`$4`). An upsert, in
/// case the claim was lost with a crashed server.
pub(crate) const FAIL: &str = r#"
INSERT INTO ordo.inbox AS i
    (consumer, message_id, status, attempts, last_error, payload, headers, source, position)
VALUES ($1, $2, CASE WHEN 1 >= $4 THEN 'failed' ELSE 'pending' END, 1, $3, $5, $6, $7, $8)
ON CONFLICT (consumer, message_id) DO UPDATE
SET attempts = i.attempts + 1,
    status = CASE WHEN i.attempts + 1 >= $4 THEN 'failed' ELSE 'pending' END,
    last_error = EXCLUDED.last_error,
    payload = EXCLUDED.payload,
    headers = EXCLUDED.headers,
    updated_at = now()
WHERE i.status IN ('pending', 'processing')
RETURNING status, attempts
"#;

/// A claim that found the maximum already reached (attempts that died): `failed` at once.
pub(crate) const GIVE_UP: &str = r#"
UPDATE ordo.inbox
SET status = 'failed', payload = $3, headers = $4, updated_at = now()
WHERE consumer = $1 AND message_id = $2 AND status = 'processing'
"#;

/// One batch of completed rows older than `$2` milliseconds, at most `$3`.
pub(crate) const PURGE: &str = r#"
DELETE FROM ordo.inbox
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM ordo.inbox
    WHERE consumer = $1 AND status = 'completed'
      AND completed_at < now() - make_interval(secs => $2::float8 / 1000)
    LIMIT $3
))
"#;

/// Messages of a consumer waiting with a stored payload (failed attempts, replays), oldest
/// first.
pub(crate) const PENDING: &str = r#"
SELECT message_id, payload, headers, source, position FROM ordo.inbox
WHERE consumer = $1 AND status = 'pending' AND payload IS NOT NULL
ORDER BY received_at, message_id
LIMIT $2
"#;

/// `$1` NULL: every consumer.
pub(crate) const LIST_FAILED: &str = r#"
SELECT consumer, message_id, attempts, last_error, payload, headers, source, position,
       received_at, updated_at
FROM ordo.inbox
WHERE status = 'failed' AND ($1::text IS NULL OR consumer = $1)
ORDER BY updated_at, consumer, message_id
"#;

/// `$1` NULL: every message; `$2` NULL: every consumer. Attempts start again from zero.
pub(crate) const REPLAY: &str = r#"
UPDATE ordo.inbox
SET status = 'pending', attempts = 0, updated_at = now()
WHERE status = 'failed'
  AND ($1::text IS NULL OR message_id = $1)
  AND ($2::text IS NULL OR consumer = $2)
"#;

/// Watermark mode: the mark of the source's route (`$3`, `''` for none), locked for the
/// handler's transaction; `NOWAIT`, so that a receiver never waits behind another (SQLSTATE
/// 55P03 is [`Receipt::Busy`](super::Receipt)).
pub(crate) const MARK: &str = r#"
SELECT position, history, rewound_through
FROM ordo.inbox_watermarks WHERE consumer = $1 AND source = $2 AND route = $3 FOR UPDATE NOWAIT
"#;

/// A source's route seen for the first time, committed on its own before any handler runs.
/// A route starts where the source's route-less mark stands, if it has one: a sender that
/// began naming routes (an upgrade) sent everything up to there without one, and this
/// consumer handled it.
pub(crate) const CREATE_MARK: &str = r#"
INSERT INTO ordo.inbox_watermarks (consumer, source, route, position, history)
SELECT $1, $2, $3, coalesce(w.position, 0), w.history
FROM (SELECT 1) AS one
LEFT JOIN ordo.inbox_watermarks AS w ON w.consumer = $1 AND w.source = $2 AND w.route = ''
ON CONFLICT DO NOTHING
"#;

/// In the handler's transaction, before the handler runs (the row is locked by [`MARK`]).
/// `$4`: the message's server history (NULL keeps the mark's).
pub(crate) const ADVANCE: &str = r#"
UPDATE ordo.inbox_watermarks
SET position = $3, history = coalesce($4, history), failing_position = NULL, attempts = 0,
    last_error = NULL, gap_position = NULL, gap_expected = NULL, gap_since = NULL, gap_warned_at = NULL,
    updated_at = now()
WHERE consumer = $1 AND source = $2 AND route = $5
"#;

/// A newer server history `$6` that began at or below the mark: the positions `$3..=$4` of
/// the mark's history `$5` were given again. The mark goes back to just below them, on the
/// newer history (what lies below it is shared by both), so their new events are taken in
/// order and the old history's above it are known for lost ones. Committed on its own, in the
/// transaction holding the mark's row (locked by [`MARK`]), before the message is handled.
pub(crate) const NOTE_REWIND: &str = r#"
UPDATE ordo.inbox_watermarks
SET rewound_at = now(), rewound_from = $3, rewound_through = $4, rewound_history = $5,
    position = $3 - 1, history = $6, failing_position = NULL, attempts = 0, last_error = NULL,
    gap_position = NULL, gap_expected = NULL, gap_since = NULL, gap_warned_at = NULL, updated_at = now()
WHERE consumer = $1 AND source = $2 AND route = $7
RETURNING true
"#;

/// A message from beyond the next position, refused as a gap, in the transaction holding the
/// mark's row (locked by [`MARK`]): the highest position refused, the lowest one waited for
/// (`$5`, a refused message's previous position: several may be refused in a row, each
/// waiting on the one before it) and since when the inbox waits. `warn`: this receiver logs
/// the wait, once it has lasted 5 s (`GAP_SHOWN_AFTER`: a catch-up's gaps close sooner), then
/// at most once a minute across every receiver; `failing_position`: the position of the
/// mark's failing message, if one fails (the wait is for its handler, not for a redelivery).
/// A refusal that changes nothing (a redelivery of a position already refused, before the
/// wait is worth a warning or within its minute) writes nothing: a transport redelivering a
/// window of early messages every second costs no write each.
pub(crate) const NOTE_GAP: &str = r#"
UPDATE ordo.inbox_watermarks AS w
SET gap_position = GREATEST(w.gap_position, $3),
    gap_expected = LEAST(w.gap_expected, $5),
    gap_since = coalesce(w.gap_since, now()),
    gap_warned_at = CASE WHEN w.gap_since <= now() - interval '5 seconds'
                          AND (w.gap_warned_at IS NULL OR w.gap_warned_at <= now() - interval '1 minute')
                         THEN now() ELSE w.gap_warned_at END
WHERE consumer = $1 AND source = $2 AND route = $4
  AND (w.gap_since IS NULL OR w.gap_position < $3 OR w.gap_expected > $5
       OR (w.gap_since <= now() - interval '5 seconds'
           AND (w.gap_warned_at IS NULL OR w.gap_warned_at <= now() - interval '1 minute')))
RETURNING gap_since, coalesce(gap_warned_at = now(), false) AS warn, failing_position
"#;

/// A failed attempt at the next position (mark + 1, or further inside a rewound range), after
/// the rollback. No row: the mark moved to it or past it meanwhile (another receiver handled
/// it).
pub(crate) const MARK_FAILED: &str = r#"
UPDATE ordo.inbox_watermarks
SET attempts = CASE WHEN failing_position = $3 THEN attempts + 1 ELSE 1 END,
    failing_position = $3, last_error = $4, updated_at = now()
WHERE consumer = $1 AND source = $2 AND route = $5 AND position < $3
RETURNING attempts
"#;

/// The maximum reached: the message goes to `ordo.inbox` as `failed` and the mark moves past
/// it, in one statement. No row: the mark moved meanwhile.
pub(crate) const DEAD_LETTER: &str = r#"
WITH moved AS (
    UPDATE ordo.inbox_watermarks
    SET position = $3, failing_position = NULL, attempts = 0, last_error = NULL,
        gap_position = NULL, gap_expected = NULL, gap_since = NULL, gap_warned_at = NULL, updated_at = now()
    WHERE consumer = $1 AND source = $2 AND route = $9 AND position < $3
    RETURNING consumer
)
INSERT INTO ordo.inbox AS i
    (consumer, message_id, status, attempts, last_error, payload, headers, source, position)
SELECT $1, $5, 'failed', $6, $4, $7, $8, $2, $3 FROM moved
ON CONFLICT (consumer, message_id) DO UPDATE
SET status = 'failed', attempts = EXCLUDED.attempts, last_error = EXCLUDED.last_error,
    payload = EXCLUDED.payload, headers = EXCLUDED.headers, updated_at = now()
WHERE i.status <> 'completed'
RETURNING 1
"#;

/// `$1` NULL: every consumer.
pub(crate) const LIST_MARKS: &str = r#"
SELECT consumer, source, route, position, failing_position, attempts, last_error, updated_at,
       gap_position, gap_expected, gap_since, history, rewound_at, rewound_from, rewound_through,
       rewound_history
FROM ordo.inbox_watermarks
WHERE $1::text IS NULL OR consumer = $1
ORDER BY consumer, source, route
"#;

/// Sets a mark (the position before the first message to handle) of route `$4`.
pub(crate) const SET_MARK: &str = r#"
INSERT INTO ordo.inbox_watermarks (consumer, source, position, route) VALUES ($1, $2, $3, $4)
ON CONFLICT (consumer, source, route) DO UPDATE
SET position = EXCLUDED.position, failing_position = NULL, attempts = 0, last_error = NULL,
    gap_position = NULL, gap_expected = NULL, gap_since = NULL, gap_warned_at = NULL, updated_at = now()
"#;

/// Whether `consumer` has any row in the inbox, in either mode.
pub(crate) const KNOWN_CONSUMER: &str = r#"
SELECT EXISTS (SELECT 1 FROM ordo.inbox WHERE consumer = $1)
    OR EXISTS (SELECT 1 FROM ordo.inbox_watermarks WHERE consumer = $1)
"#;

const fn hot(
    name: &'static str,
    sql: &'static str,
    types: &'static str,
    args: &'static str,
) -> HotStatement {
    HotStatement {
        name,
        sql,
        types,
        args,
        session: &[],
    }
}

/// The statements every received message runs, for `ops::plans` (checked for JIT plans).
pub(crate) const HOT_PATH: &[HotStatement] = &[
    hot(
        "inbox: lock and claim",
        LOCK_AND_CLAIM,
        "text, text, text, bigint, text",
        "'c', 'm', NULL, NULL, 'abandoned'",
    ),
    hot("inbox: read", READ, "text, text", "'c', 'm'"),
    hot("inbox: complete", COMPLETE, "text, text", "'c', 'm'"),
    hot(
        "inbox: fail",
        FAIL,
        "text, text, text, integer, text, jsonb, text, bigint",
        "'c', 'm', 'error', 5, '{}', '{}', NULL, NULL",
    ),
    hot("inbox: unlock", UNLOCK, "text, text", "'c', 'm'"),
    hot(
        "inbox: purge",
        PURGE,
        "text, float8, bigint",
        "'c', 1000, 10000",
    ),
    hot("inbox: watermark", MARK, "text, text, text", "'c', 's', ''"),
    hot(
        "inbox: advance watermark",
        ADVANCE,
        "text, text, bigint, bigint, text",
        "'c', 's', 1, 1, ''",
    ),
    hot(
        "inbox: watermark failure",
        MARK_FAILED,
        "text, text, bigint, text, text",
        "'c', 's', 1, 'error', ''",
    ),
    hot(
        "inbox: watermark gap",
        NOTE_GAP,
        "text, text, bigint, text, bigint",
        "'c', 's', 5, '', 4",
    ),
];
