-- ordo: the outbox table and its sequence.
--
-- Column order matters for plain-SQL writers: `commit_xid` is declared before `sequence`, so
-- PostgreSQL computes its default (which assigns the transaction id) before it draws the
-- sequence. A hole is therefore always drawn by a transaction that already had an xid, which
-- is what the insert lane's abandonment proof relies on (DESIGN.md section 4).
CREATE SCHEMA IF NOT EXISTS ordo;

-- CACHE 1: every nextval is visible to every session at once, so `last_value` is the real head.
CREATE SEQUENCE ordo.events_sequence AS BIGINT MINVALUE 1 START 1 CACHE 1;

CREATE TABLE ordo.events (
    commit_xid  BIGINT DEFAULT pg_current_xact_id()::text::bigint,
    sequence    BIGINT NOT NULL DEFAULT nextval('ordo.events_sequence'),
    id          UUID NOT NULL DEFAULT gen_random_uuid(),
    payload     JSONB,
    headers     JSONB NOT NULL DEFAULT '{}'::jsonb,
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT events_pkey PRIMARY KEY (sequence),
    CONSTRAINT events_id_key UNIQUE (id),
    -- A placeholder (a resolved hole) has neither payload nor transaction; a real event has both.
    CONSTRAINT events_placeholder_shape CHECK ((payload IS NULL) = (commit_xid IS NULL))
);

ALTER SEQUENCE ordo.events_sequence OWNED BY ordo.events.sequence;

CREATE INDEX events_commit_xid_idx ON ordo.events (commit_xid);

COMMENT ON TABLE ordo.events IS
    'ordo outbox: one row per event; rows with NULL payload and NULL commit_xid are placeholders for rolled-back sequences';
