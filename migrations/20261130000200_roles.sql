-- ordo: least-privilege roles.
--
-- 1. `ordo.fill_placeholders`: the only way a writer role writes `sequence` or `commit_xid`.
--    The writer role may INSERT only `id`, `payload` and `headers` into ordo.events (column
--    privileges), so it cannot forge a row's place in the stream (a `sequence` above the head
--    makes the insert lane fill hundreds of placeholders that later publishes collide with) or
--    its group (a `commit_xid` of another transaction pulls it into that group). The insert
--    lane's hole resolution must still write placeholders at chosen sequences; it does so
--    through this function, which runs as the schema owner and can only write placeholders
--    (NULL payload, NULL commit_xid) at sequences already drawn (at or below the sequence's
--    `last_value`), never over an existing row.
-- 2. `ordo.grant_writer`, `ordo.grant_reader`, `ordo.grant_operator`: the grants of each role,
--    in one place, for `ordo::grant`, `ordo grant` and plain SQL. They run with the caller's
--    rights (the caller must be allowed to grant), are idempotent, and quote the role name
--    with `format('%I')`.

CREATE FUNCTION ordo.fill_placeholders(from_sequence BIGINT, upto_sequence BIGINT)
RETURNS BIGINT
LANGUAGE sql
SECURITY DEFINER
-- A SECURITY DEFINER function must not resolve names through the caller's search_path.
SET search_path = pg_catalog, pg_temp
AS $$
    WITH head AS (
        -- CACHE 1: `last_value` is the highest sequence any session has drawn.
        SELECT CASE WHEN is_called THEN last_value ELSE 0 END AS drawn
        FROM ordo.events_sequence
    ),
    filled AS (
        -- ON CONFLICT DO NOTHING: a real row is never overwritten, and a writer whose row is
        -- already inserted makes this wait for its outcome.
        INSERT INTO ordo.events (commit_xid, sequence, id, payload, headers)
        SELECT NULL, s, gen_random_uuid(), NULL, '{}'::jsonb
        FROM head, generate_series(greatest(from_sequence, 1), least(upto_sequence, head.drawn)) AS s
        ON CONFLICT (sequence) DO NOTHING
        RETURNING 1
    )
    SELECT count(*) FROM filled
$$;

-- Functions are executable by PUBLIC by default; this one writes as the owner.
REVOKE ALL ON FUNCTION ordo.fill_placeholders(BIGINT, BIGINT) FROM PUBLIC;

COMMENT ON FUNCTION ordo.fill_placeholders(BIGINT, BIGINT) IS
    'ordo: writes placeholders for the sequences of [from, upto] at or below the sequence head that have no row; returns how many';

-- Refuses roles that privileges cannot restrict: a superuser, or a member of the role owning
-- ordo's tables.
CREATE FUNCTION ordo.check_grantee(grantee TEXT, kind TEXT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owner OID := (SELECT relowner FROM pg_class WHERE oid = 'ordo.events'::regclass);
    target OID := (SELECT oid FROM pg_roles WHERE rolname = grantee);
BEGIN
    IF target IS NULL THEN
        RAISE EXCEPTION 'role "%" does not exist', grantee
            USING ERRCODE = 'undefined_object',
                  HINT = format('Create it first: CREATE ROLE %I LOGIN;', grantee);
    END IF;
    IF (SELECT rolsuper FROM pg_roles WHERE oid = target) OR pg_has_role(target, owner, 'MEMBER') THEN
        RAISE EXCEPTION 'role "%" is a superuser or acts as the owner of ordo''s tables (%): privileges cannot restrict it, so it cannot be an ordo % role',
                        grantee, owner::regrole, kind
            USING ERRCODE = 'invalid_grant_operation',
                  HINT = 'Run the application as a separate role, and ordo migrate as the owner.';
    END IF;
END
$$;

CREATE FUNCTION ordo.grant_reader(grantee TEXT)
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
                   'ordo.partitioning TO %I', grantee);
    EXECUTE format('GRANT SELECT ON SEQUENCE ordo.events_sequence TO %I', grantee);
END
$$;

CREATE FUNCTION ordo.grant_writer(grantee TEXT)
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
END
$$;

CREATE FUNCTION ordo.grant_operator(grantee TEXT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owner OID := (SELECT relowner FROM pg_class WHERE oid = 'ordo.events'::regclass);
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = grantee) THEN
        RAISE EXCEPTION 'role "%" does not exist', grantee
            USING ERRCODE = 'undefined_object',
                  HINT = format('Create it first: CREATE ROLE %I LOGIN;', grantee);
    END IF;
    -- Creating a partition of a table requires owning that table (PostgreSQL has no
    -- privilege for it), so the operator acts as the owner by membership.
    IF (SELECT rolsuper FROM pg_roles WHERE oid = owner) THEN
        RAISE EXCEPTION 'ordo''s tables are owned by %, a superuser: membership in it would let "%" become a superuser',
                        owner::regrole, grantee
            USING ERRCODE = 'invalid_grant_operation',
                  HINT = 'Run ordo migrate as a dedicated owner role that is not a superuser (see docs/operations.md, Roles), or make the operator that owner yourself.';
    END IF;
    IF (SELECT oid FROM pg_roles WHERE rolname = grantee) = owner THEN
        RETURN; -- The owner is an operator already.
    END IF;
    IF NOT pg_has_role(grantee::name, owner, 'MEMBER') THEN
        EXECUTE format('GRANT %I TO %I', (SELECT rolname FROM pg_roles WHERE oid = owner), grantee);
    END IF;
END
$$;

COMMENT ON FUNCTION ordo.grant_writer(TEXT) IS
    'ordo: grants a role what an application publishing and running an Outbox (lanes, sequencer, subscriptions) needs, and no more';
COMMENT ON FUNCTION ordo.grant_reader(TEXT) IS
    'ordo: grants a role SELECT on ordo (status, tail, listeners of an outbox with the sequencer off)';
COMMENT ON FUNCTION ordo.grant_operator(TEXT) IS
    'ordo: makes a role a member of the owner of ordo''s tables (partitions, retention, subscription admin)';
