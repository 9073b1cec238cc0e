//! The floor below the parts: metric names and their descriptions, the trace context that
//! travels in headers, the declaration of a hot-path statement, and text made safe for a
//! terminal. Every part may import it; it imports none of them (its docs link to a few).

mod hot;
#[cfg(feature = "kafka")]
mod librdkafka;
pub mod metrics;
mod printable;
pub(crate) mod trace;

pub use hot::HotStatement;
#[cfg(feature = "kafka")]
pub(crate) use librdkafka::Logs;
pub(crate) use printable::clipped;
pub use printable::{needs_escape, printable};
