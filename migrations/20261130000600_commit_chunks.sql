-- ordo: the commit log stored as chunks, one row per append (at most 1,024 entries each).
--
-- Measured on PostgreSQL 15 with 5,000 single-event transactions (WAL bytes per event, from
-- `pg_current_wal_insert_lsn()` deltas, `benches/sql/commit_log_wal.sql`): the raw event insert
-- writes about 550 bytes; a log row per event (heap tuple and two unique indexes) added 219
-- bytes when appends carried 100 events each (1.40x the raw insert). A chunk row holding the
-- same 100 entries as arrays adds 13 bytes per event (1.02x). The per-append cost (the state row's update and the commit record) is the
-- same in both representations.
--
-- `ordo.commit_log` stays readable by plain SQL with its columns (commit_seq, sequence,
-- group_last): it becomes a view over the chunks. `ordo.commit_log_range(after, upto)` reads a
-- range of it through the chunk index (the view itself cannot push a commit_seq bound into it).
--
-- Invariants the sequencer keeps (tests check them through the view): chunks tile
-- 1..=last_commit_seq without gap or overlap; `sequences[i]` sits at `first_commit_seq + i - 1`;
-- `group_last[i]` marks the last event of its source transaction. A group may continue into
-- the next chunk. Retention deletes whole chunks below the commit floor and trims the one that
-- straddles it, so the view holds exactly `commit_floor + 1 ..= last_commit_seq`.
CREATE TABLE ordo.commit_chunks (
    first_commit_seq BIGINT NOT NULL,
    last_commit_seq  BIGINT NOT NULL,
    -- The lowest and highest event sequence in the chunk: the restart reads the chunks that
    -- reach above the sequencer's cursor, retention the lowest sequence a position still needs.
    min_sequence     BIGINT NOT NULL,
    max_sequence     BIGINT NOT NULL,
    sequences        BIGINT[] NOT NULL,
    group_last       BOOLEAN[] NOT NULL,
    CONSTRAINT commit_chunks_pkey PRIMARY KEY (first_commit_seq),
    CONSTRAINT commit_chunks_shape CHECK (
        cardinality(sequences) BETWEEN 1 AND 1024
        AND cardinality(group_last) = cardinality(sequences)
        AND last_commit_seq = first_commit_seq + cardinality(sequences) - 1
        AND min_sequence <= max_sequence)
);

CREATE INDEX commit_chunks_max_sequence_idx ON ordo.commit_chunks (max_sequence);

COMMENT ON TABLE ordo.commit_chunks IS
    'ordo commit log storage: one row per append of at most 1024 entries; read it through the view ordo.commit_log or ordo.commit_log_range()';

-- Existing rows move into chunks of 1,024 consecutive positions.
LOCK TABLE ordo.sequencer_state, ordo.commit_log IN ACCESS EXCLUSIVE MODE;

INSERT INTO ordo.commit_chunks
    (first_commit_seq, last_commit_seq, min_sequence, max_sequence, sequences, group_last)
SELECT min(commit_seq), max(commit_seq), min(sequence), max(sequence),
       array_agg(sequence ORDER BY commit_seq), array_agg(group_last ORDER BY commit_seq)
FROM ordo.commit_log
GROUP BY (commit_seq - 1) / 1024;

DROP TABLE ordo.commit_log;

CREATE VIEW ordo.commit_log AS
SELECT c.first_commit_seq + e.ord - 1 AS commit_seq, e.sequence, e.group_last
FROM ordo.commit_chunks AS c
CROSS JOIN LATERAL unnest(c.sequences, c.group_last) WITH ORDINALITY AS e(sequence, group_last, ord);

COMMENT ON VIEW ordo.commit_log IS
    'ordo commit-ordered lane: commit_seq is dense; each source transaction''s events are contiguous, group_last on its last event';

-- A range of the log, `(after, upto]`, read through the chunk index. A chunk holds at most 1,024
-- entries, so the chunk holding `after + 1` starts no lower than `after - 1022`.
CREATE FUNCTION ordo.commit_log_range(after BIGINT, upto BIGINT)
RETURNS TABLE (commit_seq BIGINT, sequence BIGINT, group_last BOOLEAN)
LANGUAGE sql STABLE
AS $$
    SELECT c.first_commit_seq + e.ord - 1, e.sequence, e.group_last
    FROM ordo.commit_chunks AS c
    CROSS JOIN LATERAL unnest(c.sequences, c.group_last) WITH ORDINALITY AS e(sequence, group_last, ord)
    WHERE c.first_commit_seq > after - 1024 AND c.first_commit_seq <= upto
      AND c.first_commit_seq + e.ord - 1 > after AND c.first_commit_seq + e.ord - 1 <= upto
    ORDER BY 1
$$;
