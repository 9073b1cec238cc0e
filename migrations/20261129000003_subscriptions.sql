-- ordo: durable subscriptions and their dead letters.
--
-- One row per subscription. `position` is an insert sequence or a commit sequence, by `lane`;
-- it moves only in the transaction that also holds the handler's writes, and only while the
-- runner holds the lease (`lease_owner`, `lease_expires_at`), so a runner that lost its lease
-- cannot commit.
CREATE TABLE ordo.subscriptions (
    name             TEXT NOT NULL,
    lane             TEXT NOT NULL,
    position         BIGINT NOT NULL DEFAULT 0,
    status           TEXT NOT NULL DEFAULT 'active',
    attempts         INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    lease_owner      UUID,
    lease_expires_at TIMESTAMPTZ,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT subscriptions_pkey PRIMARY KEY (name),
    CONSTRAINT subscriptions_lane CHECK (lane IN ('insert', 'commit')),
    CONSTRAINT subscriptions_status CHECK (status IN ('active', 'paused', 'halted')),
    CONSTRAINT subscriptions_position CHECK (position >= 0)
);

-- Events a subscription gave up on (its exhaustion policy was `DeadLetter`), with the error.
CREATE TABLE ordo.dead_letters (
    id           BIGINT GENERATED ALWAYS AS IDENTITY,
    subscription TEXT NOT NULL,
    lane         TEXT NOT NULL,
    position     BIGINT NOT NULL,
    sequence     BIGINT NOT NULL,
    event_id     UUID,
    payload      JSONB,
    error        TEXT NOT NULL,
    attempts     INTEGER NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT dead_letters_pkey PRIMARY KEY (id)
);

CREATE INDEX dead_letters_subscription_idx ON ordo.dead_letters (subscription, id);
