-- ordo: the roles' grants cover the objects added since the roles migration.
--
-- `ordo.grant_reader` and `ordo.grant_writer` (migration 20261130000200) are replaced with
-- versions that also grant:
-- - keyed subscriptions' and relays' progress (`ordo.subscription_progress`, migration
--   20261201000100): SELECT for readers (status), and INSERT, UPDATE, DELETE for writers (an
--   Outbox running keyed subscriptions or relays writes completions and prunes them);
-- - latest values (`ordo.latest_values`, migration 20261201000300): SELECT for readers, and
--   EXECUTE on `ordo.publish_latest` for writers (the table itself stays unwritable to them);
-- - the inbox (`ordo.inbox`, `ordo.inbox_watermarks`, migration 20261201000400): SELECT for
--   readers; INSERT, UPDATE (and DELETE on `ordo.inbox`, for the purge) for writers.
-- Run `ordo grant` (or the functions) again after migrating: grants are not retroactive.

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
                   'ordo.inbox, ordo.inbox_watermarks TO %I', grantee);
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
    -- Latest values: written only through the function (no INSERT or UPDATE on the table).
    EXECUTE format('GRANT EXECUTE ON FUNCTION ordo.publish_latest(TEXT, JSONB, JSONB) TO %I', grantee);
    -- The inbox: received messages (DELETE for the purge of old completed ones) and the
    -- watermark per source.
    EXECUTE format('GRANT INSERT, UPDATE, DELETE ON ordo.inbox TO %I', grantee);
    EXECUTE format('GRANT INSERT, UPDATE ON ordo.inbox_watermarks TO %I', grantee);
END
$$;
