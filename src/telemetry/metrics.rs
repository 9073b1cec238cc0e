//! The metrics ordo emits, through the [`metrics`] facade: install any recorder (Prometheus,
//! StatsD, …) and they appear, described with their units ([`describe`]). Every name is
//! listed here with its meaning; see
//! `docs/operations.md` for what to do when one looks bad.
//!
//! | name | kind | labels | meaning |
//! | --- | --- | --- | --- |
//! | `ordo_events_published_total` | counter | | events committed through this process's outbox |
//! | `ordo_insert_frontier` | gauge | | the insert lane's frontier in this process |
//! | `ordo_insert_known_head` | gauge | | the highest sequence this process knows was drawn |
//! | `ordo_commit_head` | gauge | | the commit log's head as this process knows it |
//! | `ordo_fold_events_total` | counter | | events this process's sequencer appended to the log |
//! | `ordo_fold_groups_total` | counter | | groups (source transactions) it appended |
//! | `ordo_fold_appends_total` | counter | `result` = `appended`, `refused` or `left_to_peer` | append statements; `refused` when a peer moved first; `left_to_peer` when a yielding sequencer found a peer had appended its plan (no statement of its own) |
//! | `ordo_fold_restarts_total` | counter | | times the sequencer re-read its state from the log (at start, after an error, or after a peer got more than 8,192 entries ahead); a lost compare-and-set is not one |
//! | `ordo_contract_violations_total` | counter | `kind` | rows that break the schema contract, found by a lane (`foreign_commit_xid`: a row whose `commit_xid` names a transaction already complete in the log; it is left out of the commit lane and logged at ERROR with its sequence) |
//! | `ordo_fold_lag_events` | gauge | | insert positions resolved but not yet covered by this sequencer |
//! | `ordo_delivery_latency_seconds` | histogram | `lane` | from the event's `recorded_at` to a listener receiving it |
//! | `ordo_gap_waits_total` | counter | | holes that outlived the grace and went to abandonment proof |
//! | `ordo_placeholders_written_total` | counter | | placeholders this process wrote for abandoned sequences |
//! | `ordo_subscription_lag` | gauge | `subscription` | positions between its checkpoint and the lane head |
//! | `ordo_subscription_events_total` | counter | `subscription` | events it handled and checkpointed |
//! | `ordo_subscription_skipped_total` | counter | `subscription` | events of a type it does not select, passed over before decoding (counted as read: again after a restart re-reads them) |
//! | `ordo_subscription_retries_total` | counter | `subscription` | failed attempts that will be retried |
//! | `ordo_dead_letters_total` | counter | `subscription` | events it moved to `ordo.dead_letters` |
//! | `ordo_subscription_halts_total` | counter | `subscription` | times it halted on an exhausted event (keyed: times an event stalled its keys) or below the retention floor |
//! | `ordo_window_full` | gauge | `subscription`, `kind` | 1 while a keyed subscription's or relay's window is full (it reads no further until the events it holds finish), else 0 |
//! | `ordo_backlog_moved_total` | counter | `subscription`, `kind` | events of stuck keys moved out of a keyed subscription's or relay's window into `ordo.key_backlogs` |
//! | `ordo_backlog_taken_back_total` | counter | `subscription`, `kind` | events taken back from a backlog after a retry or requeue |
//! | `ordo_relay_lag` | gauge | `relay` | positions between its stored results and the lane head: the events not yet delivered |
//! | `ordo_relay_halts_total` | counter | `relay` | times it halted below the retention floor |
//! | `ordo_relay_delivery_latency_seconds` | histogram | `relay` | from an event's `recorded_at` to the sink confirming it |
//! | `ordo_relay_events_total` | counter | `relay`, `result` = `delivered`, `retried` (the sink blamed it: an attempt counted), `released` (deadline expired or the batch failed as a whole: no attempt counted), `parked` or `refused` (its id belongs to an earlier event: never sent) | what each relay send did to an event |
//! | `ordo_subscription_stalled_keys` | gauge | `subscription` | a keyed subscription's keys waiting on a stalled event, as its runner holds them |
//! | `ordo_stream_retries_total` | counter | `lane` | listener reads that failed transiently (connection, pool, server restart) and were retried at the same position |
//! | `ordo_relay_sink_down` | gauge | `relay` | 1 while the relay's owner finds its sink down (an outage), else 0 |
//! | `ordo_server_rewound` | gauge | | 1 while this process's outbox is stopped because the database went back below what its lanes had passed ([`Error::ServerRewound`](crate::Error::ServerRewound)): until its lanes start again from what the server holds, or for good under [`OnRewind::Stop`](crate::OnRewind::Stop) |
//! | `ordo_server_rewinds_total` | counter | | times this process's outbox found the database gone back in time under it (each logged at ERROR with what showed it) |
//! | `ordo_server_rewound_positions_total` | counter | | commit positions whose events the database no longer holds, counted when this process began the newer server history that gives them to new events (logged at ERROR with the positions and since when) |
//! | `ordo_inbox_rewound_positions_total` | counter | `consumer`, `source` | positions a watermark inbox had handled that the sender gave again on a newer server history (its events there lost at a failover, a restore or a crash; logged at ERROR with the positions, shown by `ordo inbox watermarks`) |
//! | `ordo_wakeups_total` | counter | `result` = `sent` or `held` (no other process listened: see `OutboxConfig::cross_process_wakeups`) | cross-process wake-ups this process's commits called for |
//! | `ordo_inbox_receipts_total` | counter | `consumer`, `receipt` = `handled`, `duplicate`, `busy`, `retry`, `failed`, `gap`, or `rejected` (a broker adapter rejected for good a message the inbox cannot store) | messages an inbox consumer received, by what it answered ([`Receipt`](crate::inbox::Receipt)) |

/// The metric `ordo_events_published_total` (see the table above).
pub const EVENTS_PUBLISHED: &str = "ordo_events_published_total";
/// The metric `ordo_insert_frontier` (see the table above).
pub const INSERT_FRONTIER: &str = "ordo_insert_frontier";
/// The metric `ordo_insert_known_head` (see the table above).
pub const INSERT_KNOWN_HEAD: &str = "ordo_insert_known_head";
/// The metric `ordo_commit_head` (see the table above).
pub const COMMIT_HEAD: &str = "ordo_commit_head";
/// The metric `ordo_fold_events_total` (see the table above).
pub const FOLD_EVENTS: &str = "ordo_fold_events_total";
/// The metric `ordo_fold_groups_total` (see the table above).
pub const FOLD_GROUPS: &str = "ordo_fold_groups_total";
/// The metric `ordo_fold_appends_total` (see the table above).
pub const FOLD_APPENDS: &str = "ordo_fold_appends_total";
/// The metric `ordo_fold_restarts_total` (see the table above).
pub const FOLD_RESTARTS: &str = "ordo_fold_restarts_total";
/// The metric `ordo_contract_violations_total` (see the table above).
pub const CONTRACT_VIOLATIONS: &str = "ordo_contract_violations_total";
/// The metric `ordo_fold_lag_events` (see the table above).
pub const FOLD_LAG: &str = "ordo_fold_lag_events";
/// The metric `ordo_delivery_latency_seconds` (see the table above).
pub const DELIVERY_LATENCY: &str = "ordo_delivery_latency_seconds";
/// The metric `ordo_gap_waits_total` (see the table above).
pub const GAP_WAITS: &str = "ordo_gap_waits_total";
/// The metric `ordo_placeholders_written_total` (see the table above).
pub const PLACEHOLDERS: &str = "ordo_placeholders_written_total";
/// The metric `ordo_subscription_lag` (see the table above).
pub const SUBSCRIPTION_LAG: &str = "ordo_subscription_lag";
/// The metric `ordo_subscription_events_total` (see the table above).
pub const SUBSCRIPTION_EVENTS: &str = "ordo_subscription_events_total";
/// The metric `ordo_subscription_skipped_total` (see the table above).
pub const SUBSCRIPTION_SKIPPED: &str = "ordo_subscription_skipped_total";
/// The metric `ordo_subscription_retries_total` (see the table above).
pub const SUBSCRIPTION_RETRIES: &str = "ordo_subscription_retries_total";
/// The metric `ordo_dead_letters_total` (see the table above).
pub const DEAD_LETTERS: &str = "ordo_dead_letters_total";
/// The metric `ordo_subscription_halts_total` (see the table above).
pub const SUBSCRIPTION_HALTS: &str = "ordo_subscription_halts_total";
/// The metric `ordo_window_full` (see the table above).
pub const WINDOW_FULL: &str = "ordo_window_full";
/// The metric `ordo_backlog_moved_total` (see the table above).
pub const BACKLOG_MOVED: &str = "ordo_backlog_moved_total";
/// The metric `ordo_backlog_taken_back_total` (see the table above).
pub const BACKLOG_TAKEN_BACK: &str = "ordo_backlog_taken_back_total";
/// The metric `ordo_relay_lag` (see the table above).
pub const RELAY_LAG: &str = "ordo_relay_lag";
/// The metric `ordo_relay_halts_total` (see the table above).
pub const RELAY_HALTS: &str = "ordo_relay_halts_total";
/// The metric `ordo_relay_delivery_latency_seconds` (see the table above).
pub const RELAY_DELIVERY_LATENCY: &str = "ordo_relay_delivery_latency_seconds";
/// The metric `ordo_relay_events_total` (see the table above).
pub const RELAY_EVENTS: &str = "ordo_relay_events_total";
/// The metric `ordo_subscription_stalled_keys` (see the table above).
pub const SUBSCRIPTION_STALLED_KEYS: &str = "ordo_subscription_stalled_keys";

/// The metric `ordo_stream_retries_total` (see the table above).
pub const STREAM_RETRIES: &str = "ordo_stream_retries_total";

/// The metric `ordo_wakeups_total` (see the table above).
pub const WAKEUPS: &str = "ordo_wakeups_total";

/// The metric `ordo_inbox_receipts_total` (see the table above).
pub const INBOX_RECEIPTS: &str = "ordo_inbox_receipts_total";

/// The metric `ordo_server_rewound` (see the table above).
pub const SERVER_REWOUND: &str = "ordo_server_rewound";

/// The metric `ordo_server_rewinds_total` (see the table above).
pub const SERVER_REWINDS: &str = "ordo_server_rewinds_total";

/// The metric `ordo_server_rewound_positions_total` (see the table above).
pub const SERVER_REWOUND_POSITIONS: &str = "ordo_server_rewound_positions_total";

/// The metric `ordo_inbox_rewound_positions_total` (see the table above).
pub const INBOX_REWOUND_POSITIONS: &str = "ordo_inbox_rewound_positions_total";

/// The gauge of a relay's sink being down (1) or answering (0), labelled `relay` (see the
/// table above); also [`ordo::relay::RELAY_SINK_DOWN`](crate::relay::RELAY_SINK_DOWN).
pub const RELAY_SINK_DOWN: &str = "ordo_relay_sink_down";

/// The stuck keys' metrics.
fn describe_backlogs() {
    use metrics::{Unit, describe_counter, describe_gauge};
    describe_gauge!(
        SUBSCRIPTION_STALLED_KEYS,
        Unit::Count,
        "A keyed subscription's keys waiting on a stalled event."
    );
    describe_gauge!(
        WINDOW_FULL,
        Unit::Count,
        "1 while a keyed subscription's or relay's window is full, else 0."
    );
    describe_counter!(
        BACKLOG_MOVED,
        Unit::Count,
        "Events of stuck keys a keyed subscription or relay moved aside to ordo.key_backlogs."
    );
    describe_counter!(
        BACKLOG_TAKEN_BACK,
        Unit::Count,
        "Events a keyed subscription or relay took back from a stuck key's backlog after a retry."
    );
}

/// Describes every metric above to the installed recorder: its unit (seconds, a count) and
/// one line of what it means, as exporters show them (Prometheus `# HELP`). Each
/// [`Outbox`](crate::Outbox) and [`Inbox`](crate::Inbox) calls it when it is created; call it
/// yourself if you install the recorder after that. Cheap, and harmless to repeat.
pub fn describe() {
    describe_lanes();
    describe_subscriptions();
    describe_backlogs();
    describe_relays();
    describe_inbox_and_rewinds();
}

/// The write path, both lanes, the sequencer, listeners and wake-ups.
fn describe_lanes() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        EVENTS_PUBLISHED,
        Unit::Count,
        "Events committed through this process's outbox."
    );
    describe_gauge!(
        INSERT_FRONTIER,
        Unit::Count,
        "The insert lane's frontier in this process."
    );
    describe_gauge!(
        INSERT_KNOWN_HEAD,
        Unit::Count,
        "The highest sequence this process knows was drawn."
    );
    describe_gauge!(
        COMMIT_HEAD,
        Unit::Count,
        "The commit log's head as this process knows it."
    );
    describe_counter!(
        FOLD_EVENTS,
        Unit::Count,
        "Events this process's sequencer appended to the commit log."
    );
    describe_counter!(
        FOLD_GROUPS,
        Unit::Count,
        "Source transactions this process's sequencer appended."
    );
    describe_counter!(
        FOLD_APPENDS,
        Unit::Count,
        "Append statements, by result (appended, refused, left_to_peer)."
    );
    describe_counter!(
        FOLD_RESTARTS,
        Unit::Count,
        "Times the sequencer re-read its state from the log."
    );
    describe_counter!(
        CONTRACT_VIOLATIONS,
        Unit::Count,
        "Rows that break the schema contract, by kind."
    );
    describe_gauge!(
        FOLD_LAG,
        Unit::Count,
        "Insert positions resolved but not yet covered by this sequencer."
    );
    describe_histogram!(
        DELIVERY_LATENCY,
        Unit::Seconds,
        "From an event's recorded_at to a listener receiving it."
    );
    describe_counter!(
        GAP_WAITS,
        Unit::Count,
        "Holes that outlived the grace and went to abandonment proof."
    );
    describe_counter!(
        PLACEHOLDERS,
        Unit::Count,
        "Placeholders this process wrote for abandoned sequences."
    );
    describe_counter!(
        STREAM_RETRIES,
        Unit::Count,
        "Listener reads that failed transiently and were retried."
    );
    describe_counter!(
        WAKEUPS,
        Unit::Count,
        "Cross-process wake-ups this process's commits called for, sent or held back (nobody else listened)."
    );
}

/// Durable subscriptions: lag, handled, skipped, retried, dead-lettered, halted.
fn describe_subscriptions() {
    use metrics::{Unit, describe_counter, describe_gauge};
    describe_gauge!(
        SUBSCRIPTION_LAG,
        Unit::Count,
        "Positions between a subscription's checkpoint and its lane's head."
    );
    describe_counter!(
        SUBSCRIPTION_EVENTS,
        Unit::Count,
        "Events a subscription handled and checkpointed."
    );
    describe_counter!(
        SUBSCRIPTION_SKIPPED,
        Unit::Count,
        "Events of a type a subscription does not select, passed over."
    );
    describe_counter!(
        SUBSCRIPTION_RETRIES,
        Unit::Count,
        "A subscription's failed attempts that will be retried."
    );
    describe_counter!(
        DEAD_LETTERS,
        Unit::Count,
        "Events a subscription moved to ordo.dead_letters."
    );
    describe_counter!(
        SUBSCRIPTION_HALTS,
        Unit::Count,
        "Times a subscription halted, or a keyed one stalled a key."
    );
}

/// Relays: lag, halts, delivery latency, results, the sink's outage.
fn describe_relays() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(
        RELAY_LAG,
        Unit::Count,
        "Positions between a relay's stored results and its lane's head."
    );
    describe_counter!(
        RELAY_HALTS,
        Unit::Count,
        "Times a relay halted below the retention floor."
    );
    describe_histogram!(
        RELAY_DELIVERY_LATENCY,
        Unit::Seconds,
        "From an event's recorded_at to the relay's sink confirming it."
    );
    describe_counter!(
        RELAY_EVENTS,
        Unit::Count,
        "What each relay send did to an event, by result."
    );
    describe_gauge!(
        RELAY_SINK_DOWN,
        Unit::Count,
        "1 while a relay's sink is down (an outage), else 0."
    );
}

/// The inbox's receipts, and the database going back in time under either side.
fn describe_inbox_and_rewinds() {
    use metrics::{Unit, describe_counter, describe_gauge};
    describe_counter!(
        INBOX_RECEIPTS,
        Unit::Count,
        "Messages an inbox consumer received, by its answer."
    );
    describe_gauge!(
        SERVER_REWOUND,
        Unit::Count,
        "1 while this process's outbox is stopped because the database went back in time."
    );
    describe_counter!(
        SERVER_REWINDS,
        Unit::Count,
        "Times this process's outbox found the database gone back in time under it."
    );
    describe_counter!(
        SERVER_REWOUND_POSITIONS,
        Unit::Count,
        "Commit positions whose events the database lost, given to new events in a history this process began."
    );
    describe_counter!(
        INBOX_REWOUND_POSITIONS,
        Unit::Count,
        "Positions a watermark inbox had handled that the sender gave again on a newer history."
    );
}

/// Seconds from `recorded_at` to now, for the delivery histogram.
pub(crate) fn since(recorded_at: chrono::DateTime<chrono::Utc>) -> f64 {
    (chrono::Utc::now() - recorded_at)
        .to_std()
        .map_or(0.0, |elapsed| elapsed.as_secs_f64())
}
