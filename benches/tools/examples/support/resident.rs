//! The process's resident memory, for the memory examples (Linux: `/proc/self/status`).

use anyhow::{Context, Result};

/// `VmHWM` (the peak) and `VmRSS` (now), in MiB.
pub fn resident() -> Result<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").context("read /proc/self/status")?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find(|line| line.starts_with(name))
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map_or(0, |kb| kb / 1024)
    };
    Ok((field("VmHWM:"), field("VmRSS:")))
}
