//! CPU time of threads, from the scheduler's own accounting (nanoseconds,
//! unlike the 10 ms ticks of /proc/PID/stat).

use std::fs;

/// CPU time of the calling thread so far, in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    read_schedstat("/proc/thread-self/schedstat").unwrap_or(0)
}

/// First field of a schedstat file: time spent on the CPU, in ns.
fn read_schedstat(path: &str) -> Option<u64> {
    let text = fs::read_to_string(path).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_thread_accumulates_cpu_time() {
        let before = thread_cpu_ns();
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let spent = thread_cpu_ns() - before;
        // At least part of 30 ms of spinning is on the CPU even on a busy machine.
        assert!(spent > 1_000_000, "spent {spent} ns");
    }
}
