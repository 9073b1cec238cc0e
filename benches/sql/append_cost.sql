-- Server time of one `ordo.append_commit_log` call over one single-event transaction, without
-- its commit: the figure docs/performance-history.md (2026-12-05, `bab0155`) gives for the server-history
-- trigger before and after migration 20261209000100.
--
-- On a scratch database migrated by hand (each file in one transaction, as sqlx runs them):
--   createdb -h 127.0.0.1 -U postgres append_cost
--   for f in migrations/*.sql; do psql -h 127.0.0.1 -U postgres -d append_cost -q -1 -f "$f"; done
--   psql -h 127.0.0.1 -U postgres -d append_cost -f benches/sql/append_cost.sql
-- To compare two trigger bodies, run it after each `CREATE OR REPLACE FUNCTION
-- ordo.note_commit_history()`, alternating them (A B B A), with `VACUUM ordo.sequencer_state`
-- before each block. Each block appends 1,500 transactions and prints microseconds per call.
-- The pgbench figure of the history (the append with its commit, as the sequencer sends it) used
-- a script of these two lines, one client, `pgbench -n -M prepared -T 5 -c 1 -r -f FILE DB`:
--   INSERT INTO ordo.events(payload) VALUES ('{"sku":"abc","qty":1}');
--   SELECT count(*) FROM ordo.append_commit_log((SELECT logged_through_sequence FROM ordo.sequencer_state), (SELECT last_value FROM ordo.events_sequence));
CREATE OR REPLACE PROCEDURE pg_temp.append_cost(n int) LANGUAGE plpgsql AS $$
DECLARE
    cursor_at bigint;
    drawn bigint;
    started timestamptz;
    total float8 := 0;
BEGIN
    FOR i IN 1..n LOOP
        SELECT logged_through_sequence INTO cursor_at FROM ordo.sequencer_state;
        INSERT INTO ordo.events (payload) VALUES ('{"sku": "abc", "qty": 1}')
        RETURNING sequence INTO drawn;
        COMMIT;
        started := clock_timestamp();
        PERFORM count(*) FROM ordo.append_commit_log(cursor_at, drawn);
        total := total + extract(epoch FROM clock_timestamp() - started);
        COMMIT;
    END LOOP;
    RAISE NOTICE 'ordo.append_commit_log: % us per call', round((total * 1e6 / n)::numeric, 1);
END
$$;
VACUUM ordo.sequencer_state;
CALL pg_temp.append_cost(1500);
