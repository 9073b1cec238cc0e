//! [`JobConfig`]: how a durable subscription runs.

pub use crate::consumer::{DEFAULT_KEYED_WINDOW, MAX_LEASE, MIN_LEASE, StartFrom};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::event_type::TypeFilter;
pub use crate::position::Ordering;

/// What happens when an event has failed `max_attempts` times (or does not decode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnExhaustion {
    /// Stop the subscription at the failing event: its status becomes `halted`, visible in
    /// `ordo subscriptions`, until an operator resumes it (`ordo subscriptions resume NAME`),
    /// when the event is tried again.
    #[default]
    Halt,
    /// Copy the event with its error into `ordo.dead_letters` and move on, in one transaction.
    DeadLetter,
}

/// How many events one handler transaction covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Batch {
    /// One event per transaction (and checkpoint).
    #[default]
    PerEvent,
    /// Up to this many events that are already available, in one transaction. On a failure the
    /// batch is retried one event at a time, so retries and exhaustion apply per event.
    UpTo(usize),
    /// One whole source transaction per handler transaction, through
    /// [`Subscriber::handle_group`](crate::Subscriber::handle_group). Commit lane only.
    Groups,
}

/// Capped exponential backoff with full jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries per event, the first included. Default 5.
    pub max_attempts: u32,
    /// The backoff ceiling after the first failure. Default 100 ms.
    pub initial_backoff: Duration,
    /// The backoff ceiling never exceeds this. Default 10 s; at most half the job's lease, so
    /// a runner waiting to retry keeps its claim.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// The wait after failed attempt `attempt` (1-based): uniform in `[0, min(max, initial ×
    /// 2^(attempt-1))]`.
    pub(crate) fn backoff(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(30);
        let ceiling = self
            .initial_backoff
            .saturating_mul(1u32 << exponent)
            .min(self.max_backoff);
        ceiling.mul_f64(fastrand::f64())
    }
}

/// The configuration of a durable subscription ("job"), built with setters that state their
/// defaults.
///
/// ```
/// use std::time::Duration;
/// use ordo::{Batch, JobConfig, OnExhaustion, Ordering, RetryPolicy};
///
/// let config = JobConfig::new("billing-projection")
///     .ordering(Ordering::Commit)
///     .batch(Batch::Groups)
///     .retry(RetryPolicy { max_attempts: 3, ..RetryPolicy::default() })
///     .on_exhaustion(OnExhaustion::DeadLetter)
///     .lease(Duration::from_secs(10));
/// ```
#[derive(Debug, Clone)]
pub struct JobConfig {
    pub(crate) name: String,
    pub(crate) ordering: Ordering,
    pub(crate) retry: RetryPolicy,
    pub(crate) on_exhaustion: OnExhaustion,
    pub(crate) on_undecodable: OnExhaustion,
    pub(crate) start: StartFrom,
    pub(crate) batch: Batch,
    pub(crate) lease: Duration,
    pub(crate) types: TypeFilter,
    pub(crate) keyed: Option<Keyed>,
}

/// A keyed subscription's limits (see [`JobConfig::keyed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Keyed {
    /// Handlers running at once.
    pub(crate) concurrency: usize,
    /// Events held past the watermark, finished or not.
    pub(crate) window: usize,
}

/// The most handlers a keyed subscription runs at once.
pub const MAX_CONCURRENCY: usize = 4096;

impl JobConfig {
    /// A subscription named `name` (its key in `ordo.subscriptions`), with the defaults.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ordering: Ordering::Insert,
            retry: RetryPolicy::default(),
            on_exhaustion: OnExhaustion::Halt,
            on_undecodable: OnExhaustion::DeadLetter,
            start: StartFrom::Beginning,
            batch: Batch::PerEvent,
            lease: Duration::from_secs(30),
            types: TypeFilter::default(),
            keyed: None,
        }
    }

    /// The lane to follow. Default [`Ordering::Insert`]. A stored subscription on the other lane
    /// is refused, never replayed.
    pub fn ordering(mut self, ordering: Ordering) -> Self {
        self.ordering = ordering;
        self
    }

    /// Retries per event. Default [`RetryPolicy::default`] (5 attempts, backoff 100 ms to 10 s).
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// What happens after the last attempt. Default [`OnExhaustion::Halt`].
    pub fn on_exhaustion(mut self, policy: OnExhaustion) -> Self {
        self.on_exhaustion = policy;
        self
    }

    /// What happens to an event whose payload does not decode as the outbox's payload type
    /// (a row of one of its types written by hand, or by another version of the code). It
    /// fails the same way every time, so it is not retried. Default
    /// [`OnExhaustion::DeadLetter`]: it is copied to `ordo.dead_letters` with the decoding
    /// error and the subscription goes on (a keyed one's other keys too); `ordo status`,
    /// `ordo subscriptions` and `--prometheus` count it, and `ordo dead-letters retry` hands
    /// it to the handler again once the code decodes it. [`OnExhaustion::Halt`] stops the
    /// subscription there instead (a keyed one stalls it, and an event whose keys cannot be
    /// known holds every key). Rows of other event types never get here: they are skipped
    /// before decoding (see [`event_types`](Self::event_types)).
    pub fn on_undecodable(mut self, policy: OnExhaustion) -> Self {
        self.on_undecodable = policy;
        self
    }

    /// Where a new subscription starts. Default [`StartFrom::Beginning`]; ignored once the
    /// subscription exists.
    pub fn start(mut self, start: StartFrom) -> Self {
        self.start = start;
        self
    }

    /// Events per handler transaction. Default [`Batch::PerEvent`].
    pub fn batch(mut self, batch: Batch) -> Self {
        self.batch = batch;
        self
    }

    /// How long the runner's claim on the subscription lasts without renewal: how long a
    /// runner that stopped (crashed, cut off) keeps every other runner out. Default 30 s;
    /// [`MIN_LEASE`] (100 ms) to [`MAX_LEASE`] (24 hours), others are refused at subscribe.
    ///
    /// - **Serial** (the default): the runner renews it at each checkpoint and every third of
    ///   it while idle; a handler call that runs longer than this loses the claim, and its
    ///   transaction is rolled back.
    /// - **Keyed** ([`keyed`](Self::keyed)): the runner renews it every third of it while
    ///   handlers run, so the lease does **not** bound how long one handler may take. What it
    ///   bounds there is how long a handler's transaction may sit idle between two statements
    ///   (the server ends the session past it, `idle_in_transaction_session_timeout`, and that
    ///   attempt fails and is retried). A handler that keeps its transaction busy runs until
    ///   it returns: bound its work with its own timeout or a `SET LOCAL statement_timeout`.
    ///
    /// In both modes a failed attempt's transaction is rolled back before the retry starts.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Hands the handler only events of these types (`ordo.events.event_type`, see
    /// [`Envelope::event_type`](crate::Envelope::event_type)), and untyped ones unless
    /// [`skip_untyped`](Self::skip_untyped). Events of any other type are skipped before their
    /// payload is decoded, so they never fail, halt or dead-letter the subscription; the
    /// position moves past them with the next handled event, or alone, and they are counted
    /// (`ordo_subscription_skipped_total`).
    ///
    /// **Default: the payload type's own types.** A subscription of an `Outbox<P>` whose `P`
    /// is a serde enum tagged the way publishing stores a type (externally, or by a `type`
    /// field) takes `P`'s variants as serde names them (renames and aliases included) and
    /// skips every other type. Where `P` can take any type (a struct, an untagged enum, a
    /// `#[serde(other)]` catch-all, `serde_json::Value`) it takes every type.
    /// [`all_types`](Self::all_types) takes every type whatever `P` is.
    pub fn event_types<I, T>(mut self, types: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        self.types = self.types.choose(types);
        self
    }

    /// Hands the handler events of every type, instead of only the payload type's own (the
    /// default, see [`event_types`](Self::event_types)): for a subscription that wants to see,
    /// and fail on, rows it cannot decode.
    ///
    /// ```
    /// use ordo::JobConfig;
    ///
    /// let audit = JobConfig::new("audit-everything").all_types();
    /// ```
    pub fn all_types(mut self) -> Self {
        self.types = self.types.choose_all();
        self
    }

    /// The types this subscription of an `Outbox<P>` takes: the chosen ones, or `P`'s own;
    /// skipped events counted under its name.
    pub(crate) fn resolve_types<P: serde::de::DeserializeOwned>(mut self) -> Self {
        self.types = self.types.or_types_of::<P>().counted_for(&self.name);
        self
    }

    /// Skips untyped events (NULL `event_type`) instead of handing them to the handler, for a
    /// subscription that trusts only typed rows. Default false: an untyped event is handled,
    /// and one that does not decode follows [`on_undecodable`](Self::on_undecodable).
    pub fn skip_untyped(mut self, skip: bool) -> Self {
        self.types.set_skip_untyped(skip);
        self
    }

    /// Makes the subscription **keyed**: each event is handled in order with the events that
    /// share one of its keys ([`Subscriber::keys`](crate::Subscriber::keys)), and concurrently
    /// with the others, up to `concurrency` handlers at once. Each handler runs in its own
    /// transaction, which also records the event as done; a failing event holds only its own
    /// keys (it backs off, and with [`OnExhaustion::Halt`] its keys stall until an operator
    /// retries them, while every other key goes on). See `docs/keyed-subscriptions.md` for
    /// the exact guarantee.
    ///
    /// Handlers hold a pool connection each: a `concurrency` above the pool's size waits for
    /// connections. Only [`Batch::PerEvent`] applies (one event per transaction).
    ///
    /// ```
    /// use ordo::{JobConfig, Ordering};
    ///
    /// let config = JobConfig::new("notify-recipients")
    ///     .ordering(Ordering::Commit)
    ///     .keyed(32);
    /// ```
    pub fn keyed(mut self, concurrency: usize) -> Self {
        let window = self
            .keyed
            .map_or(DEFAULT_KEYED_WINDOW, |keyed| keyed.window);
        self.keyed = Some(Keyed {
            concurrency,
            window,
        });
        self
    }

    /// How many events past its low watermark a keyed subscription holds (in memory, and as
    /// rows of `ordo.subscription_progress`), finished or not. While a stalled key holds the
    /// watermark, the other keys run on until this many events are held; then the subscription
    /// waits for the stalled key (its status shows the stall). Default
    /// [`DEFAULT_KEYED_WINDOW`]; at least the concurrency. Only for [`keyed`](Self::keyed)
    /// subscriptions.
    pub fn keyed_window(mut self, events: usize) -> Self {
        let concurrency = self.keyed.map_or(0, |keyed| keyed.concurrency);
        self.keyed = Some(Keyed {
            concurrency,
            window: events,
        });
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let invalid = Error::invalid_config;
        if self.name.is_empty() || self.name.len() > 200 {
            return invalid("JobConfig::new", "the name must be 1 to 200 characters");
        }
        if self.retry.max_attempts == 0 {
            return invalid("retry.max_attempts", "must be at least 1");
        }
        if self.retry.initial_backoff > self.retry.max_backoff {
            return invalid(
                "retry.initial_backoff/retry.max_backoff",
                "initial_backoff must not exceed max_backoff",
            );
        }
        if self.lease < MIN_LEASE || self.lease > MAX_LEASE {
            return invalid(
                "lease",
                "must be 100 ms to 24 hours: a runner that stops keeps every other runner out for a whole lease, and the server takes it in milliseconds as the handler transaction's idle limit",
            );
        }
        if self.retry.max_backoff > self.lease / 2 {
            return invalid(
                "retry.max_backoff/lease",
                "max_backoff must be at most half the lease: the lease is renewed before each wait, and must outlast it",
            );
        }
        if let Some(keyed) = self.keyed {
            if keyed.concurrency == 0 || keyed.concurrency > MAX_CONCURRENCY {
                return invalid(
                    "keyed",
                    "the concurrency must be 1 to 4096 (call JobConfig::keyed before keyed_window)",
                );
            }
            if keyed.window < keyed.concurrency {
                return invalid(
                    "keyed_window",
                    "the window must hold at least as many events as the concurrency",
                );
            }
            if self.batch != Batch::PerEvent {
                return invalid(
                    "batch/keyed",
                    "a keyed subscription handles one event per transaction: use Batch::PerEvent",
                );
            }
        }
        match self.batch {
            Batch::UpTo(0) => invalid("batch", "Batch::UpTo needs at least 1 event"),
            Batch::Groups if self.ordering != Ordering::Commit => invalid(
                "batch/ordering",
                "Batch::Groups needs Ordering::Commit: only the commit lane keeps groups whole",
            ),
            _ => Ok(()),
        }
    }
}
