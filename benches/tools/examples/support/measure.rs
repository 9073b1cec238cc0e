//! What the load tools measure with: latency histograms in nanoseconds, printed in
//! milliseconds, and the machine's load average beside each sitting. Shared by
//! `examples/single_writer.rs` and `benches/peer` so their figures read alike.
#![allow(dead_code)]

use std::time::Duration;

use hdrhistogram::Histogram;

/// A histogram of latencies from 1 µs to 60 s, three significant digits.
pub fn histogram() -> anyhow::Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1_000, 60_000_000_000, 3)?)
}

/// `d` in nanoseconds, at least the histogram's floor of 1 µs.
pub fn nanos(d: Duration) -> u64 {
    (d.as_nanos() as u64).max(1_000)
}

/// Nanoseconds as milliseconds.
pub fn ms(nanos: u64) -> f64 {
    nanos as f64 / 1e6
}

/// The machine's one-minute load average (`/proc/loadavg`), or `?` where there is none.
pub fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

/// `p50 … p99 … max …` of a latency histogram, in milliseconds.
pub fn quantiles(h: &Histogram<u64>) -> String {
    format!(
        "p50 {:.3} p99 {:.3} max {:.3}",
        ms(h.value_at_quantile(0.5)),
        ms(h.value_at_quantile(0.99)),
        ms(h.max())
    )
}
