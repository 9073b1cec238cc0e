-- ordo: event types.
--
-- One column, nullable: NULL means untyped (a placeholder has no type; plain-SQL writers that
-- do not set it write untyped events, exactly as before). The Rust publisher fills it from the
-- payload's serde tag. Listeners and subscriptions select on it, and skip the types they do not
-- handle before decoding the payload, so a foreign row never halts a typed subscription.
--
-- Added at the end: `commit_xid` stays declared before `sequence` (see the first migration).
-- On a partitioned table, ADD COLUMN reaches every partition, and partitions created later
-- take it from the parent. No default and no constraint: no rewrite, no scan.
ALTER TABLE ordo.events ADD COLUMN event_type TEXT;

COMMENT ON COLUMN ordo.events.event_type IS
    'the event''s type (e.g. a Rust enum variant); NULL is untyped; subscriptions and listeners select on it';
