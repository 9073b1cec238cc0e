//! Event types: the `ordo.events.event_type` column, how a published payload's type is found,
//! and how listeners and subscriptions select types.
//!
//! The model: **one event enum per service**. A service publishes one serde enum `P`; each
//! variant is a type, and its name (as serde writes it, renames included) is stored in
//! `event_type`. A consumer selects the types it handles; rows of other types (another
//! service's events, plain-SQL rows that set another type) are skipped *before* their payload
//! is decoded, so they can never halt or dead-letter it.
//!
//! Finding the type costs no trait bound: at publish time the payload is run through a probe
//! serializer that stops at the first thing that names a type:
//! - an externally tagged enum (serde's default): the variant name
//!   (`OrderPlaced { .. }` → `"OrderPlaced"`);
//! - an object (a struct, a map, an internally or adjacently tagged enum) with a string field
//!   named `type`: its value (`#[serde(tag = "type")]` → the variant name);
//! - anything else (a plain struct, a number, ...): no type (SQL NULL).

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::Serialize;

mod own_types;
mod probe;

use probe::{Probe, Stop};

/// The field an object's type is read from.
const TYPE_FIELD: &str = "type";

/// The type `payload` names, if any (see the module docs for the rule).
pub(crate) fn type_of<P: Serialize + ?Sized>(payload: &P) -> Option<String> {
    match payload.serialize(Probe) {
        Err(Stop::Found(name)) => Some(name),
        _ => None,
    }
}

/// Which event types a listener or a subscription takes. Untyped events (NULL) are taken
/// unless `skip_untyped`: ordo cannot tell what they are, so they keep the consumer's policy
/// for payloads that do not decode.
#[derive(Debug, Clone, Default)]
pub(crate) struct TypeFilter {
    /// `None`: every type.
    types: Option<Arc<BTreeSet<String>>>,
    skip_untyped: bool,
    /// Whether the types were chosen ([`only`](Self::only) or [`all`](Self::all)); if not,
    /// [`or_types_of`](Self::or_types_of) selects the payload type's own.
    chosen: bool,
    /// Where a subscription counts the events this filter passes over.
    skipped: Option<metrics::Counter>,
}

impl TypeFilter {
    pub(crate) fn only<I, T>(types: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        Self {
            types: Some(Arc::new(types.into_iter().map(Into::into).collect())),
            skip_untyped: false,
            chosen: true,
            skipped: None,
        }
    }

    /// Only `types` from now on, keeping this filter's policy for untyped events.
    pub(crate) fn choose<I, T>(&self, types: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        let mut chosen = Self::only(types);
        chosen.skip_untyped = self.skip_untyped;
        chosen
    }

    /// Every type from now on, keeping this filter's policy for untyped events.
    pub(crate) fn choose_all(&self) -> Self {
        Self {
            skip_untyped: self.skip_untyped,
            ..Self::all()
        }
    }

    /// Every type, chosen: no payload type's own selection replaces it.
    pub(crate) fn all() -> Self {
        Self {
            chosen: true,
            ..Self::default()
        }
    }

    /// This filter, or, when no types were chosen, the types `P` decodes (see
    /// [`own_types`]): every type when `P` can take any.
    pub(crate) fn or_types_of<P: serde::de::DeserializeOwned>(self) -> Self {
        if self.chosen {
            return self;
        }
        Self {
            types: own_types::types_of::<P>().map(Arc::new),
            chosen: true,
            ..self
        }
    }

    /// Counts what it passes over in `ordo_subscription_skipped_total` for `subscription`.
    pub(crate) fn counted_for(self, subscription: &str) -> Self {
        let counter = metrics::counter!(
            crate::telemetry::metrics::SUBSCRIPTION_SKIPPED,
            "subscription" => subscription.to_owned()
        );
        Self {
            skipped: Some(counter),
            ..self
        }
    }

    /// [`admits`](Self::admits), counting an event passed over.
    pub(crate) fn takes(&self, event_type: Option<&str>) -> bool {
        let admitted = self.admits(event_type);
        if let (false, Some(skipped)) = (admitted, &self.skipped) {
            skipped.increment(1);
        }
        admitted
    }

    pub(crate) fn set_skip_untyped(&mut self, skip: bool) {
        self.skip_untyped = skip;
    }

    /// Whether an event of type `event_type` is handed to the consumer.
    pub(crate) fn admits(&self, event_type: Option<&str>) -> bool {
        match (event_type, &self.types) {
            (None, _) => !self.skip_untyped,
            (Some(_), None) => true,
            (Some(name), Some(types)) => types.contains(name),
        }
    }
}

#[cfg(test)]
mod tests;
