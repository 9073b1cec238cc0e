-- ordo: operator retries of dead letters.
--
-- `ordo dead-letters retry` sets `retry_requested_at`; the subscription's runner (the one that
-- holds the lease) hands the event to its handler again, once, in a transaction that also
-- deletes the dead letter. If the handler fails again, the row stays with the new error,
-- `attempts` + 1 and the request cleared.
ALTER TABLE ordo.dead_letters ADD COLUMN retry_requested_at TIMESTAMPTZ;

CREATE INDEX dead_letters_retry_idx ON ordo.dead_letters (subscription, id)
    WHERE retry_requested_at IS NOT NULL;
