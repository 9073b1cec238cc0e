//! The write side: [`Outbox`], its transaction wrapper, `publish_in` for caller-owned
//! transactions, and the cross-process wake-up notifier.

pub(crate) mod in_doubt;
pub(crate) mod insert;
pub(crate) mod notifier;
pub(crate) mod outbox;
pub(crate) mod sql;
pub(crate) mod transaction;
