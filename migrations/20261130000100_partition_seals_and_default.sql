-- ordo: a write never fails for want of a partition, and retention judges a partition by when
-- it was sealed.
--
-- DEFAULT partitions. A row whose sequence no range partition covers (the partitions made
-- ahead ran out: no maintainer ran, or its role may not create tables) lands in
-- `events_default` / `commit_log_default` instead of failing the writer's transaction. The lanes
-- read it like any other partition. The maintainer (every `Outbox`, `ordo retention --apply`)
-- folds a default that holds rows back into a range partition: in one short transaction it
-- detaches the default, attaches that same table (its rows are not copied) as the range
-- partition that covers them, and creates an empty default again. While the default holds rows,
-- PostgreSQL must scan it to create any range partition, and refuses one whose range holds some
-- of its rows; that is why the maintainer folds before it creates.
--
-- Seals. `recorded_at` is a transaction's start, so it says nothing reliable about when an event
-- became visible: a transaction that starts early and publishes last makes a whole partition
-- look old. A partition is sealed once every sequence below its upper bound is resolved (the
-- insert lane's frontier, as the table shows it, has reached the bound): no event can enter it
-- any more, and every event in it committed before that moment. The maintainer records the
-- first time it sees each partition sealed; retention drops a partition only when that moment
-- is older than `keep`, so every event in it committed at least `keep` ago.
CREATE TABLE ordo.partition_seals (
    -- The partition's exclusive upper bound (`TO`): sequences below it are all resolved.
    upper_bound BIGINT NOT NULL,
    -- When the maintainer first saw it sealed (a clock reading taken after the frontier was read).
    sealed_at   TIMESTAMPTZ NOT NULL,
    CONSTRAINT partition_seals_pkey PRIMARY KEY (upper_bound)
);

CREATE TABLE ordo.events_default PARTITION OF ordo.events DEFAULT;
CREATE TABLE ordo.commit_log_default PARTITION OF ordo.commit_log DEFAULT;
