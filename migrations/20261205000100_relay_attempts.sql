-- ordo: the history of a relay event's failed attempts (issue 27, item 7).
--
-- `ordo.subscription_progress` keeps one row per failing or parked event: its attempts so far
-- and its *last* error. This table keeps each failed attempt: when, why, and which process
-- (host, pid, lease owner) sent it, so an operator can answer "was this event sent, when, and
-- why not" (`ordo relay attempts RELAY POSITION`, `ordo::admin::relay_attempts`).
--
-- Bounded: the relay keeps the newest 20 attempts of an event (older ones go in the statement
-- that adds one); every attempt of an event that retention dropped (its `sequence` below the
-- oldest stored event) goes in that statement too; and the rows go with the relay's row
-- (`ON DELETE CASCADE`). A delivered event keeps its history until retention drops it: "it
-- failed three times, then went" is an answer too.

CREATE TABLE ordo.relay_attempts (
    relay      TEXT        NOT NULL REFERENCES ordo.subscriptions (name) ON DELETE CASCADE,
    -- The event's position on the relay's lane, and its insert-lane sequence.
    position   BIGINT      NOT NULL,
    sequence   BIGINT      NOT NULL,
    -- The event's failed attempts when this one failed (1 for the first; an operator's requeue
    -- counts from 1 again, so a number may repeat: `failed_at` orders them).
    attempt    INTEGER     NOT NULL,
    failed_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    error      TEXT        NOT NULL,
    parked     BOOLEAN     NOT NULL,
    host       TEXT        NOT NULL,
    pid        INTEGER     NOT NULL,
    owner      UUID        NOT NULL,
    id         BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY
);

CREATE INDEX relay_attempts_event_idx ON ordo.relay_attempts (relay, position, failed_at);
CREATE INDEX relay_attempts_sequence_idx ON ordo.relay_attempts (sequence);

-- The roles' grants also cover the new table: readers see the history (status), writers (an
-- Outbox running relays) add to it and prune it. The rest is as in 20261202000100.
CREATE OR REPLACE FUNCTION ordo.grant_reader(grantee TEXT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM ordo.check_grantee(grantee, 'reader');
    EXECUTE format('GRANT USAGE ON SCHEMA ordo TO %I', grantee);
    -- The commit log is the view ordo.commit_log over ordo.commit_chunks (migration
    -- 20261130000600); these functions run after every migration, so they may name both.
    EXECUTE format('GRANT SELECT ON ordo.events, ordo.commit_log, ordo.commit_chunks, '
                   'ordo.sequencer_state, ordo.subscriptions, ordo.dead_letters, '
                   'ordo.partitioning, ordo.subscription_progress, ordo.latest_values, '
                   'ordo.inbox, ordo.inbox_watermarks, ordo.secret_keys, ordo.secret_scrub, '
                   'ordo.relay_attempts TO %I',
                   grantee);
    EXECUTE format('GRANT SELECT ON SEQUENCE ordo.events_sequence TO %I', grantee);
END
$$;

CREATE OR REPLACE FUNCTION ordo.grant_writer(grantee TEXT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM ordo.check_grantee(grantee, 'writer');
    PERFORM ordo.grant_reader(grantee);
    -- Column privileges restrict nothing while a table-level INSERT or UPDATE stands, and
    -- setval could move the head under the lane: take those away first.
    EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON ordo.events FROM %I', grantee);
    EXECUTE format('REVOKE UPDATE ON SEQUENCE ordo.events_sequence FROM %I', grantee);
    -- Publishing: the defaults stamp commit_xid, sequence and recorded_at (nextval in the
    -- default runs as the inserting role, hence USAGE on the sequence).
    EXECUTE format('GRANT INSERT (id, payload, headers, event_type) ON ordo.events TO %I', grantee);
    EXECUTE format('GRANT USAGE ON SEQUENCE ordo.events_sequence TO %I', grantee);
    -- The insert lane's hole resolution (and the status probe).
    EXECUTE format('GRANT EXECUTE ON FUNCTION ordo.fill_placeholders(BIGINT, BIGINT) TO %I', grantee);
    -- The sequencer's append under compare-and-set.
    EXECUTE format('GRANT INSERT ON ordo.commit_chunks TO %I', grantee);
    EXECUTE format('GRANT UPDATE (last_commit_seq, logged_through_sequence, updated_at) '
                   'ON ordo.sequencer_state TO %I', grantee);
    -- Subscriptions: create their row, take and renew the lease, checkpoint, halt, dead-letter.
    EXECUTE format('GRANT INSERT, UPDATE ON ordo.subscriptions TO %I', grantee);
    EXECUTE format('GRANT INSERT ON ordo.dead_letters TO %I', grantee);
    -- Keyed subscriptions and relays: completions, failures and stalls above the watermark,
    -- pruned as it moves.
    EXECUTE format('GRANT INSERT, UPDATE, DELETE ON ordo.subscription_progress TO %I', grantee);
    -- Relays: each failed attempt's history, bounded and pruned by the relay.
    EXECUTE format('GRANT INSERT, DELETE ON ordo.relay_attempts TO %I', grantee);
    -- Latest values: written only through the function (no INSERT or UPDATE on the table).
    EXECUTE format('GRANT EXECUTE ON FUNCTION ordo.publish_latest(TEXT, JSONB, JSONB) TO %I', grantee);
    -- The inbox: received messages (DELETE for the purge of old completed ones) and the
    -- watermark per source.
    EXECUTE format('GRANT INSERT, UPDATE, DELETE ON ordo.inbox TO %I', grantee);
    EXECUTE format('GRANT INSERT, UPDATE ON ordo.inbox_watermarks TO %I', grantee);
    -- Secrets: removed from passed events through the function only (no UPDATE on events).
    EXECUTE format('GRANT EXECUTE ON FUNCTION ordo.scrub_secrets(BIGINT, BOOLEAN) TO %I', grantee);
END
$$;
