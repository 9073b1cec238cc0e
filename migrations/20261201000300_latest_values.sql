-- ordo: latest values (ephemeral, latest-value events).
--
-- Some facts have only a current value: an exchange rate, the feature flags. Keeping every
-- one of them in ordo.events would grow the lanes' history with values nobody replays, so they
-- live apart: one row per event type, overwritten by each publish. Nothing here enters
-- ordo.events or the commit log.
--
-- 1. `ordo.latest_values`: the newest value of each type. `version` counts the committed
--    publishes of that type (1, 2, 3, ...): the upsert takes the row's lock and holds it to
--    COMMIT, so concurrent publishers of one type commit one after the other and each sees the
--    version before it. The last to commit wins and has the highest version; listeners keep
--    the highest version they have seen, so every listener converges on the table's value.
--    Rows are never deleted by ordo: a row deleted by hand restarts its type at version 1,
--    which listeners already running ignore until it passes the version they hold.
-- 2. `ordo.publish_latest(type, payload, headers)`: the only way ordo writes a value. It upserts
--    the row and sends `NOTIFY ordo_latest, '<version> <type>'` in the same transaction, so
--    the notification is delivered if and only if the value commits, after it is visible.
--    The notification carries no payload (NOTIFY payloads are limited to 8000 bytes):
--    listeners read the row. A transactional NOTIFY takes the notification queue's lock at
--    commit; latest values are published rarely (a rate, a flag), so that is accepted here,
--    unlike for ordo.events, whose wake-ups are debounced outside the writing transactions.
--    SECURITY DEFINER: a writer needs EXECUTE on this function only, and cannot forge a
--    version (a lower one would be ignored by every listener; a higher one would hide the
--    versions below it).
CREATE TABLE ordo.latest_values (
    -- The NOTIFY payload holds the type: bounded well below NOTIFY's 8000 bytes.
    event_type TEXT PRIMARY KEY CHECK (octet_length(event_type) BETWEEN 1 AND 200),
    payload JSONB NOT NULL,
    headers JSONB NOT NULL DEFAULT '{}'::jsonb,
    version BIGINT NOT NULL CHECK (version > 0),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);

COMMENT ON TABLE ordo.latest_values IS
    'ordo: the newest value of each latest-value event type (not part of ordo.events nor of the commit log)';
COMMENT ON COLUMN ordo.latest_values.version IS
    'how many publishes of this type have committed; grows by one per publish';
COMMENT ON COLUMN ordo.latest_values.updated_at IS
    'when the newest value was published (clock time of the publishing statement)';

CREATE FUNCTION ordo.publish_latest(latest_type TEXT, latest_payload JSONB, latest_headers JSONB DEFAULT '{}'::jsonb)
RETURNS BIGINT
LANGUAGE plpgsql
SECURITY DEFINER
-- A SECURITY DEFINER function must not resolve names through the caller's search_path.
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    published BIGINT;
BEGIN
    INSERT INTO ordo.latest_values AS l (event_type, payload, headers, version, updated_at)
    VALUES (latest_type, latest_payload, coalesce(latest_headers, '{}'::jsonb), 1, clock_timestamp())
    ON CONFLICT (event_type) DO UPDATE
        SET payload = EXCLUDED.payload,
            headers = EXCLUDED.headers,
            version = l.version + 1,
            updated_at = EXCLUDED.updated_at
    RETURNING l.version INTO published;
    -- Delivered at COMMIT, and only then. Distinct versions keep PostgreSQL from folding two
    -- publishes of one type in one transaction into one notification.
    PERFORM pg_notify('ordo_latest', published::text || ' ' || latest_type);
    RETURN published;
END
$$;

-- Functions are executable by PUBLIC by default; this one writes as the owner.
REVOKE ALL ON FUNCTION ordo.publish_latest(TEXT, JSONB, JSONB) FROM PUBLIC;

COMMENT ON FUNCTION ordo.publish_latest(TEXT, JSONB, JSONB) IS
    'ordo: stores the newest value of a latest-value event type, notifies ordo_latest at commit; returns its version';
