-- ordo: stuck keys' backlogs (2026-12-07).
--
-- A keyed subscription or relay whose event stalls (a relay's parked event, a subscription's
-- event whose attempts ran out under `Halt`) used to keep that event, and every later event of
-- its keys, in its window: the low watermark stopped at the stalled event, the window filled
-- with the events behind it, and after a window's worth of events every other key waited too.
-- Now the stalled event and every later event of its keys are copied here, fenced by the
-- lease, and the watermark moves past them: the window holds only live keys, and retention
-- goes on (a copy survives the pruning of `ordo.events`).
--
-- A row is a copy of the `ordo.events` row as stored (payload bytes, headers with their trace
-- context, type, id, transaction, time) with the consumer's lane position and the event's keys:
-- all that delivering it again needs. The stalled event's own state (attempts, error, an
-- operator's retry) stays in `ordo.subscription_progress`, which no longer prunes a row the
-- watermark passed while its event is here. Rows leave when the event is delivered (in the
-- handler's transaction, or with the relay's marks), or by an operator's purge.

CREATE TABLE ordo.key_backlogs (
    subscription TEXT        NOT NULL REFERENCES ordo.subscriptions (name) ON DELETE CASCADE,
    position     BIGINT      NOT NULL,
    keys         TEXT[]      NOT NULL,
    moved_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    sequence     BIGINT      NOT NULL,
    commit_xid   BIGINT      NOT NULL,
    id           UUID        NOT NULL,
    payload      JSONB       NOT NULL,
    headers      JSONB       NOT NULL,
    recorded_at  TIMESTAMPTZ NOT NULL,
    event_type   TEXT,
    -- A relay's route chain link (`Ordo-Route`, `Ordo-Previous`) as first read: a message sent
    -- from the backlog carries the same link as any earlier send of it.
    route        TEXT,
    previous     BIGINT,
    CONSTRAINT key_backlogs_pkey PRIMARY KEY (subscription, position)
);
-- No index on the keys: an index entry holds the whole key, and a key is whatever an event's
-- payload says (a 12 kB key would make every copy of its event fail). A backlog is read by
-- position, a page at a time, and each page's keys filtered there.

CREATE INDEX key_backlogs_sequence_idx ON ordo.key_backlogs (sequence);

-- Secrets: an event in a backlog has not been delivered, so it keeps its secret keys, in
-- `ordo.events` and in its copy, as an event a dead letter names does (migration
-- 20261202000100); once its copy leaves the backlog (delivered, skipped, purged), the event
-- loses them if the scrub's cursor passed it meanwhile. The rewrite below is that migration's,
-- with the backlog added to what it leaves alone.
CREATE OR REPLACE FUNCTION ordo.scrub_secrets_between(low BIGINT, high BIGINT)
RETURNS BIGINT
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    touched BIGINT;
BEGIN
    UPDATE ordo.events AS e
    SET payload = e.payload - s.keys
    FROM (
        SELECT ev.sequence, array_agg(k.key) AS keys
        FROM ordo.events AS ev
        JOIN ordo.secret_keys AS k ON k.event_type IS NULL OR k.event_type = ev.event_type
        WHERE ev.sequence >= low AND ev.sequence < high
          AND jsonb_typeof(ev.payload) = 'object' AND ev.payload ? k.key
          AND NOT EXISTS (SELECT 1 FROM ordo.dead_letters AS d WHERE d.sequence = ev.sequence)
          AND NOT EXISTS (SELECT 1 FROM ordo.key_backlogs AS b WHERE b.sequence = ev.sequence)
        GROUP BY ev.sequence
    ) AS s
    WHERE e.sequence = s.sequence AND e.sequence >= low AND e.sequence < high;
    GET DIAGNOSTICS touched = ROW_COUNT;
    RETURN touched;
END
$$;

CREATE FUNCTION ordo.scrub_after_backlogs()
RETURNS TRIGGER
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    done_below BIGINT;
    gone BIGINT;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM ordo.secret_keys) THEN
        RETURN NULL;
    END IF;
    SELECT c.scrubbed_below INTO done_below FROM ordo.secret_scrub AS c FOR UPDATE;
    FOR gone IN SELECT DISTINCT g.sequence FROM gone_copies AS g WHERE g.sequence < done_below LOOP
        PERFORM ordo.scrub_secrets_between(gone, gone + 1);
    END LOOP;
    RETURN NULL;
END
$$;

CREATE TRIGGER key_backlogs_scrub
AFTER DELETE ON ordo.key_backlogs REFERENCING OLD TABLE AS gone_copies
FOR EACH STATEMENT EXECUTE FUNCTION ordo.scrub_after_backlogs();

REVOKE ALL ON FUNCTION ordo.scrub_after_backlogs() FROM PUBLIC;
REVOKE ALL ON FUNCTION ordo.scrub_secrets_between(BIGINT, BIGINT) FROM PUBLIC;

-- What operators did to backlogs (a stalled event skipped, a key's backlog purged): who, when,
-- and what it dropped, so that a missing event can be accounted for afterwards.
CREATE TABLE ordo.backlog_actions (
    id           BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subscription TEXT        NOT NULL,
    action       TEXT        NOT NULL CHECK (action IN ('skip', 'purge')),
    key          TEXT        NOT NULL,
    positions    BIGINT[]    NOT NULL,
    ids          UUID[]      NOT NULL,
    bytes        BIGINT      NOT NULL,
    done_by      TEXT        NOT NULL DEFAULT current_user,
    done_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX backlog_actions_subscription_idx ON ordo.backlog_actions (subscription, done_at);

COMMENT ON TABLE ordo.key_backlogs IS
    'ordo: events of stuck keys moved out of a keyed subscription''s or relay''s window, copied as stored, until delivered or purged';

-- Written by the roles that run subscriptions, as their progress is.
ALTER TABLE ordo.key_backlogs ENABLE ROW LEVEL SECURITY;
CREATE POLICY key_backlogs_read ON ordo.key_backlogs FOR SELECT USING (TRUE);
CREATE POLICY key_backlogs_own ON ordo.key_backlogs FOR ALL
    USING (EXISTS (SELECT 1 FROM ordo.subscriptions AS s
                   WHERE s.name = subscription
                     AND (s.role = current_user::text
                          OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r
                                     WHERE r.rolname::text = s.role
                                       AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')))))
    WITH CHECK (EXISTS (SELECT 1 FROM ordo.subscriptions AS s
                        WHERE s.name = subscription
                          AND (s.role = current_user::text
                               OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r
                                          WHERE r.rolname::text = s.role
                                            AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')))));

-- Roles that read or write the progress get the same here, so an upgraded deployment goes on
-- without running `ordo grant` again. Explicit grants only, never the owner's.
DO $$
DECLARE
    grantee TEXT;
BEGIN
    FOR grantee IN
        SELECT DISTINCT r.rolname::text
        FROM pg_catalog.pg_class AS c
        CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
        JOIN pg_catalog.pg_roles AS r ON r.oid = a.grantee
        WHERE c.oid = 'ordo.subscription_progress'::regclass
          AND a.privilege_type = 'SELECT'
          AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT SELECT ON ordo.key_backlogs, ordo.backlog_actions TO %I', grantee);
    END LOOP;
    FOR grantee IN
        SELECT DISTINCT r.rolname::text
        FROM pg_catalog.pg_class AS c
        CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
        JOIN pg_catalog.pg_roles AS r ON r.oid = a.grantee
        WHERE c.oid = 'ordo.subscription_progress'::regclass
          AND a.privilege_type = 'INSERT'
          AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT INSERT, UPDATE, DELETE ON ordo.key_backlogs TO %I', grantee);
    END LOOP;
END
$$;

-- The grant functions (newest versions before these: migration 20261210000500) with the
-- backlogs added.
CREATE OR REPLACE FUNCTION ordo.grant_reader(grantee TEXT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM ordo.check_grantee(grantee, 'reader');
    EXECUTE format('GRANT USAGE ON SCHEMA ordo TO %I', grantee);
    EXECUTE format('GRANT SELECT ON ordo.events, ordo.commit_log, ordo.commit_chunks, '
                   'ordo.sequencer_state, ordo.subscriptions, ordo.dead_letters, '
                   'ordo.partitioning, ordo.subscription_progress, ordo.latest_values, '
                   'ordo.inbox, ordo.inbox_watermarks, ordo.inbox_consumers, ordo.secret_keys, '
                   'ordo.secret_scrub, ordo.relay_attempts, ordo.relay_routes, ordo.key_backlogs, '
                   'ordo.backlog_actions TO %I',
                   grantee);
    EXECUTE format('GRANT SELECT ON SEQUENCE ordo.events_sequence TO %I', grantee);
    IF to_regclass('ordo._sqlx_migrations') IS NOT NULL THEN
        EXECUTE format('GRANT SELECT ON ordo._sqlx_migrations TO %I', grantee);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION ordo.grant_consumer(grantee TEXT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM ordo.check_grantee(grantee, 'consumer');
    PERFORM ordo.grant_sequencer(grantee);
    EXECUTE format('GRANT INSERT, UPDATE ON ordo.subscriptions TO %I', grantee);
    EXECUTE format('GRANT INSERT, UPDATE, DELETE ON ordo.dead_letters TO %I', grantee);
    EXECUTE format('GRANT INSERT, UPDATE, DELETE ON ordo.subscription_progress TO %I', grantee);
    EXECUTE format('GRANT INSERT, DELETE ON ordo.relay_attempts TO %I', grantee);
    EXECUTE format('GRANT INSERT, UPDATE, DELETE ON ordo.relay_routes TO %I', grantee);
    EXECUTE format('GRANT INSERT, UPDATE, DELETE ON ordo.key_backlogs TO %I', grantee);
    -- Row security keeps it to the consumers named for its role in ordo.inbox_consumers.
    EXECUTE format('GRANT INSERT ON ordo.inbox_consumers TO %I', grantee);
    EXECUTE format('GRANT INSERT, UPDATE, DELETE ON ordo.inbox TO %I', grantee);
    EXECUTE format('GRANT INSERT, UPDATE ON ordo.inbox_watermarks TO %I', grantee);
    EXECUTE format('GRANT EXECUTE ON FUNCTION ordo.scrub_secrets(BIGINT, BOOLEAN) TO %I', grantee);
END
$$;
