-- ordo.commit_log_range(after, upto) found the chunk holding `after + 1` by reading every chunk
-- that begins within 1,024 positions below it (a chunk holds at most 1,024 entries). Chunks are
-- one per append, and at a steady trickle an append is a single event: the function then
-- unnested about a thousand one-entry chunks to return a handful of rows. The sequencer's
-- catch-up after a peer's append took 2.4 ms on average for it, and a commit-lane page read as
-- long. The chunk holding `after + 1` is the one with the highest first position at or below
-- it: one index descent.
CREATE OR REPLACE FUNCTION ordo.commit_log_range(after BIGINT, upto BIGINT)
RETURNS TABLE (commit_seq BIGINT, sequence BIGINT, group_last BOOLEAN)
LANGUAGE sql STABLE
AS $$
    SELECT c.first_commit_seq + e.ord - 1, e.sequence, e.group_last
    FROM ordo.commit_chunks AS c
    CROSS JOIN LATERAL unnest(c.sequences, c.group_last) WITH ORDINALITY AS e(sequence, group_last, ord)
    WHERE c.first_commit_seq >= coalesce(
              (SELECT max(f.first_commit_seq) FROM ordo.commit_chunks AS f
               WHERE f.first_commit_seq <= after + 1 AND f.first_commit_seq > after - 1024),
              after + 1)
      AND c.first_commit_seq <= upto
      AND c.first_commit_seq + e.ord - 1 > after AND c.first_commit_seq + e.ord - 1 <= upto
    ORDER BY 1
$$;
