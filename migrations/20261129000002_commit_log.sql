-- ordo: the commit-ordered lane.
--
-- `commit_log` is dense (commit_seq 1..=last_commit_seq); each source transaction's events are
-- contiguous in it, in insert order, with `group_last` on the group's last row. The sequencer
-- appends to it only under a compare-and-set on the one row of `sequencer_state`.
CREATE TABLE ordo.commit_log (
    commit_seq BIGINT NOT NULL,
    sequence   BIGINT NOT NULL,
    group_last BOOLEAN NOT NULL,
    CONSTRAINT commit_log_pkey PRIMARY KEY (commit_seq),
    -- An event is logged at most once; a duplicate append fails loudly instead of repeating it.
    CONSTRAINT commit_log_sequence_key UNIQUE (sequence)
);

CREATE TABLE ordo.sequencer_state (
    singleton               BOOLEAN NOT NULL DEFAULT TRUE,
    -- Rows in the log: the highest commit_seq.
    last_commit_seq         BIGINT NOT NULL DEFAULT 0,
    -- An insert sequence: every real event at or below it is in the log.
    logged_through_sequence BIGINT NOT NULL DEFAULT 0,
    updated_at              TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT sequencer_state_pkey PRIMARY KEY (singleton),
    CONSTRAINT sequencer_state_singleton CHECK (singleton)
);

INSERT INTO ordo.sequencer_state (singleton) VALUES (TRUE);
