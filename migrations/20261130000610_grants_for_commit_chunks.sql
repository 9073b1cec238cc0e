-- ordo: the role functions of migration 20261130000200 name `ordo.commit_log`, which
-- migration 20261130000600 turned into a view over `ordo.commit_chunks`. Readers also read the
-- chunks (the view and `ordo.commit_log_range` read them as the caller), and a writer's
-- sequencer appends to them.
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
                   'ordo.partitioning TO %I', grantee);
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
    -- The insert lane's hole resolution.
    EXECUTE format('GRANT EXECUTE ON FUNCTION ordo.fill_placeholders(BIGINT, BIGINT) TO %I', grantee);
    -- The sequencer's append under compare-and-set (chunks only grow; retention, an
    -- operator's job, deletes them).
    EXECUTE format('REVOKE INSERT ON ordo.commit_log FROM %I', grantee);
    EXECUTE format('GRANT INSERT ON ordo.commit_chunks TO %I', grantee);
    EXECUTE format('GRANT UPDATE (last_commit_seq, logged_through_sequence, updated_at) '
                   'ON ordo.sequencer_state TO %I', grantee);
    -- Subscriptions: create their row, take and renew the lease, checkpoint, halt, dead-letter.
    EXECUTE format('GRANT INSERT, UPDATE ON ordo.subscriptions TO %I', grantee);
    EXECUTE format('GRANT INSERT ON ordo.dead_letters TO %I', grantee);
END
$$;
