//! How values read on a page: times, durations, sizes, paths in URLs, downloads' names.

/// Milliseconds since the Unix epoch as `YYYY-MM-DD HH:MM:SS` (UTC).
pub(crate) fn utc_ms(ms: u64) -> String {
    utc_secs(ms / 1000)
}

/// Unix seconds as `YYYY-MM-DD HH:MM:SS` (UTC).
pub(crate) use snakebox_engine::utc_text as utc_secs;

/// A duration in milliseconds, as people read it.
pub(crate) fn duration(ms: Option<u64>) -> String {
    match ms {
        None => "—".into(),
        Some(ms) if ms < 1000 => format!("{ms} ms"),
        Some(ms) if ms < 60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        Some(ms) => format!("{} min {} s", ms / 60_000, ms % 60_000 / 1000),
    }
}

/// A size in bytes, as people read it.
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A relative path for a URL: every byte but unreserved ones and `/` percent-encoded.
pub(crate) use snakebox_engine::encode_artifact_path as url_path;

/// The first line of a script, cut to `max` characters, for a list.
pub(crate) fn summary(script: &str, max: usize) -> String {
    let line = script
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with('#'))
        .unwrap_or("");
    if line.chars().count() > max {
        let cut: String = line.chars().take(max).collect();
        format!("{cut}…")
    } else {
        line.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc_calendar_dates() {
        assert_eq!(utc_secs(0), "1970-01-01 00:00:00");
        assert_eq!(utc_secs(951_782_400), "2000-02-29 00:00:00");
        assert_eq!(utc_ms(1_700_000_000_123), "2023-11-14 22:13:20");
    }

    #[test]
    fn sizes_and_durations_read_well() {
        assert_eq!(bytes(10), "10 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(duration(Some(12)), "12 ms");
        assert_eq!(duration(Some(1500)), "1.5 s");
        assert_eq!(duration(Some(61_000)), "1 min 1 s");
        assert_eq!(duration(None), "—");
    }

    #[test]
    fn paths_and_names_are_encoded() {
        assert_eq!(url_path("out/a b.png"), "out/a%20b.png");
        assert_eq!(summary("# c\n\nprint(1)\n", 40), "print(1)");
    }
}
