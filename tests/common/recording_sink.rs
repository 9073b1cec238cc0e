//! A sink of the public `Sink` trait that delivers everything and records each message's
//! position, for relay tests that need no broker.

use std::sync::{Arc, Mutex};

use ordo::relay::{Message, Outcomes, SendError, Sink};

/// Delivers every message, recording its position; clones share the record.
#[derive(Clone, Default)]
pub struct Recording(pub Arc<Mutex<Vec<u64>>>);

impl Recording {
    /// The positions received so far, in the order they came.
    pub fn positions(&self) -> Vec<u64> {
        self.0.lock().map(|seen| seen.clone()).unwrap_or_default()
    }
}

impl Sink for Recording {
    async fn send(&mut self, batch: &[Message], outcomes: &mut Outcomes) -> Result<(), SendError> {
        if let Ok(mut received) = self.0.lock() {
            received.extend(batch.iter().map(|message| message.position));
        }
        (0..batch.len()).for_each(|index| outcomes.delivered(index));
        Ok(())
    }

    async fn reset(&mut self) -> Result<(), SendError> {
        Ok(())
    }

    fn describe(&self) -> String {
        "recording (test)".to_owned()
    }
}
