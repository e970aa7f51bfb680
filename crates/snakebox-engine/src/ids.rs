//! Small helpers for identifiers and durations.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A new execution id: unique within this host (time, process id and a counter), short and
/// safe to use as a directory name.
pub(crate) fn execution_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "{:012x}{:05x}{:04x}",
        (nanos / 1000) & 0xffff_ffff_ffff,
        std::process::id() & 0xfffff,
        count & 0xffff
    )
}

/// Milliseconds of a duration, saturating.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_path_safe() {
        let a = execution_id();
        let b = execution_id();
        assert_ne!(a, b);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
    }
}
