//! Counters read from a `metrics_util` debugging recorder, summed across snapshots (each
//! snapshot resets them), by name and `result` label.

use std::collections::HashMap;

use metrics_util::debugging::{DebugValue, Snapshotter};

#[derive(Default, Debug)]
pub struct Counters(HashMap<(String, Option<String>), u64>);

impl Counters {
    /// Adds what the recorder counted since the last snapshot.
    pub fn add(&mut self, snapshotter: &Snapshotter) {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let DebugValue::Counter(count) = value else {
                continue;
            };
            let result = key
                .key()
                .labels()
                .find(|label| label.key() == "result")
                .map(|label| label.value().to_owned());
            *self
                .0
                .entry((key.key().name().to_owned(), result))
                .or_default() += count;
        }
    }

    /// The total of counter `name` with label `result` (`None`: no such label).
    pub fn get(&self, name: &str, result: Option<&str>) -> u64 {
        self.0
            .get(&(name.to_owned(), result.map(str::to_owned)))
            .copied()
            .unwrap_or(0)
    }
}
