//! A tracing layer that records every event, for tests that check what ordo logs.

use std::sync::{Arc, Mutex};

/// One logged event: its level, target, and its fields as `name=value` pairs in order.
#[derive(Debug, Clone)]
pub struct Logged {
    pub level: tracing::Level,
    pub target: String,
    pub fields: String,
}

/// Records every event of the subscriber it is layered on; clones share the record.
#[derive(Clone, Default)]
pub struct Recorder(pub Arc<Mutex<Vec<Logged>>>);

impl Recorder {
    /// The events logged so far.
    pub fn events(&self) -> Vec<Logged> {
        self.0
            .lock()
            .map(|events| events.clone())
            .unwrap_or_default()
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Recorder {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!("{}={value:?} ", field.name()));
            }
        }
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        if let Ok(mut events) = self.0.lock() {
            events.push(Logged {
                level: *event.metadata().level(),
                target: event.metadata().target().to_owned(),
                fields: fields.0,
            });
        }
    }
}
