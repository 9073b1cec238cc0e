BEGIN;
INSERT INTO ordo.events (payload) VALUES ('{"writer": 1, "n": 12345}');
COMMIT;
