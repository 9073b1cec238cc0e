-- Which server history each stretch of the commit log was appended on (issue 33), so that a
-- position can be told apart from the same number in another history.
--
-- A failover to an asynchronous standby that had not received the last transactions loses
-- them, and the commit log goes on from the standby's head: positions the lost events had are
-- given to new events. A receiver that deduplicates by position (a watermark inbox) would drop
-- those new events as duplicates. PostgreSQL starts a new timeline at every promotion (and at
-- every point-in-time restore), so the timeline of the WAL a chunk was written to names the
-- history it belongs to: a relay sends it beside the position (`Ordo-History`), and a
-- receiver that sees a position at or below its mark come from a newer history knows the
-- positions from there to its mark were reassigned, reports the rewind, and takes the event.
--
--   ordo.server_history()       the timeline the server writes WAL on now (a primary only);
--   ordo.commit_histories       one row per history the log was appended on: its first
--                               position. Written by a trigger on ordo.commit_chunks, in the
--                               transaction of the first chunk appended on that timeline, so
--                               a server holds the row exactly when it holds that chunk. The
--                               history of position p is the row with the highest history
--                               whose from_commit_seq <= p.
--
-- The log written before this migration counts as the history the server is on now. Every
-- role may read the table (nothing in it is secret); only the trigger writes it.

CREATE FUNCTION ordo.server_history()
RETURNS INTEGER
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::integer
$$;

CREATE TABLE ordo.commit_histories (
    history         INTEGER PRIMARY KEY,
    from_commit_seq BIGINT NOT NULL CHECK (from_commit_seq >= 1),
    began_at        TIMESTAMPTZ NOT NULL DEFAULT now()
);

COMMENT ON TABLE ordo.commit_histories IS
    'ordo: the server history (PostgreSQL timeline) each stretch of the commit log was appended on, from its first position';

INSERT INTO ordo.commit_histories (history, from_commit_seq) VALUES (ordo.server_history(), 1);

CREATE FUNCTION ordo.note_commit_history()
RETURNS TRIGGER
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    current_history INTEGER := ordo.server_history();
BEGIN
    IF NOT EXISTS (SELECT 1 FROM ordo.commit_histories WHERE history = current_history) THEN
        INSERT INTO ordo.commit_histories (history, from_commit_seq)
        VALUES (current_history, NEW.first_commit_seq)
        ON CONFLICT (history) DO NOTHING;
    END IF;
    RETURN NEW;
END
$$;

REVOKE ALL ON FUNCTION ordo.note_commit_history() FROM PUBLIC;

CREATE TRIGGER commit_chunks_history
    BEFORE INSERT ON ordo.commit_chunks
    FOR EACH ROW EXECUTE FUNCTION ordo.note_commit_history();

GRANT SELECT ON ordo.commit_histories TO PUBLIC;

-- A watermark inbox remembers the history of its mark, and the last rewind it saw:
--   history          the history of the message that set the mark (NULL: a sender that
--                    sends none, or a mark set by hand);
--   rewound_at       when a message from a newer history came at or below the mark;
--   rewound_from,    the positions of the older history that the newer one gave again
--   rewound_through  (their events are not in the sender's database any more);
--   rewound_history  the older history.
ALTER TABLE ordo.inbox_watermarks
    ADD COLUMN history         INTEGER,
    ADD COLUMN rewound_at      TIMESTAMPTZ,
    ADD COLUMN rewound_from    BIGINT,
    ADD COLUMN rewound_through BIGINT,
    ADD COLUMN rewound_history INTEGER;
