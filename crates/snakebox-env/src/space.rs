//! Telling a build that ran out of disk space from any other failure.
//!
//! uv, the compiler and our own writes say "No space left on device" (`ENOSPC`, or
//! `EDQUOT` under a quota) in different words and places, and some of them do not fail at
//! all: a short write leaves a truncated file behind and the writer exits 0. So a failed or
//! unverifiable build is judged by what was said *and* by how much room is left
//! ([`statvfs`](nix::sys::statvfs::statvfs)) on the file system of the directory it wrote,
//! measured before the build directory is removed.

use std::path::Path;

/// Below this many free bytes, a failed build is blamed on space.
pub const LOW_SPACE_BYTES: u64 = 8 * 1024 * 1024;

/// Whether `text` (a tool's output or an error chain) reports a full disk or quota.
pub fn says_no_space(text: &str) -> bool {
    let lower = text.to_lowercase();
    lower.contains("no space left on device")
        || lower.contains("os error 28")
        || lower.contains("enospc")
        || lower.contains("disk quota exceeded")
        || lower.contains("os error 122")
        || lower.contains("edquot")
}

/// Bytes available to unprivileged writers on the file system holding `path` (`None` when
/// it cannot be asked).
pub fn available_bytes(path: &Path) -> Option<u64> {
    let stat = nix::sys::statvfs::statvfs(path).ok()?;
    #[allow(clippy::useless_conversion)] // the field types differ between targets
    let (avail, size) = (
        u64::from(stat.blocks_available()),
        u64::from(stat.fragment_size()),
    );
    Some(avail.saturating_mul(size))
}

/// Whether the file system holding `path` has less than [`LOW_SPACE_BYTES`] left.
pub fn is_low_on_space(path: &Path) -> bool {
    available_bytes(path).is_some_and(|bytes| bytes < LOW_SPACE_BYTES)
}

/// `n` bytes for a person (`512 B`, `3.2 MiB`, `1.5 GiB`).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    #[allow(clippy::cast_precision_loss)] // one decimal shown
    let mut value = n as f64 / 1024.0;
    let mut unit = UNITS[0];
    for next in &UNITS[1..] {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    format!("{value:.1} {unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_words_of_a_full_disk_are_recognised() {
        for text in [
            "error: Failed to install: No space left on device (os error 28)",
            "OSError: [Errno 28] No space left on device: '/x/__pycache__/a.pyc'",
            "Disk quota exceeded (os error 122)",
        ] {
            assert!(says_no_space(text), "{text}");
        }
        for text in [
            "error: Because foo was not found in the package registry",
            "warning: The `UV_NATIVE_TLS` environment variable is deprecated",
            "invalid peer certificate: UnknownIssuer",
        ] {
            assert!(!says_no_space(text), "{text}");
        }
    }

    #[test]
    fn free_space_is_measured_and_shown() {
        let dir = tempfile::tempdir().unwrap();
        assert!(available_bytes(dir.path()).is_some());
        assert_eq!(available_bytes(&dir.path().join("missing")), None);
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 * 1024 * 1024 + 200 * 1024), "3.2 MiB");
    }
}
