-- ordo: row security on the inbox tables, per consumer role (2026-12-07).
--
-- Before this, any role that may run an inbox could move another consumer's watermark
-- (`ordo.inbox_watermarks`), mark its messages handled or failed (`ordo.inbox`), or insert a
-- row for a message it has not received yet, so that the consumer would take it for a
-- duplicate. A role column on each row is not enough for the last one: the row that marks
-- another consumer's future message is a new row, whose role is the forger's own. So a
-- consumer *name* belongs to a role:
--
-- - `ordo.inbox_consumers`: one row per consumer name and the role it belongs to (`role`,
--   the role that first received for it: an `Inbox` inserts it before its first statement,
--   and refuses to receive for a name of a role it does not act as, `Error::NotOwnInbox`).
-- - Row security on `ordo.inbox` and `ordo.inbox_watermarks`: a role that is not the owner
--   inserts, updates and deletes only rows of consumers whose role it acts as (it is that role
--   or inherits its privileges). An INSERT for another's consumer fails (42501), an UPDATE or
--   DELETE of its rows matches nothing; every role still reads every row. The owner, and so an
--   operator (a member of it), bypasses row security: `ordo inbox` commands are unchanged.
--   Policies per command (not `FOR ALL`), so a plain read of the inbox tables evaluates none.
-- - Consumer names that have rows already are recorded here with the one role, other than
--   the owner, that holds INSERT on `ordo.inbox` (no other role could have written them); when
--   several roles (or PUBLIC) hold it, with no role: then only the owner may write them until
--   an operator assigns them (`ordo inbox adopt CONSUMER --role R`, `ordo::inbox::adopt_consumer`).
--
-- Roles that read or write the inbox tables get the same on the new table here, so an
-- upgraded deployment goes on without running `ordo grant` again.

CREATE TABLE ordo.inbox_consumers (
    name       TEXT NOT NULL,
    -- NULL: a consumer from before this migration whose role privileges could not tell.
    role       TEXT DEFAULT current_user,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT inbox_consumers_pkey PRIMARY KEY (name)
);

COMMENT ON TABLE ordo.inbox_consumers IS
    'ordo: the role each inbox consumer name belongs to; other roles (but the owner) may not write its rows in ordo.inbox or ordo.inbox_watermarks';

DO $$
DECLARE
    sole TEXT;
BEGIN
    SELECT CASE WHEN count(DISTINCT a.grantee) = 1 AND bool_and(a.grantee <> 0)
                THEN min(r.rolname::text) END
    INTO sole
    FROM pg_catalog.pg_class AS c
    CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
    LEFT JOIN pg_catalog.pg_roles AS r ON r.oid = a.grantee
    WHERE c.oid = 'ordo.inbox'::regclass
      AND a.privilege_type = 'INSERT'
      AND a.grantee <> c.relowner;
    INSERT INTO ordo.inbox_consumers (name, role)
    SELECT known.consumer, sole
    FROM (SELECT consumer FROM ordo.inbox UNION SELECT consumer FROM ordo.inbox_watermarks) AS known;
END
$$;

ALTER TABLE ordo.inbox_consumers ENABLE ROW LEVEL SECURITY;
CREATE POLICY inbox_consumers_read ON ordo.inbox_consumers FOR SELECT USING (TRUE);
-- A role names only itself; no policy to update or delete: only the owner reassigns a name.
CREATE POLICY inbox_consumers_claim ON ordo.inbox_consumers FOR INSERT
    WITH CHECK (role = current_user::text);

-- A role acts as the consumer's role when it is that role or inherits its privileges (written
-- out in each policy, as in migration 20261206000100). `c.name = consumer`: `consumer` is the
-- inbox table's column (the registry has none of that name).
ALTER TABLE ordo.inbox ENABLE ROW LEVEL SECURITY;
CREATE POLICY inbox_read ON ordo.inbox FOR SELECT USING (TRUE);
CREATE POLICY inbox_insert ON ordo.inbox FOR INSERT
    WITH CHECK (EXISTS (SELECT 1 FROM ordo.inbox_consumers AS c
                        WHERE c.name = consumer
                          AND (c.role = current_user::text
                               OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r
                                          WHERE r.rolname::text = c.role
                                            AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')))));
CREATE POLICY inbox_update ON ordo.inbox FOR UPDATE
    USING (EXISTS (SELECT 1 FROM ordo.inbox_consumers AS c
                   WHERE c.name = consumer
                     AND (c.role = current_user::text
                          OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r
                                     WHERE r.rolname::text = c.role
                                       AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')))))
    WITH CHECK (EXISTS (SELECT 1 FROM ordo.inbox_consumers AS c
                        WHERE c.name = consumer
                          AND (c.role = current_user::text
                               OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r
                                          WHERE r.rolname::text = c.role
                                            AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')))));
CREATE POLICY inbox_delete ON ordo.inbox FOR DELETE
    USING (EXISTS (SELECT 1 FROM ordo.inbox_consumers AS c
                   WHERE c.name = consumer
                     AND (c.role = current_user::text
                          OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r
                                     WHERE r.rolname::text = c.role
                                       AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')))));

ALTER TABLE ordo.inbox_watermarks ENABLE ROW LEVEL SECURITY;
CREATE POLICY inbox_watermarks_read ON ordo.inbox_watermarks FOR SELECT USING (TRUE);
CREATE POLICY inbox_watermarks_insert ON ordo.inbox_watermarks FOR INSERT
    WITH CHECK (EXISTS (SELECT 1 FROM ordo.inbox_consumers AS c
                        WHERE c.name = consumer
                          AND (c.role = current_user::text
                               OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r
                                          WHERE r.rolname::text = c.role
                                            AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')))));
CREATE POLICY inbox_watermarks_update ON ordo.inbox_watermarks FOR UPDATE
    USING (EXISTS (SELECT 1 FROM ordo.inbox_consumers AS c
                   WHERE c.name = consumer
                     AND (c.role = current_user::text
                          OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r
                                     WHERE r.rolname::text = c.role
                                       AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')))))
    WITH CHECK (EXISTS (SELECT 1 FROM ordo.inbox_consumers AS c
                        WHERE c.name = consumer
                          AND (c.role = current_user::text
                               OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r
                                          WHERE r.rolname::text = c.role
                                            AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')))));
CREATE POLICY inbox_watermarks_delete ON ordo.inbox_watermarks FOR DELETE
    USING (EXISTS (SELECT 1 FROM ordo.inbox_consumers AS c
                   WHERE c.name = consumer
                     AND (c.role = current_user::text
                          OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r
                                     WHERE r.rolname::text = c.role
                                       AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')))));

-- Roles that read the inbox read the registry; roles that write it (the consumer's and
-- writer's grant) name their consumers in it. Explicit grants only, never the owner's.
DO $$
DECLARE
    grantee TEXT;
BEGIN
    FOR grantee IN
        SELECT DISTINCT r.rolname::text
        FROM pg_catalog.pg_class AS c
        CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
        JOIN pg_catalog.pg_roles AS r ON r.oid = a.grantee
        WHERE c.oid IN ('ordo.inbox'::regclass, 'ordo.inbox_watermarks'::regclass)
          AND a.privilege_type = 'SELECT'
          AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT SELECT ON ordo.inbox_consumers TO %I', grantee);
    END LOOP;
    FOR grantee IN
        SELECT DISTINCT r.rolname::text
        FROM pg_catalog.pg_class AS c
        CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
        JOIN pg_catalog.pg_roles AS r ON r.oid = a.grantee
        WHERE c.oid IN ('ordo.inbox'::regclass, 'ordo.inbox_watermarks'::regclass)
          AND a.privilege_type = 'INSERT'
          AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT SELECT, INSERT ON ordo.inbox_consumers TO %I', grantee);
    END LOOP;
END
$$;

-- The grant functions (newest versions before these: migration 20261210000100) with the
-- registry added: SELECT for every role, INSERT for consumers (and so writers).
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
                   'ordo.secret_scrub, ordo.relay_attempts, ordo.relay_routes TO %I',
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
    -- Row security keeps it to the consumers named for its role in ordo.inbox_consumers.
    EXECUTE format('GRANT INSERT ON ordo.inbox_consumers TO %I', grantee);
    EXECUTE format('GRANT INSERT, UPDATE, DELETE ON ordo.inbox TO %I', grantee);
    EXECUTE format('GRANT INSERT, UPDATE ON ordo.inbox_watermarks TO %I', grantee);
    EXECUTE format('GRANT EXECUTE ON FUNCTION ordo.scrub_secrets(BIGINT, BOOLEAN) TO %I', grantee);
END
$$;
