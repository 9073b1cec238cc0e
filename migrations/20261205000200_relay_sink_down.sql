-- ordo: a relay's sink outage, stored where operators look (`ordo status`,
-- `ordo subscriptions`, `admin::status`).
--
-- A relay that finds its sink down (an outage: no attempt counted, nothing parked, see
-- `docs/relays.md`) keeps that in memory and in a gauge of its own process; these columns put
-- it beside the relay's position for every reader. The owning relay writes them once per
-- change of state (down, a changed reason every 30 s or more while down, recovered), by a
-- task of its own so that a slow or failing write never holds up sending, and fenced by its
-- lease like its other writes: a relay that lost its lease writes nothing here. Every claim
-- of the row clears them (the claiming runner has not judged the sink yet), and so does the
-- owner once the sink answers again. NULL for subscriptions, which have no sink.
--
-- No grant changes: the writer role (`ordo.grant_writer`) holds table-level UPDATE on
-- `ordo.subscriptions`, and the reader role table-level SELECT, which cover new columns.
ALTER TABLE ordo.subscriptions
    ADD COLUMN sink_down_since  TIMESTAMPTZ,
    ADD COLUMN sink_down_reason TEXT;

COMMENT ON COLUMN ordo.subscriptions.sink_down_since IS
    'ordo: a relay''s sink is down (an outage) since then, as its owning relay found it; NULL while it answers';
COMMENT ON COLUMN ordo.subscriptions.sink_down_reason IS
    'ordo: why the relay''s sink is down (the sink''s error, event text in it escaped); NULL while it answers';
