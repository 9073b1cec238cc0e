BEGIN;
INSERT INTO ordo.events (id, payload, headers, event_type) SELECT e.id, e.payload::jsonb, e.headers::jsonb, e.event_type FROM unnest(ARRAY[gen_random_uuid()]::uuid[], ARRAY['{"writer": 1, "n": 12345}']::text[], ARRAY['{}']::text[], ARRAY[NULL]::text[]) WITH ORDINALITY AS e(id, payload, headers, event_type, ord) ORDER BY e.ord RETURNING id, sequence, commit_xid, recorded_at;
COMMIT;
