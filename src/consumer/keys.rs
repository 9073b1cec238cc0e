//! [`Keys`]: what a keyed subscription orders an event by.

use std::sync::Arc;

/// The keys of one event in a keyed subscription (see [`JobConfig::keyed`](crate::JobConfig::keyed)
/// and [`Subscriber::keys`](crate::Subscriber::keys)): a recipient, an aggregate id, a tenant.
///
/// Events that share a key are handled one at a time, in lane order; events with no key in
/// common run concurrently. An event with several keys waits until it is first in every one
/// of them, and holds them all for the events behind it. An event with no key is ordered
/// with nothing: it runs as soon as a handler slot is free.
///
/// Duplicates are dropped; the order in which keys are given does not matter.
///
/// ```
/// use ordo::Keys;
///
/// let none = Keys::none();
/// let account = Keys::one("account-42");
/// let transfer: Keys = ["account-42", "account-7", "account-42"].into_iter().collect();
/// assert!(none.is_empty());
/// assert_eq!(account.iter().collect::<Vec<_>>(), ["account-42"]);
/// assert_eq!(transfer.len(), 2);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keys(Vec<Arc<str>>);

/// The key [`Subscriber::keys`](crate::Subscriber::keys) gives every event unless overridden:
/// one key for all, so a keyed subscription whose subscriber names no keys still handles its
/// events one at a time, in order.
pub const SERIAL_KEY: &str = "*";

impl Keys {
    /// No key: the event is ordered with nothing.
    pub fn none() -> Self {
        Self(Vec::new())
    }

    /// One key.
    pub fn one(key: impl Into<String>) -> Self {
        Self(vec![Arc::from(key.into())])
    }

    /// The keys, sorted.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|key| &**key)
    }

    /// How many distinct keys.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// No key at all.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn shared(&self) -> &[Arc<str>] {
        &self.0
    }
}

impl<K: Into<String>> FromIterator<K> for Keys {
    fn from_iter<I: IntoIterator<Item = K>>(keys: I) -> Self {
        let mut keys: Vec<Arc<str>> = keys.into_iter().map(|key| Arc::from(key.into())).collect();
        keys.sort_unstable();
        keys.dedup();
        Self(keys)
    }
}

impl From<&str> for Keys {
    fn from(key: &str) -> Self {
        Self::one(key)
    }
}

impl From<String> for Keys {
    fn from(key: String) -> Self {
        Self::one(key)
    }
}
