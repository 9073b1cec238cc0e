-- A watermark inbox waiting on a gap says so (issue 30): a message from beyond the next
-- position is refused as `Gap`, and the mark's row records what was seen and since when, so
-- `ordo inbox watermarks` shows the wait and the inbox logs it (once when it starts, then at
-- most once a minute across every receiver). Every move of the mark clears the three columns.
--
--   gap_position   the highest position refused as a gap since the mark last moved;
--   gap_since      when the first of those refusals was made;
--   gap_warned_at  when a receiver last logged the wait (the once-a-minute limit).
--
-- No grant changes: a consumer's table-level UPDATE on ordo.inbox_watermarks covers them.

ALTER TABLE ordo.inbox_watermarks
    ADD COLUMN gap_position  BIGINT,
    ADD COLUMN gap_since     TIMESTAMPTZ,
    ADD COLUMN gap_warned_at TIMESTAMPTZ;
