-- ordo: the consumer inbox (receiving side).
--
-- Messages that arrive from outside (a broker, an HTTP endpoint, another ordo's relay) are
-- handled with exactly-once effect by deduplicating them here, in the handler's own
-- transaction. Two ways to remember what was handled:
--
-- 1. `ordo.inbox`: one row per message, keyed by (consumer, message_id).
-- 2. `ordo.inbox_watermarks`: one row per (consumer, source) holding the highest dense
--    position handled, for messages relayed from another ordo's commit lane.

-- Row-per-message mode. States:
--   processing  an attempt claimed it (written and committed before the handler runs, under a
--               session advisory lock on hash(consumer, message_id)); seen with no lock held,
--               it is an attempt that ended without an outcome (a crash), counted as failed;
--   completed   the handler's transaction committed; set in that same transaction, before the
--               handler ran, so the effect and the record commit together or not at all;
--   pending     an attempt failed (attempts, last_error) or an operator replayed it: it runs
--               on the next delivery, or from the stored payload;
--   failed      `attempts` reached the consumer's maximum: dead-lettered with its error and
--               payload, never run again until replayed.
-- `payload` and `headers` are kept while a message is not completed (for operators and
-- replays) and cleared on completion, so a completed row holds little more than its key.
CREATE TABLE ordo.inbox (
    consumer     TEXT NOT NULL,
    message_id   TEXT NOT NULL,
    status       TEXT NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    last_error   TEXT,
    payload      TEXT,
    headers      JSONB,
    source       TEXT,
    position     BIGINT,
    received_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    completed_at TIMESTAMPTZ,
    CONSTRAINT inbox_pkey PRIMARY KEY (consumer, message_id),
    CONSTRAINT inbox_status CHECK (status IN ('pending', 'processing', 'completed', 'failed')),
    CONSTRAINT inbox_completed_at CHECK ((status = 'completed') = (completed_at IS NOT NULL)),
    CONSTRAINT inbox_attempts CHECK (attempts >= 0)
);

-- Purge: completed rows by age. Failed and unprocessed rows are never purged.
CREATE INDEX inbox_completed_idx ON ordo.inbox (consumer, completed_at) WHERE status = 'completed';

-- Operators and replays: the few rows that are not completed.
CREATE INDEX inbox_unsettled_idx ON ordo.inbox (consumer, status, received_at)
    WHERE status <> 'completed';

COMMENT ON TABLE ordo.inbox IS
    'ordo: messages received by inbox consumers, one row per (consumer, message_id); completed rows are purged after the consumer''s retention';

-- Watermark mode. `position` is the highest position of `source` handled, moved in the
-- handler's transaction: position + 1 is handled, anything at or below is a duplicate,
-- anything above position + 1 is refused as a gap. `failing_position`, `attempts` and
-- `last_error` describe the message at position + 1 while it fails (written outside the
-- rolled-back transaction). Only `position` changes on the hot path and it is not indexed,
-- so updates stay HOT.
CREATE TABLE ordo.inbox_watermarks (
    consumer         TEXT NOT NULL,
    source           TEXT NOT NULL,
    position         BIGINT NOT NULL DEFAULT 0,
    failing_position BIGINT,
    attempts         INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT inbox_watermarks_pkey PRIMARY KEY (consumer, source),
    CONSTRAINT inbox_watermarks_position CHECK (position >= 0)
) WITH (fillfactor = 50);

COMMENT ON TABLE ordo.inbox_watermarks IS
    'ordo: one high-water mark per (inbox consumer, source ordo) for messages carrying a dense position';
