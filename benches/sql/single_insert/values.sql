BEGIN;
INSERT INTO ordo.events (id, payload, headers, event_type) VALUES (gen_random_uuid(), '{"writer": 1, "n": 12345}'::text::jsonb, '{}'::text::jsonb, NULL) RETURNING id, sequence, commit_xid, recorded_at;
COMMIT;
