-- ordo: keyed subscriptions' progress above their low watermark.
--
-- A keyed subscription (`JobConfig::keyed`) handles events of different keys concurrently, so
-- its handlers commit out of lane order. `ordo.subscriptions.position` stays its low watermark:
-- every event at or below it is finished. Each event finished above it has a row here, written
-- in the handler's own transaction (`done`), together with the events that failed and are being
-- retried (`failing`, with the attempts so far) and those whose attempts ran out with the `Halt`
-- policy (`stalled`: their keys wait for an operator's retry, which sets `retry_requested_at`).
-- The runner moves the watermark past finished events and deletes their rows in one statement,
-- so the table holds only the events between the watermark and the runner's read position.
CREATE TABLE ordo.subscription_progress (
    subscription       TEXT NOT NULL,
    position           BIGINT NOT NULL,
    state              TEXT NOT NULL,
    attempts           INTEGER NOT NULL DEFAULT 0,
    -- The event's keys, as the subscriber gave them (for operators: a stalled key is retried
    -- by name).
    keys               TEXT[] NOT NULL DEFAULT '{}',
    last_error         TEXT,
    retry_requested_at TIMESTAMPTZ,
    updated_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT subscription_progress_pkey PRIMARY KEY (subscription, position),
    CONSTRAINT subscription_progress_state CHECK (state IN ('done', 'failing', 'stalled')),
    CONSTRAINT subscription_progress_subscription FOREIGN KEY (subscription)
        REFERENCES ordo.subscriptions (name) ON DELETE CASCADE
);

-- Stalled events, for `ordo subscriptions` and the runner's look for operators' retries.
CREATE INDEX subscription_progress_stalled_idx ON ordo.subscription_progress (subscription, position)
    WHERE state = 'stalled';
