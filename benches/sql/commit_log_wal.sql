-- WAL bytes per event of the commit log's two representations, by `pg_current_wal_insert_lsn()`
-- deltas (independent of machine noise): the figures docs/performance-history.md gives as "before" (a log row
-- per event, as the sequencer wrote them up to commit 5facaca) and for chunks.
--
-- It needs the schema as it was before migration 20261130000600 (ordo.commit_log a table). On a
-- private cluster nothing else writes to (WAL is cluster-wide):
--   pg_createcluster 15 bench -p 5433 --start -- --auth-local=trust --auth-host=trust
--   createdb -h 127.0.0.1 -p 5433 -U postgres walbefore
--   git archive 5facaca migrations | tar -x -C /tmp/before
--   for f in /tmp/before/migrations/*.sql; do psql -h 127.0.0.1 -p 5433 -U postgres -d walbefore -1 -f "$f"; done
--   psql -h 127.0.0.1 -p 5433 -U postgres -d walbefore -At -f benches/sql/commit_log_wal.sql
-- Measured on 2026-11-30 on such a private cluster (stock PostgreSQL 15.20), bytes per event:
-- raw 548; log rows at 1 per append +346 (1.63x), at 100 per append +219 (1.40x); chunks at 100
-- per append +13, at 1 per append +343.
-- Rerunnable: it empties the log tables it writes first.
TRUNCATE ordo.commit_log;
DROP TABLE IF EXISTS ordo.chunk_test;
CHECKPOINT;
SELECT pg_current_wal_insert_lsn() AS a \gset
DO $$ BEGIN FOR i IN 1..5000 LOOP
  INSERT INTO ordo.events(payload) VALUES (jsonb_build_object('order_id',1000000+i,'customer_id',500000+i%997,'sku','SKU-00042-BLUE-XL','quantity',3,'total_cents',1299+i,'currency','EUR'));
  COMMIT; END LOOP; END $$;
SELECT pg_current_wal_insert_lsn() AS b \gset
SELECT 'raw per event', pg_wal_lsn_diff(:'b', :'a')/5000;
CHECKPOINT;
SELECT pg_current_wal_insert_lsn() AS a \gset
DO $$ DECLARE s bigint := (SELECT coalesce(max(sequence),0) FROM ordo.commit_log); BEGIN FOR i IN 1..5000 LOOP
  UPDATE ordo.sequencer_state SET last_commit_seq = last_commit_seq+1, logged_through_sequence = logged_through_sequence + 1, updated_at=now();
  INSERT INTO ordo.commit_log(commit_seq, sequence, group_last) VALUES (i, s+i, true);
  COMMIT; END LOOP; END $$;
SELECT pg_current_wal_insert_lsn() AS b \gset
SELECT 'log row + state, per-event append', pg_wal_lsn_diff(:'b', :'a')/5000;
CHECKPOINT;
SELECT pg_current_wal_insert_lsn() AS a \gset
DO $$ BEGIN FOR i IN 1..50 LOOP
  UPDATE ordo.sequencer_state SET last_commit_seq = last_commit_seq+100, updated_at=now();
  INSERT INTO ordo.commit_log(commit_seq, sequence, group_last) SELECT 100000+i*100+j, 100000+i*100+j, true FROM generate_series(1,100) j;
  COMMIT; END LOOP; END $$;
SELECT pg_current_wal_insert_lsn() AS b \gset
SELECT 'log rows, 100 per append', pg_wal_lsn_diff(:'b', :'a')/5000;
CREATE TABLE ordo.chunk_test(first_commit_seq bigint, last_commit_seq bigint, min_sequence bigint, max_sequence bigint, sequences bigint[], lasts boolean[], primary key(first_commit_seq));
CHECKPOINT;
SELECT pg_current_wal_insert_lsn() AS a \gset
DO $$ BEGIN FOR i IN 1..50 LOOP
  UPDATE ordo.sequencer_state SET last_commit_seq = last_commit_seq+100, updated_at=now();
  INSERT INTO ordo.chunk_test SELECT i*100+1, i*100+100, i*100+1, i*100+100, array_agg(i*100+j), array_agg(true) FROM generate_series(1,100) j;
  COMMIT; END LOOP; END $$;
SELECT pg_current_wal_insert_lsn() AS b \gset
SELECT 'chunk, 100 per append', pg_wal_lsn_diff(:'b', :'a')/5000;
CHECKPOINT;
SELECT pg_current_wal_insert_lsn() AS a \gset
DO $$ BEGIN FOR i IN 1..5000 LOOP
  UPDATE ordo.sequencer_state SET last_commit_seq = last_commit_seq+1, updated_at=now();
  INSERT INTO ordo.chunk_test SELECT 10000000+i, 10000000+i, i, i, ARRAY[i::bigint], ARRAY[true];
  COMMIT; END LOOP; END $$;
SELECT pg_current_wal_insert_lsn() AS b \gset
SELECT 'chunk, 1 per append', pg_wal_lsn_diff(:'b', :'a')/5000;
DROP TABLE ordo.chunk_test;
