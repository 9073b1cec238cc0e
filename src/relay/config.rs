//! [`RelayConfig`]: how a relay runs, with its timing derived and checked, not hand-tuned.

use std::time::Duration;

use crate::consumer::{DEFAULT_KEYED_WINDOW, MAX_LEASE, MIN_LEASE, StartFrom};
use crate::error::{Error, Result};
use crate::event_type::TypeFilter;
use crate::position::Ordering;

/// The default bound on what a relay's window weighs ([`RelayConfig::window`]): 64 MiB.
pub const DEFAULT_WINDOW_BYTES: usize = 64 * 1024 * 1024;

/// The configuration of a relay, built with setters that state their defaults.
///
/// **Timing is derived, not tuned.** A batch of `batch_size` events is sent and confirmed under
/// one `batch_deadline`; each event is allowed `per_event_budget` of it; the lease must outlast
/// a batch, so that the relay that sent a batch still owns it when it records the results.
/// A batch starts only if it ends before this relay's lease can expire, with a margin of a
/// twentieth of the lease (renewing first when it would not), so one key's events are never in
/// flight at two owners. [`Outbox::relay`](crate::Outbox::relay) refuses to start unless
/// `batch_size × per_event_budget ≤ batch_deadline ≤ lease × 0.9` (a deadline, the margin and a
/// renewal interval of at least the margin fit in the lease), naming the settings.
///
/// ```
/// use std::time::Duration;
/// use ordo::relay::RelayConfig;
///
/// let config = RelayConfig::new("invoices-to-nats")
///     .batch_size(200)
///     .per_event_budget(Duration::from_millis(25))
///     .batch_deadline(Duration::from_secs(10))
///     .lease(Duration::from_secs(30))
///     .max_attempts(8);
/// ```
#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub(crate) name: String,
    pub(crate) ordering: Ordering,
    pub(crate) batch_size: usize,
    pub(crate) per_event_budget: Duration,
    pub(crate) batch_deadline: Duration,
    pub(crate) lease: Duration,
    pub(crate) max_attempts: u32,
    pub(crate) initial_backoff: Duration,
    pub(crate) max_backoff: Duration,
    pub(crate) window: usize,
    pub(crate) window_bytes: usize,
    pub(crate) types: TypeFilter,
    pub(crate) start: StartFrom,
    pub(crate) source: Option<String>,
    pub(crate) on_parked: OnParked,
    pub(crate) routing: super::routing::Routing,
    pub(crate) format: super::Format,
}

/// What the later events of a parked event's keys do, set with [`RelayConfig::on_parked`].
///
/// Either way the parked event stays parked (listed by `ordo relay parked`, requeued by
/// `ordo relay requeue`) and **holds the relay's low watermark**: the relay remembers what it
/// delivered past it (its rows in `ordo.subscription_progress`) and reads on, but no further
/// than its [window](RelayConfig::window) (10,000 events or 64 MiB past the watermark) until the parked event is requeued and
/// delivered. So it also keeps its [secret payload keys](crate::admin::add_secret_keys): they
/// are removed only once the watermark passed it.
///
/// ```
/// use ordo::relay::{OnParked, RelayConfig};
///
/// // Each customer's events are independent notifications: one that cannot be delivered
/// // must not hold back the customer's later ones.
/// let config = RelayConfig::new("notifications").on_parked(OnParked::Continue);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnParked {
    /// The later events of its keys wait until an operator requeues it and it is delivered:
    /// each key's events reach the sink in order, without a gap. The default.
    #[default]
    HoldKeys,
    /// The later events of its keys go on without it, in order among themselves. When it is
    /// requeued, it rejoins its keys behind their events the relay already holds (it never
    /// travels beside another event of its keys), so the receiver gets it **late, out of
    /// order**: choose this only where events of a key do not depend on each other.
    Continue,
}

impl RelayConfig {
    /// A relay named `name` (its row in `ordo.subscriptions`, shared with the subscriptions'
    /// names), on the commit lane, with the defaults.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ordering: Ordering::Commit,
            batch_size: 100,
            per_event_budget: Duration::from_millis(50),
            batch_deadline: Duration::from_secs(10),
            lease: Duration::from_secs(30),
            max_attempts: 10,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(10),
            window: DEFAULT_KEYED_WINDOW,
            window_bytes: DEFAULT_WINDOW_BYTES,
            types: TypeFilter::default(),
            start: StartFrom::Beginning,
            source: None,
            on_parked: OnParked::HoldKeys,
            routing: super::routing::Routing::default(),
            format: super::Format::Ordo,
        }
    }

    /// What the later events of a parked event's keys do: wait for it
    /// ([`OnParked::HoldKeys`], the default) or go on without it ([`OnParked::Continue`]).
    /// Every other key goes on either way.
    pub fn on_parked(mut self, on_parked: OnParked) -> Self {
        self.on_parked = on_parked;
        self
    }

    /// The most the relay holds in memory past its low watermark: events read and not yet
    /// delivered, or delivered past an event not delivered yet (a parked one holds the
    /// watermark), by count and by what they weigh (payload text and headers). Past either
    /// bound it stops reading until deliveries free room; one event is always taken, however
    /// large. Pages read from the table and the events read ahead of the window each weigh
    /// at most about a quarter of `bytes` besides, so a relay's events take about
    /// `1.5 × bytes` at most. Default [`DEFAULT_KEYED_WINDOW`] (10,000) events and
    /// [`DEFAULT_WINDOW_BYTES`] (64 MiB).
    ///
    /// ```
    /// // 1 MB documents: at most 16 MiB of them held past a parked one.
    /// let config = ordo::relay::RelayConfig::new("documents-out").window(10_000, 16 << 20);
    /// ```
    pub fn window(mut self, events: usize, bytes: usize) -> Self {
        self.window = events;
        self.window_bytes = bytes;
        self
    }

    /// Sends only events of these types (`ordo.events.event_type`), and untyped ones unless
    /// [`skip_untyped`](Self::skip_untyped); events of any other type are passed over (done,
    /// never sent, never parked), before anything reads their payload.
    ///
    /// **Default: the payload type's own types.** A relay of an `Outbox<P>` whose `P` is a
    /// tagged serde enum sends only `P`'s variants, so another service's rows in the same
    /// table are not sent in its name (as for [`JobConfig`](crate::JobConfig)'s
    /// [`event_types`](crate::JobConfig::event_types)); when `P` takes any payload
    /// (`serde_json::Value`, [`RawPayload`](super::RawPayload)) every type is sent.
    /// [`all_types`](Self::all_types) sends every type whatever `P` is.
    ///
    /// ```
    /// let config = ordo::relay::RelayConfig::new("orders-out")
    ///     .event_types(["OrderPlaced", "OrderShipped"])
    ///     .skip_untyped(true);
    /// ```
    pub fn event_types<I, T>(mut self, types: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        self.types = self.types.choose(types);
        self
    }

    /// Sends events of every type, whatever the outbox's payload type (the opposite of the
    /// default, see [`event_types`](Self::event_types)).
    pub fn all_types(mut self) -> Self {
        self.types = self.types.choose_all();
        self
    }

    /// Passes over untyped events (NULL `event_type`) instead of sending them. Default false.
    pub fn skip_untyped(mut self, skip: bool) -> Self {
        self.types.set_skip_untyped(skip);
        self
    }

    /// The types this relay of an `Outbox<P>` sends: the chosen ones, or `P`'s own; what it
    /// passes over is counted in `ordo_subscription_skipped_total`.
    pub(crate) fn resolve_types<P: serde::de::DeserializeOwned>(mut self) -> Self {
        self.types = self.types.or_types_of::<P>().counted_for(&self.name);
        self
    }

    /// The lane to relay. Default [`Ordering::Commit`] (a source transaction's events leave
    /// in commit order, per key).
    pub fn ordering(mut self, ordering: Ordering) -> Self {
        self.ordering = ordering;
        self
    }

    /// Where a relay that does not exist yet starts. Default [`StartFrom::Beginning`]; ignored
    /// once its row exists.
    pub fn start(mut self, start: StartFrom) -> Self {
        self.start = start;
        self
    }

    /// The name receivers know this database's events by, sent with every message (NATS
    /// `Ordo-Source`, AMQP `ordo-source`, webhook `Ordo-Source`) next to its lane position.
    /// On the commit lane the position is dense (1, 2, 3, …), so a receiving
    /// [`Inbox`](crate::inbox::Inbox) in [`InboxMode::Watermark`](crate::inbox::InboxMode::Watermark)
    /// can deduplicate by one mark per source instead of a row per message. Pick one name per
    /// database and keep it: a new name starts a new mark at the receiver. Default: none (no
    /// header); 1 to 200 bytes.
    ///
    /// ```
    /// let config = ordo::relay::RelayConfig::new("orders-to-nats").source("orders-db");
    /// ```
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// Events per send. Default 100.
    pub fn batch_size(mut self, events: usize) -> Self {
        self.batch_size = events;
        self
    }

    /// The share of the batch deadline each event may take. Default 50 ms.
    pub fn per_event_budget(mut self, budget: Duration) -> Self {
        self.per_event_budget = budget;
        self
    }

    /// One deadline over a batch's send and confirm (and the sink's probe, when one follows).
    /// On expiry the outcomes the sink reported stand, the sink's connection is rebuilt, and
    /// the events without an outcome are released without an attempt into batches at most
    /// half as big (alone, an event without an outcome counts an attempt; `docs/relays.md`,
    /// "The failure model"). The built-in sinks' per-message timeouts are derived from it and
    /// must be shorter; a webhook request past its timeout stays open until this deadline.
    /// Default 10 s.
    pub fn batch_deadline(mut self, deadline: Duration) -> Self {
        self.batch_deadline = deadline;
        self
    }

    /// The relay's claim on its work. Default 30 s; [`MIN_LEASE`](crate::MIN_LEASE) (100 ms) to
    /// [`MAX_LEASE`](crate::MAX_LEASE) (24 hours), as for a subscription: a relay that stops
    /// keeps its standbys out for a whole lease, and the timing above must fit in it.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Failed deliveries before an event is parked (a permanent error parks it at once).
    /// Default 10.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// Backoff after a failed delivery: from `initial` doubling to `max`, with full jitter; a
    /// receiver's `Retry-After` is honoured when longer. Default 200 ms to 10 s; `initial` not
    /// zero (every attempt would follow the last at once and park the event within
    /// milliseconds), `max` at most half the lease.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let invalid = Error::invalid_config;
        if self.name.is_empty() || self.name.len() > 200 {
            return invalid("RelayConfig::new", "the name must be 1 to 200 characters");
        }
        if let Some(source) = &self.source
            && (source.is_empty() || source.len() > 200 || source.contains('\0'))
        {
            return invalid("source", "must be 1 to 200 bytes, without NUL characters");
        }
        if self.batch_size == 0 || self.batch_size > 10_000 {
            return invalid("batch_size", "must be 1 to 10,000 events");
        }
        if self.window == 0 || self.window > 1_000_000 {
            return invalid("window", "must hold 1 to 1,000,000 events");
        }
        if self.window_bytes < 1024 {
            return invalid("window", "must allow at least 1 KiB");
        }
        if self.lease < MIN_LEASE || self.lease > MAX_LEASE {
            return invalid(
                "lease",
                "must be 100 ms to 24 hours: a relay that stops keeps its standbys out for a whole lease",
            );
        }
        if self.per_event_budget.is_zero() {
            return invalid("per_event_budget", "must be more than zero");
        }
        if self.max_attempts == 0 {
            return invalid("max_attempts", "must be at least 1");
        }
        if self.initial_backoff.is_zero() {
            return invalid(
                "backoff",
                "the initial backoff must be more than zero: each attempt would follow the last at once",
            );
        }
        if self.initial_backoff > self.max_backoff {
            return invalid("backoff", "the initial backoff must not exceed the maximum");
        }
        let needed = self.per_event_budget.saturating_mul(self.batch_size as u32);
        if needed > self.batch_deadline {
            return Err(Error::InvalidConfig {
                setting: "batch_size/per_event_budget/batch_deadline",
                reason: format!(
                    "batch_size × per_event_budget ({} × {:?} = {:?}) exceeds batch_deadline ({:?}): a full batch could not finish in time",
                    self.batch_size, self.per_event_budget, needed, self.batch_deadline
                ),
            });
        }
        // A flight starts only if it ends, with the margin, before the lease can expire
        // (`tenure.rs`); the relay renews every `renew_every`, so the lease must leave room
        // for a deadline, the margin and a renewal interval of at least the margin.
        let margin = crate::consumer::tenure::margin(self.lease);
        let most = self.lease.saturating_sub(margin.saturating_mul(2));
        if self.batch_deadline > most {
            return Err(Error::InvalidConfig {
                setting: "batch_deadline/lease",
                reason: format!(
                    "batch_deadline ({:?}) must be at most the lease ({:?}) less two margins of a twentieth of it ({:?}): a batch starts only if it ends before this relay's lease can expire, with a margin, and the lease must be renewed between batches, at most every `lease - batch_deadline - margin`; make the deadline shorter or the lease longer",
                    self.batch_deadline, self.lease, most
                ),
            });
        }
        if self.max_backoff > self.lease / 2 {
            return invalid(
                "backoff/lease",
                "the maximum backoff must be at most half the lease",
            );
        }
        self.routing.validate()
    }

    /// How often the lease is renewed: every third of it, sooner when a batch deadline and
    /// the margin would not fit in what is left (`tenure.rs`), so that the next batch can
    /// start without a renewal of its own.
    pub(crate) fn renew_every(&self) -> Duration {
        let left = self
            .lease
            .saturating_sub(self.batch_deadline)
            .saturating_sub(crate::consumer::tenure::margin(self.lease));
        (self.lease / 3).min(left)
    }

    /// The longest span between the first and the last send of one message by one owner,
    /// outages and ownership changes aside (`docs/relays.md`, "The bound on sends per
    /// event"): up to `⌈log₂ batch_size⌉ + max_attempts` sends, each under a deadline, with a
    /// release pause before each send of the halving and a backoff (at most the cap) before
    /// each later attempt. A receiver's `Retry-After` (HTTP) may stretch a backoff to half the
    /// lease; the broker sinks have none.
    pub(crate) fn resend_span(&self) -> Duration {
        let halvings = usize::BITS - self.batch_size.saturating_sub(1).leading_zeros();
        let sends = halvings.saturating_add(self.max_attempts);
        let backoff = self.max_backoff;
        self.batch_deadline
            .saturating_mul(sends)
            .saturating_add(super::runner::BLAMELESS_RETRY.saturating_mul(halvings))
            .saturating_add(backoff.saturating_mul(self.max_attempts.saturating_sub(1)))
    }

    /// The backoff after failed attempt `attempt` (1-based), at least `at_least`.
    pub(crate) fn backoff_after(&self, attempt: u32, at_least: Option<Duration>) -> Duration {
        let exponent = attempt.saturating_sub(1).min(30);
        let ceiling = self
            .initial_backoff
            .saturating_mul(1u32 << exponent)
            .min(self.max_backoff);
        let jittered = ceiling.mul_f64(fastrand::f64());
        at_least.map_or(jittered, |floor| jittered.max(floor.min(self.lease / 2)))
    }
}
