-- ordo: secrets do not outlive delivery.
--
-- Some payloads carry what must not stay at rest once delivered: a password-reset URL, an
-- invitation token. Their keys are named in `ordo.secret_keys`; once every reader has passed an
-- event, `ordo.scrub_secrets` removes those keys from its stored payload. Everything else in
-- the row stays (the event is still an event: its id, type, headers and other keys).
--
-- 1. `ordo.secret_keys`: top-level payload keys that are secret, for one event type or, with
--    `event_type` NULL, for every type. Written by operators (the owner and its members: `ordo
--    secrets add`, `ordo::admin::add_secret_keys`, or plain SQL), read by everyone.
-- 2. `ordo.subscription_needs()`: what each subscription and relay still needs, as an event
--    sequence. A commit-lane position is a commit sequence: it needs the lowest event sequence
--    of the log rows after it (from `ordo.commit_chunks`: each chunk's `min_sequence` for the
--    chunks wholly after it, the entries after it of the chunk it ends inside). Retention reads
--    the same function (it read only `min_sequence`s before, which for the chunk a position
--    ends inside may be an event already passed), so "passed by every reader" means one thing.
-- 3. `ordo.needed_from()`: the lowest event sequence any reader still needs: the sequencer
--    (`logged_through_sequence`: no event at or below it is waiting for the log) and every
--    subscription and relay, paused and halted ones included. Every event below it has been
--    passed by all of them. A relay's parked event is above its watermark, so it is needed.
-- 4. `ordo.secret_scrub`: the scrubber's cursor. Every event below `scrubbed_below` has had its
--    secret keys removed. Adding or changing a secret key sets it back to 0, so a key named late
--    is removed from the history already passed as well (a row is rewritten only when it holds
--    a secret key: the walk itself only reads).
-- 5. `ordo.scrub_secrets(max_sequences, wait)`: one bounded step. It returns at once when no
--    secret key is configured (one read of a small table); otherwise it takes the cursor row
--    (one scrubber at a time: the others wait for it with `wait`, as an operator's scrub does,
--    or return, as the maintainers do), removes the secret keys from the
--    events in `[cursor, least(cursor + max_sequences, needed_from()))` that hold one, and
--    moves the cursor there, in one short transaction. SECURITY DEFINER: writers may not UPDATE
--    `ordo.events`, and this function lets them do nothing else; it computes its own bound, so
--    no caller can have an event scrubbed before every reader passed it. `jit = off`: it runs
--    periodically, and its statements are planned inside the function, out of EXPLAIN's view.
-- 6. Dead letters are a subscription's parked events: an event a dead letter names keeps its
--    secrets (a retry reads it again from ordo.events) until the dead letter is retried or
--    purged; a trigger then scrubs it, if the cursor passed it meanwhile.

CREATE TABLE ordo.secret_keys (
    event_type TEXT CHECK (event_type IS NULL OR octet_length(event_type) BETWEEN 1 AND 200),
    key        TEXT NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 200),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- One row per (type or every type, key); '' cannot be a type (checked above).
CREATE UNIQUE INDEX secret_keys_type_key_idx ON ordo.secret_keys ((coalesce(event_type, '')), key);

COMMENT ON TABLE ordo.secret_keys IS
    'ordo: top-level payload keys removed from stored events once every subscription and relay has passed them (event_type NULL: every type)';

CREATE TABLE ordo.secret_scrub (
    singleton      BOOLEAN NOT NULL DEFAULT TRUE,
    scrubbed_below BIGINT NOT NULL DEFAULT 0,
    updated_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT secret_scrub_pkey PRIMARY KEY (singleton),
    CONSTRAINT secret_scrub_singleton CHECK (singleton)
);

INSERT INTO ordo.secret_scrub DEFAULT VALUES;

COMMENT ON COLUMN ordo.secret_scrub.scrubbed_below IS
    'every event with a lower sequence has had its secret keys removed';

CREATE FUNCTION ordo.rescrub_secrets()
RETURNS TRIGGER
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Only when a key was really added or changed (an idempotent add inserts nothing).
    IF EXISTS (SELECT 1 FROM changed) THEN
        UPDATE ordo.secret_scrub SET scrubbed_below = 0, updated_at = now();
    END IF;
    RETURN NULL;
END
$$;

-- A transition table allows one event per trigger: two triggers.
CREATE TRIGGER secret_keys_added
AFTER INSERT ON ordo.secret_keys REFERENCING NEW TABLE AS changed
FOR EACH STATEMENT EXECUTE FUNCTION ordo.rescrub_secrets();

CREATE TRIGGER secret_keys_changed
AFTER UPDATE ON ordo.secret_keys REFERENCING NEW TABLE AS changed
FOR EACH STATEMENT EXECUTE FUNCTION ordo.rescrub_secrets();

CREATE FUNCTION ordo.subscription_needs()
RETURNS TABLE (name TEXT, lane TEXT, "position" BIGINT, needs BIGINT)
LANGUAGE sql STABLE
AS $$
    SELECT s.name, s.lane, s.position,
           CASE s.lane
           WHEN 'insert' THEN s.position + 1
           ELSE least(
               -- The chunks wholly after the position: their lowest event each.
               (SELECT min(c.min_sequence) FROM ordo.commit_chunks AS c
                WHERE c.first_commit_seq > s.position),
               -- The chunk the position ends inside (a chunk holds at most 1,024 entries, so
               -- it starts above position - 1024): only its entries after the position.
               (SELECT min(e.sequence)
                FROM ordo.commit_chunks AS c
                CROSS JOIN LATERAL unnest(c.sequences) WITH ORDINALITY AS e(sequence, ord)
                WHERE c.first_commit_seq > s.position - 1024 AND c.first_commit_seq <= s.position
                  AND c.last_commit_seq > s.position
                  AND c.first_commit_seq + e.ord - 1 > s.position))
           END
    FROM ordo.subscriptions AS s
$$;

COMMENT ON FUNCTION ordo.subscription_needs() IS
    'ordo: the lowest event sequence each subscription and relay still needs (NULL: a commit-lane one that read the whole log)';

CREATE FUNCTION ordo.needed_from()
RETURNS BIGINT
LANGUAGE sql STABLE
AS $$
    SELECT least(st.logged_through_sequence + 1,
                 (SELECT min(n.needs) FROM ordo.subscription_needs() AS n))
    FROM ordo.sequencer_state AS st
$$;

COMMENT ON FUNCTION ordo.needed_from() IS
    'ordo: the lowest event sequence the sequencer or any subscription or relay still needs; every event below it was passed by all of them';

-- The rewrite itself, for the events in [low, high): only rows holding a secret key, and not
-- an event a dead letter still names (a retry hands it to the handler again, read from
-- ordo.events: it keeps its secrets until the dead letter is retried or purged, see the
-- trigger below). `-` on an object removes keys (on an array it would remove elements:
-- objects only). Called by the two functions below, as their owner; nobody else may.
CREATE FUNCTION ordo.scrub_secrets_between(low BIGINT, high BIGINT)
RETURNS BIGINT
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    touched BIGINT;
BEGIN
    UPDATE ordo.events AS e
    SET payload = e.payload - s.keys
    FROM (
        SELECT ev.sequence, array_agg(k.key) AS keys
        FROM ordo.events AS ev
        JOIN ordo.secret_keys AS k ON k.event_type IS NULL OR k.event_type = ev.event_type
        WHERE ev.sequence >= low AND ev.sequence < high
          AND jsonb_typeof(ev.payload) = 'object' AND ev.payload ? k.key
          AND NOT EXISTS (SELECT 1 FROM ordo.dead_letters AS d WHERE d.sequence = ev.sequence)
        GROUP BY ev.sequence
    ) AS s
    WHERE e.sequence = s.sequence AND e.sequence >= low AND e.sequence < high;
    GET DIAGNOSTICS touched = ROW_COUNT;
    RETURN touched;
END
$$;

CREATE INDEX dead_letters_sequence_idx ON ordo.dead_letters (sequence);

CREATE FUNCTION ordo.scrub_secrets(max_sequences BIGINT DEFAULT 1000, wait BOOLEAN DEFAULT FALSE)
RETURNS TABLE (rewritten BIGINT, scrubbed_below BIGINT, caught_up BOOLEAN)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    done_below BIGINT;
    needed BIGINT;
    upto BIGINT;
    touched BIGINT;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM ordo.secret_keys) THEN
        RETURN QUERY SELECT 0::BIGINT, NULL::BIGINT, TRUE;
        RETURN;
    END IF;
    IF wait THEN
        SELECT c.scrubbed_below INTO done_below FROM ordo.secret_scrub AS c FOR UPDATE;
    ELSE
        SELECT c.scrubbed_below INTO done_below FROM ordo.secret_scrub AS c FOR UPDATE SKIP LOCKED;
    END IF;
    IF NOT FOUND THEN
        -- Another scrubber holds the cursor: it does this work.
        RETURN QUERY SELECT 0::BIGINT, NULL::BIGINT, TRUE;
        RETURN;
    END IF;
    -- Nothing is stored below the retention floor.
    done_below := greatest(done_below, (SELECT p.events_floor FROM ordo.partitioning AS p));
    needed := ordo.needed_from();
    IF needed IS NULL OR needed <= done_below THEN
        RETURN QUERY SELECT 0::BIGINT, done_below, TRUE;
        RETURN;
    END IF;
    upto := least(needed, done_below + greatest(max_sequences, 1));
    touched := ordo.scrub_secrets_between(done_below, upto);
    UPDATE ordo.secret_scrub SET scrubbed_below = upto, updated_at = now();
    RETURN QUERY SELECT touched, upto, upto >= needed;
END
$$;

COMMENT ON FUNCTION ordo.scrub_secrets(BIGINT, BOOLEAN) IS
    'ordo: removes the secret keys (ordo.secret_keys) from at most max_sequences stored events that every reader has passed; returns the rows rewritten, the new cursor and whether it caught up';

-- A dead letter retried (its handler's transaction deletes it) or purged: its event, if the
-- cursor passed it meanwhile, loses its secrets now. The cursor row is locked first, so a scrub
-- step running beside this (which skipped the event while the dead letter stood) has finished
-- and its cursor is the one read. SECURITY DEFINER: the writer that retries may not UPDATE
-- ordo.events.
CREATE FUNCTION ordo.scrub_after_dead_letters()
RETURNS TRIGGER
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    done_below BIGINT;
    gone BIGINT;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM ordo.secret_keys) THEN
        RETURN NULL;
    END IF;
    SELECT c.scrubbed_below INTO done_below FROM ordo.secret_scrub AS c FOR UPDATE;
    FOR gone IN SELECT DISTINCT g.sequence FROM gone_letters AS g WHERE g.sequence < done_below LOOP
        PERFORM ordo.scrub_secrets_between(gone, gone + 1);
    END LOOP;
    RETURN NULL;
END
$$;

CREATE TRIGGER dead_letters_scrub
AFTER DELETE ON ordo.dead_letters REFERENCING OLD TABLE AS gone_letters
FOR EACH STATEMENT EXECUTE FUNCTION ordo.scrub_after_dead_letters();

-- Functions are executable by PUBLIC by default; these write as the owner.
REVOKE ALL ON FUNCTION ordo.scrub_secrets(BIGINT, BOOLEAN) FROM PUBLIC;
REVOKE ALL ON FUNCTION ordo.rescrub_secrets() FROM PUBLIC;
REVOKE ALL ON FUNCTION ordo.scrub_secrets_between(BIGINT, BIGINT) FROM PUBLIC;
REVOKE ALL ON FUNCTION ordo.scrub_after_dead_letters() FROM PUBLIC;

-- The roles' grants, whole (see 20261201000900_grants.sql), with:
-- - readers: SELECT on `ordo.secret_keys` and `ordo.secret_scrub` (status, `ordo secrets list`);
-- - writers: EXECUTE on `ordo.scrub_secrets` (an Outbox's maintainer scrubs), nothing more:
--   the table of keys stays an operator's.
-- Run `ordo grant` (or the functions) again after migrating: grants are not retroactive.

CREATE OR REPLACE FUNCTION ordo.grant_reader(grantee TEXT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM ordo.check_grantee(grantee, 'reader');
    EXECUTE format('GRANT USAGE ON SCHEMA ordo TO %I', grantee);
    -- The commit log is the view ordo.commit_log over ordo.commit_chunks (migration
    -- 20261130000600); these functions run after every migration, so they may name both.
    EXECUTE format('GRANT SELECT ON ordo.events, ordo.commit_log, ordo.commit_chunks, '
                   'ordo.sequencer_state, ordo.subscriptions, ordo.dead_letters, '
                   'ordo.partitioning, ordo.subscription_progress, ordo.latest_values, '
                   'ordo.inbox, ordo.inbox_watermarks, ordo.secret_keys, ordo.secret_scrub TO %I',
                   grantee);
    EXECUTE format('GRANT SELECT ON SEQUENCE ordo.events_sequence TO %I', grantee);
END
$$;

CREATE OR REPLACE FUNCTION ordo.grant_writer(grantee TEXT)
RETURNS VOID
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM ordo.check_grantee(grantee, 'writer');
    PERFORM ordo.grant_reader(grantee);
    -- Column privileges restrict nothing while a table-level INSERT or UPDATE stands, and
    -- setval could move the head under the lane: take those away first.
    EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON ordo.events FROM %I', grantee);
    EXECUTE format('REVOKE UPDATE ON SEQUENCE ordo.events_sequence FROM %I', grantee);
    -- Publishing: the defaults stamp commit_xid, sequence and recorded_at (nextval in the
    -- default runs as the inserting role, hence USAGE on the sequence).
    EXECUTE format('GRANT INSERT (id, payload, headers, event_type) ON ordo.events TO %I', grantee);
    EXECUTE format('GRANT USAGE ON SEQUENCE ordo.events_sequence TO %I', grantee);
    -- The insert lane's hole resolution (and the status probe).
    EXECUTE format('GRANT EXECUTE ON FUNCTION ordo.fill_placeholders(BIGINT, BIGINT) TO %I', grantee);
    -- The sequencer's append under compare-and-set.
    EXECUTE format('GRANT INSERT ON ordo.commit_chunks TO %I', grantee);
    EXECUTE format('GRANT UPDATE (last_commit_seq, logged_through_sequence, updated_at) '
                   'ON ordo.sequencer_state TO %I', grantee);
    -- Subscriptions: create their row, take and renew the lease, checkpoint, halt, dead-letter.
    EXECUTE format('GRANT INSERT, UPDATE ON ordo.subscriptions TO %I', grantee);
    EXECUTE format('GRANT INSERT ON ordo.dead_letters TO %I', grantee);
    -- Keyed subscriptions and relays: completions, failures and stalls above the watermark,
    -- pruned as it moves.
    EXECUTE format('GRANT INSERT, UPDATE, DELETE ON ordo.subscription_progress TO %I', grantee);
    -- Latest values: written only through the function (no INSERT or UPDATE on the table).
    EXECUTE format('GRANT EXECUTE ON FUNCTION ordo.publish_latest(TEXT, JSONB, JSONB) TO %I', grantee);
    -- The inbox: received messages (DELETE for the purge of old completed ones) and the
    -- watermark per source.
    EXECUTE format('GRANT INSERT, UPDATE, DELETE ON ordo.inbox TO %I', grantee);
    EXECUTE format('GRANT INSERT, UPDATE ON ordo.inbox_watermarks TO %I', grantee);
    -- Secrets: removed from passed events through the function only (no UPDATE on events).
    EXECUTE format('GRANT EXECUTE ON FUNCTION ordo.scrub_secrets(BIGINT, BOOLEAN) TO %I', grantee);
END
$$;
