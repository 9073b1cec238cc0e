-- ordo: range partitions for retention.
--
-- `ordo.events` and `ordo.commit_log` become tables partitioned by `sequence` (the event's
-- insert sequence) with the same bounds, so a partition of events and the log rows of exactly
-- those events are created and dropped together. Existing rows stay where they are: each old
-- table is attached, whole, as the first partition. New partitions are created ahead of the
-- head by the maintainer (every `Outbox`, and `ordo retention`).
--
-- Constraint changes forced by partitioning (a unique index must include the partition key):
-- - `events.id` is no longer UNIQUE (ids are UUIDv7 from ordo or `gen_random_uuid()`); it keeps
--   an index (`events_id_idx`) for lookups.
-- - `commit_log`'s primary key is `(commit_seq, sequence)`; `sequence` stays UNIQUE. Density of
--   `commit_seq` is kept by the sequencer's compare-and-set, as before.
--
-- The partition size is `ordo.partition_size` (a setting, for tests and special deployments)
-- or 1,000,000 sequences; it is stored in `ordo.partitioning` and can be changed there.

CREATE TABLE ordo.partitioning (
    singleton      BOOLEAN NOT NULL DEFAULT TRUE,
    partition_size BIGINT NOT NULL,
    -- The lowest sequence still stored: reading the insert lane below it is an error.
    events_floor   BIGINT NOT NULL DEFAULT 0,
    -- The highest commit sequence dropped: reading the commit lane at or below it is an error.
    commit_floor   BIGINT NOT NULL DEFAULT 0,
    updated_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT partitioning_pkey PRIMARY KEY (singleton),
    CONSTRAINT partitioning_singleton CHECK (singleton),
    CONSTRAINT partitioning_size CHECK (partition_size >= 10)
);

INSERT INTO ordo.partitioning (partition_size)
VALUES (coalesce(nullif(current_setting('ordo.partition_size', true), '')::bigint, 1000000));

LOCK TABLE ordo.events, ordo.commit_log IN ACCESS EXCLUSIVE MODE;

-- The old tables become the first partitions.
ALTER TABLE ordo.events RENAME TO events_p0;
ALTER TABLE ordo.events_p0 RENAME CONSTRAINT events_pkey TO events_p0_pkey;
ALTER TABLE ordo.events_p0 DROP CONSTRAINT events_id_key;
ALTER INDEX ordo.events_commit_xid_idx RENAME TO events_p0_commit_xid_idx;
ALTER TABLE ordo.commit_log RENAME TO commit_log_p0;
ALTER TABLE ordo.commit_log_p0 DROP CONSTRAINT commit_log_pkey;
ALTER TABLE ordo.commit_log_p0 RENAME CONSTRAINT commit_log_sequence_key TO commit_log_p0_sequence_key;

-- commit_xid stays declared before sequence: its default (the xid) is computed first.
CREATE TABLE ordo.events (
    commit_xid  BIGINT DEFAULT pg_current_xact_id()::text::bigint,
    sequence    BIGINT NOT NULL DEFAULT nextval('ordo.events_sequence'),
    id          UUID NOT NULL DEFAULT gen_random_uuid(),
    payload     JSONB,
    headers     JSONB NOT NULL DEFAULT '{}'::jsonb,
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT events_pkey PRIMARY KEY (sequence),
    CONSTRAINT events_placeholder_shape CHECK ((payload IS NULL) = (commit_xid IS NULL))
) PARTITION BY RANGE (sequence);
CREATE INDEX events_commit_xid_idx ON ordo.events (commit_xid);
CREATE INDEX events_id_idx ON ordo.events (id);
ALTER SEQUENCE ordo.events_sequence OWNED BY ordo.events.sequence;
COMMENT ON TABLE ordo.events IS
    'ordo outbox: one row per event; rows with NULL payload and NULL commit_xid are placeholders for rolled-back sequences';

CREATE TABLE ordo.commit_log (
    commit_seq BIGINT NOT NULL,
    sequence   BIGINT NOT NULL,
    group_last BOOLEAN NOT NULL,
    CONSTRAINT commit_log_pkey PRIMARY KEY (commit_seq, sequence),
    CONSTRAINT commit_log_sequence_key UNIQUE (sequence)
) PARTITION BY RANGE (sequence);

-- The first partitions end at a size boundary past everything drawn so far; two more follow.
DO $$
DECLARE
    size  BIGINT := (SELECT partition_size FROM ordo.partitioning);
    head  BIGINT := greatest(
        (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM ordo.events_sequence),
        coalesce((SELECT max(sequence) FROM ordo.events_p0), 0));
    upper BIGINT := (head / size + 1) * size + 1;
BEGIN
    EXECUTE format('ALTER TABLE ordo.events ATTACH PARTITION ordo.events_p0 FOR VALUES FROM (MINVALUE) TO (%s)', upper);
    EXECUTE format('ALTER TABLE ordo.commit_log ATTACH PARTITION ordo.commit_log_p0 FOR VALUES FROM (MINVALUE) TO (%s)', upper);
    FOR i IN 0..1 LOOP
        EXECUTE format('CREATE TABLE ordo.events_%s PARTITION OF ordo.events FOR VALUES FROM (%s) TO (%s)',
                       upper + i * size, upper + i * size, upper + (i + 1) * size);
        EXECUTE format('CREATE TABLE ordo.commit_log_%s PARTITION OF ordo.commit_log FOR VALUES FROM (%s) TO (%s)',
                       upper + i * size, upper + i * size, upper + (i + 1) * size);
    END LOOP;
END
$$;
