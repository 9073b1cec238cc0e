-- ordo: least privilege that holds (issue 29). Roles granted by `ordo grant` no longer write
-- ordo's shared state directly where a forged write breaks other consumers' guarantees.
--
-- 1. The commit log. `ordo.append_commit_log(expected, new_cursor)` is the only way a role that
--    is not the owner appends: it runs as the owner (SECURITY DEFINER, a fixed search_path)
--    and takes what it appends from `ordo.events` itself, in its own snapshot, so no caller
--    can choose the entries:
--    - the cursor moves forward, never above the sequence head, and only over sequences that
--      all have a row (every hole in the range resolved: a real event or a placeholder);
--      anything else is refused (SQLSTATE OR001) and nothing is written;
--    - the groups appended are the transactions whose lowest event lies in the range (their
--      first member: a transaction whose lowest event is at or below the old cursor was
--      appended whole when the cursor passed it), each with all its events, contiguous, in
--      the order of their lowest events, numbered densely from the head.
--    Roles lose INSERT on `ordo.commit_chunks` and UPDATE on `ordo.sequencer_state`; this
--    migration takes them from every role that holds them, so an upgraded deployment is
--    restricted without running `ordo grant` again.
-- 2. Subscriptions and relays. Each row of `ordo.subscriptions` records the role that runs it
--    (`role`, the creating role) and what it is (`kind`: a subscription or a relay). Row-level
--    security lets a role that is not the owner write only the rows of roles it acts as (it is
--    that role or inherits its privileges), and their progress, dead letters and attempt
--    history; every role still reads every row (status, monitors). A relay never runs a
--    subscription's row nor the reverse (checked at start, with the kind stored). Rows from
--    before this migration have neither: the first runner to start on one after the upgrade
--    records its kind and role (see the CHANGELOG on pinning them first).
--    The owner (and so an operator, a member of it) bypasses row security, as PostgreSQL does
--    for a table's owner: administration is unchanged.
-- 3. Roles for each part of a deployment: `ordo.grant_publisher` (publishes only),
--    `ordo.grant_sequencer` (folds: resolves holes and appends through the function),
--    `ordo.grant_consumer` (runs subscriptions, relays and inboxes, and folds),
--    `ordo.grant_writer` (publisher and consumer: the whole Outbox in one application), besides
--    `ordo.grant_reader` and `ordo.grant_operator`.

-- 1. The commit log ---------------------------------------------------------------------------

CREATE FUNCTION ordo.append_refused(reason TEXT)
RETURNS BOOLEAN
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'ordo: commit log append refused: %', reason
        USING ERRCODE = 'OR001',
              HINT = 'The commit log is appended through ordo.append_commit_log over a range of ordo.events whose every sequence has its row (the sequencer folds only such ranges).';
END
$$;

REVOKE ALL ON FUNCTION ordo.append_refused(TEXT) FROM PUBLIC;

-- The statement is the sequencer's append of before (see `src/commit_lane/sql.rs`: why the
-- members are looked up as a CTE of their own, in one `= ANY` index scan per partition), with
-- the groups found from the range instead of sent by the caller. A transaction met in the range
-- whose lowest event is at or below the old cursor is left out: it is in the log already
-- (a row with a `commit_xid` written by hand is reported by the sequencer, which met it).
CREATE FUNCTION ordo.append_commit_log(expected_cursor BIGINT, new_cursor BIGINT)
RETURNS TABLE (commit_seq BIGINT, sequence BIGINT, group_last BOOLEAN, commit_xid BIGINT)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF expected_cursor IS NULL OR new_cursor IS NULL OR new_cursor < expected_cursor THEN
        PERFORM ordo.append_refused(format('the cursor may only move forward (from %s to %s)',
                                           expected_cursor, new_cursor));
    END IF;
    RETURN QUERY
    WITH span AS MATERIALIZED (
        SELECT e.sequence, e.commit_xid
        FROM ordo.events AS e
        WHERE e.sequence > expected_cursor AND e.sequence <= new_cursor
    ),
    found AS MATERIALIZED (
        SELECT e.sequence, e.commit_xid
        FROM ordo.events AS e
        -- In key order: the index is probed in order (unordered, the probe of 5,000
        -- transactions took four times as long).
        WHERE e.commit_xid = ANY (ARRAY(SELECT s.commit_xid FROM span AS s
                                        WHERE s.commit_xid IS NOT NULL
                                        GROUP BY s.commit_xid ORDER BY s.commit_xid))
    ),
    -- Every event of every transaction met in the range, with its group's first and last.
    candidates AS MATERIALIZED (
        SELECT f.commit_xid AS xid, f.sequence,
               first_value(f.sequence) OVER w AS low,
               last_value(f.sequence) OVER w AS last
        FROM found AS f
        WINDOW w AS (PARTITION BY f.commit_xid ORDER BY f.sequence
                     ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
    ),
    -- The groups first met in the range, numbered in log order.
    members AS MATERIALIZED (
        SELECT c.sequence, c.xid,
               row_number() OVER (ORDER BY c.low, c.sequence) AS rn,
               c.sequence = c.last AS group_last
        FROM candidates AS c
        WHERE c.low > expected_cursor
    ),
    verdict AS MATERIALIZED (
        SELECT CASE
            WHEN new_cursor > (SELECT CASE WHEN q.is_called THEN q.last_value ELSE 0 END
                               FROM ordo.events_sequence AS q)
                THEN ordo.append_refused(format('cursor %s is above the sequence head', new_cursor))
            WHEN (SELECT count(*) FROM span) <> new_cursor - expected_cursor
                THEN ordo.append_refused(format('sequences in (%s, %s] have no row yet: the range is not resolved',
                                                expected_cursor, new_cursor))
            ELSE TRUE
        END AS ok
    ),
    state AS (
        UPDATE ordo.sequencer_state AS st
        SET last_commit_seq = st.last_commit_seq + (SELECT count(*) FROM members),
            logged_through_sequence = new_cursor,
            updated_at = now()
        WHERE st.singleton AND st.logged_through_sequence = expected_cursor
          AND (SELECT v.ok FROM verdict AS v)
        RETURNING st.last_commit_seq - (SELECT count(*) FROM members) AS base
    ),
    chunks AS (
        INSERT INTO ordo.commit_chunks
            (first_commit_seq, last_commit_seq, min_sequence, max_sequence, sequences, group_last)
        SELECT state.base + min(m.rn), state.base + max(m.rn), min(m.sequence), max(m.sequence),
               array_agg(m.sequence ORDER BY m.rn), array_agg(m.group_last ORDER BY m.rn)
        FROM state, members AS m
        GROUP BY state.base, (m.rn - 1) / 1024
    )
    SELECT state.base + m.rn, m.sequence, m.group_last, m.xid
    FROM state LEFT JOIN members AS m ON TRUE
    ORDER BY m.rn;
END
$$;

REVOKE ALL ON FUNCTION ordo.append_commit_log(BIGINT, BIGINT) FROM PUBLIC;

COMMENT ON FUNCTION ordo.append_commit_log(BIGINT, BIGINT) IS
    'ordo: the sequencer''s append under compare-and-set of the transactions first met in (expected, new_cursor], taken from ordo.events (dense, each committed event once, groups whole and contiguous; refused over an unresolved range or above the head); no row back when the cursor was not the one expected';

-- Roles that could append directly keep folding, through the function.
DO $$
DECLARE
    grantee TEXT;
BEGIN
    -- Explicit grants only (PUBLIC and predefined roles such as pg_write_all_data are left
    -- as they are), and never the owner's.
    FOR grantee IN
        SELECT DISTINCT r.rolname::text
        FROM pg_catalog.pg_class AS c
        CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
        JOIN pg_catalog.pg_roles AS r ON r.oid = a.grantee
        WHERE c.oid = 'ordo.commit_chunks'::regclass
          AND a.privilege_type = 'INSERT'
          AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON ordo.commit_chunks FROM %I', grantee);
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON ordo.sequencer_state FROM %I', grantee);
        EXECUTE format('GRANT EXECUTE ON FUNCTION ordo.append_commit_log(BIGINT, BIGINT) TO %I', grantee);
    END LOOP;
END
$$;

-- 2. Subscriptions and relays -----------------------------------------------------------------

-- NULL on rows from before this migration (see above); the default is the inserting role.
ALTER TABLE ordo.subscriptions
    ADD COLUMN kind TEXT,
    ADD COLUMN role TEXT,
    ADD CONSTRAINT subscriptions_kind CHECK (kind IN ('subscription', 'relay'));
ALTER TABLE ordo.subscriptions ALTER COLUMN role SET DEFAULT current_user;

COMMENT ON COLUMN ordo.subscriptions.kind IS
    'ordo: subscription or relay; a runner of one kind never runs a row of the other (NULL: created before ordo recorded it)';
COMMENT ON COLUMN ordo.subscriptions.role IS
    'ordo: the role that runs it; other roles (but the owner) may not write the row, its progress, dead letters or attempts (NULL: created before ordo recorded it)';

-- A role acts as `role` when it is that role or inherits its privileges. Written out in each
-- policy (a policy's expression is stored resolved; a helper function would be resolved in
-- the caller's search_path each time it is inlined). A role that no longer exists matches no
-- one (pg_has_role on a name would raise instead).
ALTER TABLE ordo.subscriptions ENABLE ROW LEVEL SECURITY;
CREATE POLICY subscriptions_read ON ordo.subscriptions FOR SELECT USING (TRUE);
CREATE POLICY subscriptions_create ON ordo.subscriptions FOR INSERT
    WITH CHECK (role = current_user::text);
-- A row from before the roles were recorded may be adopted (its role set to the caller's).
CREATE POLICY subscriptions_run ON ordo.subscriptions FOR UPDATE
    USING (role IS NULL OR role = current_user::text
           OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r
                      WHERE r.rolname::text = role
                        AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')))
    WITH CHECK (role = current_user::text
                OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r
                           WHERE r.rolname::text = role
                             AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')));
CREATE POLICY subscriptions_remove ON ordo.subscriptions FOR DELETE
    USING (role = current_user::text
           OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r
                      WHERE r.rolname::text = role
                        AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')));

-- The rows that belong to a subscription: writable by the roles that may run it.
ALTER TABLE ordo.subscription_progress ENABLE ROW LEVEL SECURITY;
CREATE POLICY subscription_progress_read ON ordo.subscription_progress FOR SELECT USING (TRUE);
CREATE POLICY subscription_progress_own ON ordo.subscription_progress FOR ALL
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

ALTER TABLE ordo.dead_letters ENABLE ROW LEVEL SECURITY;
CREATE POLICY dead_letters_read ON ordo.dead_letters FOR SELECT USING (TRUE);
CREATE POLICY dead_letters_own ON ordo.dead_letters FOR ALL
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

ALTER TABLE ordo.relay_attempts ENABLE ROW LEVEL SECURITY;
CREATE POLICY relay_attempts_read ON ordo.relay_attempts FOR SELECT USING (TRUE);
CREATE POLICY relay_attempts_own ON ordo.relay_attempts FOR ALL
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

-- 3. Roles --------------------------------------------------------------------------------------

-- Every role reads every table, now with ordo's migration history too (`ordo status` warns on a
-- schema migrated by a newer ordo).
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
                   'ordo.relay_attempts TO %I',
                   grantee);
    EXECUTE format('GRANT SELECT ON SEQUENCE ordo.events_sequence TO %I', grantee);
    IF to_regclass('ordo._sqlx_migrations') IS NOT NULL THEN
        EXECUTE format('GRANT SELECT ON ordo._sqlx_migrations TO %I', grantee);
    END IF;
END
$$;

-- Publishes (and reads, as every role does): INSERT of the columns a publisher sets, the
-- sequence its default draws from, latest values through their function.
CREATE FUNCTION ordo.grant_publisher(grantee TEXT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM ordo.check_grantee(grantee, 'publisher');
    PERFORM ordo.grant_reader(grantee);
    -- Column privileges restrict nothing while a table-level INSERT or UPDATE stands, and
    -- setval could move the head under the lane: take those away first.
    EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON ordo.events FROM %I', grantee);
    EXECUTE format('REVOKE UPDATE ON SEQUENCE ordo.events_sequence FROM %I', grantee);
    -- The defaults stamp commit_xid, sequence and recorded_at (nextval in the default runs as
    -- the inserting role, hence USAGE on the sequence).
    EXECUTE format('GRANT INSERT (id, payload, headers, event_type) ON ordo.events TO %I', grantee);
    EXECUTE format('GRANT USAGE ON SEQUENCE ordo.events_sequence TO %I', grantee);
    EXECUTE format('GRANT EXECUTE ON FUNCTION ordo.publish_latest(TEXT, JSONB, JSONB) TO %I', grantee);
END
$$;

-- Folds: resolves holes (placeholders through their function) and appends to the commit log
-- through its function. Direct writes to the log and its state are taken away.
CREATE FUNCTION ordo.grant_sequencer(grantee TEXT)
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
END
$$;

-- Consumes: folds (an Outbox runs a sequencer by default), runs its own subscriptions and
-- relays (row security keeps it to its own rows), its inboxes, and scrubs secret keys.
CREATE FUNCTION ordo.grant_consumer(grantee TEXT)
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
    EXECUTE format('GRANT INSERT, UPDATE, DELETE ON ordo.inbox TO %I', grantee);
    EXECUTE format('GRANT INSERT, UPDATE ON ordo.inbox_watermarks TO %I', grantee);
    EXECUTE format('GRANT EXECUTE ON FUNCTION ordo.scrub_secrets(BIGINT, BOOLEAN) TO %I', grantee);
END
$$;

-- The whole Outbox in one application: publishes and consumes.
CREATE OR REPLACE FUNCTION ordo.grant_writer(grantee TEXT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM ordo.check_grantee(grantee, 'writer');
    PERFORM ordo.grant_publisher(grantee);
    PERFORM ordo.grant_consumer(grantee);
END
$$;

COMMENT ON FUNCTION ordo.grant_publisher(TEXT) IS
    'ordo: grants a role what publishing needs (insert events, latest values) and reading, no more';
COMMENT ON FUNCTION ordo.grant_sequencer(TEXT) IS
    'ordo: grants a role what folding needs: placeholders and commit log appends through their checking functions';
COMMENT ON FUNCTION ordo.grant_consumer(TEXT) IS
    'ordo: grants a role what running subscriptions, relays and inboxes needs (its own rows only), and folding';
COMMENT ON FUNCTION ordo.grant_writer(TEXT) IS
    'ordo: grants a role what an application publishing and running an Outbox (lanes, sequencer, subscriptions) needs: publisher and consumer';
