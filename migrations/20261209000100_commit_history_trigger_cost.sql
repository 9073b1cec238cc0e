-- The trigger that records a new server history (migration 20261208000100_commit_histories.sql)
-- ran on every append, as a SECURITY DEFINER function with its own search_path calling another
-- one (`ordo.server_history()`, which its SET keeps from being inlined): two function-call
-- contexts, each saving and restoring settings, for a check that finds the history present
-- nearly every time. Measured on a lone writer's appends of one transaction each, the trigger
-- was a quarter to a third of the append's server time (docs/performance-history.md, session 22).
--
-- It needs neither: only `ordo.append_commit_log` inserts into `ordo.commit_chunks` (it runs as
-- the owner, with search_path pinned to pg_catalog, which a trigger it fires inherits), and
-- the owner, who bypasses it, already holds every privilege the trigger uses. Every name in
-- it is schema-qualified. Same rows written, same transaction, same answer.

CREATE OR REPLACE FUNCTION ordo.note_commit_history()
RETURNS TRIGGER
LANGUAGE plpgsql
SECURITY INVOKER
AS $$
DECLARE
    -- ordo.server_history(), written out: the timeline of the WAL being written now.
    current_history INTEGER := ('x' || pg_catalog.substr(
        pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM ordo.commit_histories AS h WHERE h.history = current_history) THEN
        INSERT INTO ordo.commit_histories (history, from_commit_seq)
        VALUES (current_history, NEW.first_commit_seq)
        ON CONFLICT (history) DO NOTHING;
    END IF;
    RETURN NEW;
END
$$;

REVOKE ALL ON FUNCTION ordo.note_commit_history() FROM PUBLIC;
