-- One contract from publisher to inbox (2026-12-07): a history that changes whenever positions
-- can be handed out again, and a chain a receiver can check.
--
-- 1. Server histories are no longer PostgreSQL timelines alone.
--
--    A restore from a dump, a storage snapshot rolled back, or commits lost with
--    `synchronous_commit = off` take the commit log back on the same timeline, and the fold then
--    gives the lost positions to new events. A watermark inbox downstream, which had those
--    positions from the lost events, dropped the new events as duplicates. Now every rewind an
--    outbox detects begins a new history (`ordo.begin_history`, below), and a promotion still
--    does (the trigger, now keyed on the timeline column). A history's id is taken from the
--    server clock (microseconds since 1970, and always above every id the table holds), so a
--    history begun after a restore is newer than any begun before it, including those the
--    restore took away.
--
--      history          the id a relay sends as `Ordo-History` (was the timeline: old rows
--                       keep their number, which is below every clock-taken id);
--      timeline         the PostgreSQL timeline it was begun on;
--      cause            'start' (the log's first history), 'promotion' (the first append on a
--                       timeline the table had no history of), 'rewind' (an outbox found
--                       positions given to other events);
--      lost_through     for a rewind: the highest position the detecting process had seen, so
--                       positions from_commit_seq ..= lost_through held events the database
--                       no longer holds (NULL when unknown).
ALTER TABLE ordo.commit_histories ALTER COLUMN history TYPE BIGINT;
ALTER TABLE ordo.commit_histories
    ADD COLUMN timeline     INTEGER,
    ADD COLUMN cause        TEXT NOT NULL DEFAULT 'promotion',
    ADD COLUMN lost_through BIGINT,
    ADD CONSTRAINT commit_histories_cause CHECK (cause IN ('start', 'promotion', 'rewind'));
UPDATE ordo.commit_histories SET timeline = history::integer;
UPDATE ordo.commit_histories SET cause = 'start' WHERE from_commit_seq = 1;
ALTER TABLE ordo.commit_histories
    ALTER COLUMN timeline SET DEFAULT ordo.server_history(),
    ALTER COLUMN timeline SET NOT NULL;

COMMENT ON TABLE ordo.commit_histories IS
    'ordo: the server histories of the commit log: a new one at every promotion and every rewind an outbox detects; the history of position p is the newest one whose from_commit_seq <= p';

-- The trigger on ordo.commit_chunks: a history for a timeline the table has none of. Same cost
-- as before on the path taken nearly every time (one probe of a table of a few rows); the id
-- is taken only when a row is written.
CREATE OR REPLACE FUNCTION ordo.note_commit_history()
RETURNS TRIGGER
LANGUAGE plpgsql
SECURITY INVOKER
AS $$
DECLARE
    -- ordo.server_history(), written out: the timeline of the WAL being written now.
    current_timeline INTEGER := ('x' || pg_catalog.substr(
        pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM ordo.commit_histories AS h WHERE h.timeline = current_timeline) THEN
        INSERT INTO ordo.commit_histories (history, timeline, from_commit_seq, cause)
        SELECT GREATEST(coalesce(max(h.history), 0) + 1,
                        (extract(epoch FROM pg_catalog.clock_timestamp()) * 1000000)::bigint),
               current_timeline, NEW.first_commit_seq, 'promotion'
        FROM ordo.commit_histories AS h
        ON CONFLICT (history) DO NOTHING;
    END IF;
    RETURN NEW;
END
$$;

REVOKE ALL ON FUNCTION ordo.note_commit_history() FROM PUBLIC;

-- Begins a new history after a rewind an outbox detected: `known` is the newest history the
-- outbox knew (NULL: begin one whatever the table holds, for an operator after a restore), `first_position` the lowest position it knows may have been given to another
-- event (NULL: not known, the log's head + 1 now), `lost_through` the highest position it had
-- seen. Under the state row's lock, so no append runs meanwhile. Idempotent across processes:
-- when a history newer than `known` already begins at or below `first_position` (another
-- process detected the same rewind, or a promotion began one), that one is returned and
-- nothing is written. Returns the history now in force from there and whether this call
-- began it.
CREATE FUNCTION ordo.begin_history(known BIGINT, first_position BIGINT, lost_through BIGINT)
RETURNS TABLE (history BIGINT, from_commit_seq BIGINT, began BOOLEAN)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    head BIGINT;
    newest BIGINT;
    begins_at BIGINT;
BEGIN
    SELECT st.last_commit_seq INTO head
    FROM ordo.sequencer_state AS st WHERE st.singleton FOR UPDATE;
    begins_at := greatest(1, least(coalesce(first_position, head + 1), head + 1));
    SELECT max(h.history) INTO newest FROM ordo.commit_histories AS h;
    -- `known` NULL (an operator after a restore no process saw): always a new history.
    IF known IS NOT NULL THEN
        RETURN QUERY
            SELECT h.history, h.from_commit_seq, FALSE
            FROM ordo.commit_histories AS h
            WHERE h.history > known AND h.from_commit_seq <= begins_at
            ORDER BY h.history DESC
            LIMIT 1;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    RETURN QUERY
        INSERT INTO ordo.commit_histories AS h (history, timeline, from_commit_seq, cause, lost_through)
        VALUES (greatest(coalesce(newest, 0) + 1, coalesce(known, 0) + 1,
                         (extract(epoch FROM clock_timestamp()) * 1000000)::bigint),
                ordo.server_history(), begins_at, 'rewind',
                CASE WHEN lost_through >= begins_at THEN lost_through END)
        RETURNING h.history, h.from_commit_seq, TRUE;
END
$$;

REVOKE ALL ON FUNCTION ordo.begin_history(BIGINT, BIGINT, BIGINT) FROM PUBLIC;

COMMENT ON FUNCTION ordo.begin_history(BIGINT, BIGINT, BIGINT) IS
    'ordo: begins a new server history after a rewind an outbox detected (positions given to other events), unless one newer than the caller knew already covers it';

-- Whoever may append may begin a history (the outbox that folds is the one that detects).
DO $$
DECLARE
    grantee TEXT;
BEGIN
    FOR grantee IN
        SELECT DISTINCT r.rolname::text
        FROM pg_catalog.pg_proc AS p
        CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) AS a
        JOIN pg_catalog.pg_roles AS r ON r.oid = a.grantee
        WHERE p.oid = 'ordo.append_commit_log(bigint, bigint)'::regprocedure
          AND a.privilege_type = 'EXECUTE'
          AND a.grantee <> p.proowner
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION ordo.begin_history(BIGINT, BIGINT, BIGINT) TO %I', grantee);
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION ordo.grant_sequencer(grantee TEXT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM ordo.check_grantee(grantee, 'sequencer');
    PERFORM ordo.grant_reader(grantee);
    EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON ordo.commit_chunks FROM %I', grantee);
    EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON ordo.sequencer_state FROM %I', grantee);
    EXECUTE format('GRANT EXECUTE ON FUNCTION ordo.fill_placeholders(BIGINT, BIGINT) TO %I', grantee);
    EXECUTE format('GRANT EXECUTE ON FUNCTION ordo.append_commit_log(BIGINT, BIGINT) TO %I', grantee);
    EXECUTE format('GRANT EXECUTE ON FUNCTION ordo.begin_history(BIGINT, BIGINT, BIGINT) TO %I', grantee);
END
$$;

-- 2. Route chains of relays.
--
-- Each relayed message says which position came before it on its route (the destination the
-- sink sends it to: a subject, an exchange and routing key, a URL): `Ordo-Previous`. A
-- watermark inbox then takes a position after positions the relay passed over (other types,
-- other routes) and still refuses one after a position that was sent and did not arrive. The
-- relay computes the chain as it reads its lane, in lane order; a claim starts it from what
-- this table holds: per (relay, route), the highest position at or below the relay's stored
-- position that belongs to the route. Written with the watermark, in the same statement,
-- fenced by the lease; an operator's reset below a route's position deletes that route's row.
CREATE TABLE ordo.relay_routes (
    relay    TEXT   NOT NULL REFERENCES ordo.subscriptions (name) ON DELETE CASCADE,
    route    TEXT   NOT NULL,
    position BIGINT NOT NULL CHECK (position >= 1),
    CONSTRAINT relay_routes_pkey PRIMARY KEY (relay, route)
);

COMMENT ON TABLE ordo.relay_routes IS
    'ordo: per relay and route (destination), the last position at or below the relay''s stored position sent there: the start of the route''s chain (Ordo-Previous) when the relay is claimed';

ALTER TABLE ordo.relay_routes ENABLE ROW LEVEL SECURITY;
CREATE POLICY relay_routes_read ON ordo.relay_routes FOR SELECT USING (TRUE);
CREATE POLICY relay_routes_own ON ordo.relay_routes FOR ALL
    USING (EXISTS (SELECT 1 FROM ordo.subscriptions AS s
                   WHERE s.name = relay
                     AND (s.role = current_user::text
                          OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r
                                     WHERE r.rolname::text = s.role
                                       AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')))))
    WITH CHECK (EXISTS (SELECT 1 FROM ordo.subscriptions AS s
                        WHERE s.name = relay
                          AND (s.role = current_user::text
                               OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r
                                          WHERE r.rolname::text = s.role
                                            AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')))));

-- The roles that read and run relays today read and write it too.
DO $$
DECLARE
    grantee TEXT;
BEGIN
    FOR grantee IN
        SELECT DISTINCT r.rolname::text
        FROM pg_catalog.pg_class AS c
        CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
        JOIN pg_catalog.pg_roles AS r ON r.oid = a.grantee
        WHERE c.oid = 'ordo.relay_attempts'::regclass
          AND a.privilege_type = 'SELECT'
          AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT SELECT ON ordo.relay_routes TO %I', grantee);
    END LOOP;
    FOR grantee IN
        SELECT DISTINCT r.rolname::text
        FROM pg_catalog.pg_class AS c
        CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
        JOIN pg_catalog.pg_roles AS r ON r.oid = a.grantee
        WHERE c.oid = 'ordo.relay_attempts'::regclass
          AND a.privilege_type = 'INSERT'
          AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT INSERT, UPDATE, DELETE ON ordo.relay_routes TO %I', grantee);
    END LOOP;
END
$$;

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
                   'ordo.inbox, ordo.inbox_watermarks, ordo.secret_keys, ordo.secret_scrub, '
                   'ordo.relay_attempts, ordo.relay_routes TO %I',
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
    EXECUTE format('GRANT INSERT, UPDATE, DELETE ON ordo.inbox TO %I', grantee);
    EXECUTE format('GRANT INSERT, UPDATE ON ordo.inbox_watermarks TO %I', grantee);
    EXECUTE format('GRANT EXECUTE ON FUNCTION ordo.scrub_secrets(BIGINT, BOOLEAN) TO %I', grantee);
END
$$;

-- 3. Watermark inboxes: one mark per (consumer, source, route), and history ids of 64 bits.
--
-- A relay's routes are separate chains: an inbox that reads two subjects of one source keeps a
-- mark for each. Messages that name no route (an older sender, a sink with one destination)
-- keep one mark per source, under route ''.
ALTER TABLE ordo.inbox_watermarks
    ALTER COLUMN history TYPE BIGINT,
    ALTER COLUMN rewound_history TYPE BIGINT,
    ADD COLUMN route TEXT NOT NULL DEFAULT '',
    -- The position a refused message waits for: its previous one on the route (it is no
    -- longer always the mark + 1).
    ADD COLUMN gap_expected BIGINT;
ALTER TABLE ordo.inbox_watermarks
    DROP CONSTRAINT inbox_watermarks_pkey,
    ADD CONSTRAINT inbox_watermarks_pkey PRIMARY KEY (consumer, source, route);

COMMENT ON COLUMN ordo.inbox_watermarks.route IS
    'ordo: the sender''s route (destination) the mark follows (Ordo-Route); empty for a sender with one';
