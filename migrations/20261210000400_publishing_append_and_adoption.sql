-- ordo: least privilege, the rest (2026-12-07).
--
-- 1. `ordo.append_commit_log` is refused (SQLSTATE OR001, nothing written) inside a transaction
--    that has published events: its own transaction id stamped on rows of `ordo.events`. Such
--    a transaction reads its own uncommitted events in the range; a writer role calling the
--    function there logged its group before the rest of its events were inserted, and those
--    stayed off the commit lane (the sequencer blamed the column default; `ordo status`
--    showed no lag and no stall). A sequencer appends in a statement of its own, which has no
--    transaction id when the function starts: the check costs it nothing. Publishing after an
--    append, in the same transaction, draws sequences above the new cursor, which are folded
--    as usual.
-- 2. Subscription and relay rows from before roles were recorded (`role` NULL, migration
--    20261206000100) are no longer adoptable by any role: row security lets only the owner
--    (and so an operator) write them. A runner of another role is refused at start
--    (`Error::Unadopted`) until an operator assigns the row (`ordo subscriptions adopt NAME
--    --role R`, `ordo::admin::adopt_subscription`). Where privileges tell who ran them (exactly
--    one role other than the owner holds UPDATE on `ordo.subscriptions`: no other could have
--    run a row), this migration assigns them to that role now.

-- 1. The append -------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION ordo.append_commit_log(expected_cursor BIGINT, new_cursor BIGINT)
RETURNS TABLE (commit_seq BIGINT, sequence BIGINT, group_last BOOLEAN, commit_xid BIGINT)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- NULL until this transaction writes: a sequencer's append, a statement of its own, has none.
    own_xid BIGINT := pg_current_xact_id_if_assigned()::text::bigint;
BEGIN
    -- Inside a transaction that published, the range read here holds that transaction's own
    -- uncommitted events: appended now, its group would be logged before its later events
    -- exist, and those would stay off the commit lane for good.
    IF own_xid IS NOT NULL
       AND EXISTS (SELECT 1 FROM ordo.events AS e WHERE e.commit_xid = own_xid) THEN
        PERFORM ordo.append_refused(format(
            'this transaction (%s) published events; the commit log is appended by a sequencer, in a transaction of its own (publish, commit, and let the sequencer fold)',
            own_xid));
    END IF;
    IF expected_cursor IS NULL OR new_cursor IS NULL OR new_cursor < expected_cursor THEN
        PERFORM ordo.append_refused(format('the cursor may only move forward (from %s to %s)',
                                           expected_cursor, new_cursor));
    END IF;
    RETURN QUERY
    WITH span AS MATERIALIZED (
        SELECT e.sequence, e.commit_xid
        FROM ordo.events AS e
        WHERE e.sequence > expected_cursor AND e.sequence <= new_cursor
    ),
    found AS MATERIALIZED (
        SELECT e.sequence, e.commit_xid
        FROM ordo.events AS e
        -- In key order: the index is probed in order (unordered, the probe of 5,000
        -- transactions took four times as long).
        WHERE e.commit_xid = ANY (ARRAY(SELECT s.commit_xid FROM span AS s
                                        WHERE s.commit_xid IS NOT NULL
                                        GROUP BY s.commit_xid ORDER BY s.commit_xid))
    ),
    -- Every event of every transaction met in the range, with its group's first and last.
    candidates AS MATERIALIZED (
        SELECT f.commit_xid AS xid, f.sequence,
               first_value(f.sequence) OVER w AS low,
               last_value(f.sequence) OVER w AS last
        FROM found AS f
        WINDOW w AS (PARTITION BY f.commit_xid ORDER BY f.sequence
                     ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
    ),
    -- The groups first met in the range, numbered in log order.
    members AS MATERIALIZED (
        SELECT c.sequence, c.xid,
               row_number() OVER (ORDER BY c.low, c.sequence) AS rn,
               c.sequence = c.last AS group_last
        FROM candidates AS c
        WHERE c.low > expected_cursor
    ),
    verdict AS MATERIALIZED (
        SELECT CASE
            WHEN new_cursor > (SELECT CASE WHEN q.is_called THEN q.last_value ELSE 0 END
                               FROM ordo.events_sequence AS q)
                THEN ordo.append_refused(format('cursor %s is above the sequence head', new_cursor))
            WHEN (SELECT count(*) FROM span) <> new_cursor - expected_cursor
                THEN ordo.append_refused(format('sequences in (%s, %s] have no row yet: the range is not resolved',
                                                expected_cursor, new_cursor))
            ELSE TRUE
        END AS ok
    ),
    state AS (
        UPDATE ordo.sequencer_state AS st
        SET last_commit_seq = st.last_commit_seq + (SELECT count(*) FROM members),
            logged_through_sequence = new_cursor,
            updated_at = now()
        WHERE st.singleton AND st.logged_through_sequence = expected_cursor
          AND (SELECT v.ok FROM verdict AS v)
        RETURNING st.last_commit_seq - (SELECT count(*) FROM members) AS base
    ),
    chunks AS (
        INSERT INTO ordo.commit_chunks
            (first_commit_seq, last_commit_seq, min_sequence, max_sequence, sequences, group_last)
        SELECT state.base + min(m.rn), state.base + max(m.rn), min(m.sequence), max(m.sequence),
               array_agg(m.sequence ORDER BY m.rn), array_agg(m.group_last ORDER BY m.rn)
        FROM state, members AS m
        GROUP BY state.base, (m.rn - 1) / 1024
    )
    SELECT state.base + m.rn, m.sequence, m.group_last, m.xid
    FROM state LEFT JOIN members AS m ON TRUE
    ORDER BY m.rn;
END
$$;

-- 2. Subscriptions from before roles were recorded ----------------------------------------------

ALTER POLICY subscriptions_run ON ordo.subscriptions
    USING (role = current_user::text
           OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r
                      WHERE r.rolname::text = role
                        AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')));

-- The one role other than the owner granted UPDATE on ordo.subscriptions, if exactly one (a
-- grant to PUBLIC makes it anyone).
DO $$
DECLARE
    sole TEXT;
BEGIN
    SELECT CASE WHEN count(DISTINCT a.grantee) = 1 AND bool_and(a.grantee <> 0)
                THEN min(r.rolname::text) END
    INTO sole
    FROM pg_catalog.pg_class AS c
    CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
    LEFT JOIN pg_catalog.pg_roles AS r ON r.oid = a.grantee
    WHERE c.oid = 'ordo.subscriptions'::regclass
      AND a.privilege_type = 'UPDATE'
      AND a.grantee <> c.relowner;
    IF sole IS NOT NULL THEN
        UPDATE ordo.subscriptions SET role = sole WHERE role IS NULL;
    END IF;
END
$$;

COMMENT ON COLUMN ordo.subscriptions.role IS
    'ordo: the role that runs it; other roles (but the owner) may not write the row, its progress, dead letters or attempts (NULL: created before ordo recorded it; only the owner runs it until an operator assigns it with ordo subscriptions adopt)';
