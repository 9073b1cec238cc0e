-- ordo: the commit log's chunk arrays compressed with lz4 where the server has it.
--
-- A chunk of more than about 250 entries is larger than PostgreSQL's TOAST threshold (2 kB), so
-- its arrays are compressed on insert: every chunk a catching-up fold writes (1,024 entries)
-- is. With the default method (pglz) that compression was a sixth of such an append's server
-- time: `EXPLAIN ANALYZE` of an append of 2,000 single-event transactions on
-- PostgreSQL 15 took 18 to 22 ms with pglz and 16 to 17 ms with lz4. lz4 stores these arrays
-- in about a quarter more bytes (4.1 kB against 3.3 kB for 1,024 entries: 4 bytes per event
-- against 3). Chunks written under a stream of commits hold a few dozen entries and are never
-- compressed, so the per-event WAL of a live outbox does not change.
--
-- Existing chunks keep their compression (PostgreSQL reads either); new ones use lz4. A server
-- built without lz4 keeps pglz, and the migration says so.
DO $$
BEGIN
    ALTER TABLE ordo.commit_chunks
        ALTER COLUMN sequences SET COMPRESSION lz4,
        ALTER COLUMN group_last SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    RAISE NOTICE 'ordo: this server has no lz4; ordo.commit_chunks keeps pglz (%)', SQLERRM;
END
$$;
