//! The serving process's own memory: what `serve` does so that an idle server stays small.
//!
//! Most of an idle server's resident set is not data but its own code: the kernel maps a
//! binary's pages in as they are first executed, 64 KiB around each fault, and they stay
//! mapped for the life of the process. Start-up (settings, the stores' schemas, interpreter
//! discovery, the engine's checks) executes a great deal of code that never runs again, and
//! code of the HTTP face, the web UI and the docker backend sits between the pages a stdio
//! server does run. Two things keep that out of the resident set:
//!
//! - once start-up is over, the binary's code and read-only data are unmapped from the process
//!   ([`release_startup_pages`]); the pages stay in the page cache, so code that runs again is
//!   mapped back by a minor fault, and only what the server keeps executing returns;
//! - at most [`ARENAS`] malloc arenas: glibc otherwise gives threads that allocate at the same
//!   time arenas of their own (up to eight per core), each keeping freed memory of its own.

use std::io::BufRead;

/// The malloc arenas of the serving process (glibc's default is eight per core).
const ARENAS: libc::c_int = 2;

/// Limit glibc's malloc arenas (see the module docs). Call before the runtime starts threads.
pub(crate) fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called before other threads exist.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, ARENAS);
    }
}

/// A mapping of the binary's own file that holds nothing but the file's contents.
#[derive(Debug, PartialEq, Eq)]
struct FileMapping {
    start: usize,
    end: usize,
}

/// Unmap the binary's code and read-only data pages from the process (they stay in the page
/// cache): what start-up executed is no longer resident, and what runs again is mapped back as
/// it runs. Only mappings of the executable's own file that are read-only and hold no private
/// copy of any page (`Anonymous: 0 kB`) are released, so nothing is lost by dropping them.
/// Returns the bytes released; failures are logged and change nothing.
pub(crate) fn release_startup_pages() -> usize {
    let anchor = release_startup_pages as *const () as usize;
    let smaps = match fs_err::File::open("/proc/self/smaps") {
        Ok(file) => std::io::BufReader::new(file),
        Err(err) => {
            tracing::debug!(%err, "not releasing start-up pages");
            return 0;
        }
    };
    let lines: Vec<String> = smaps.lines().map_while(Result::ok).collect();
    let mut released = 0;
    for mapping in releasable(&lines, anchor) {
        let len = mapping.end - mapping.start;
        // SAFETY: the range is a whole private, read-only mapping of our executable's file
        // with no private (copied-on-write) page: MADV_DONTNEED only unmaps its pages, and the
        // next access maps the same file contents back.
        let done =
            unsafe { libc::madvise(mapping.start as *mut libc::c_void, len, libc::MADV_DONTNEED) };
        if done == 0 {
            released += len;
        } else {
            tracing::debug!(err = %std::io::Error::last_os_error(), "madvise failed");
        }
    }
    released
}

/// The mappings to release, from `/proc/self/smaps`: those of the file that holds `anchor`
/// (an address in our code), read-only (`r-xp` or `r--p`), with no anonymous page.
fn releasable(lines: &[String], anchor: usize) -> Vec<FileMapping> {
    struct Entry {
        start: usize,
        end: usize,
        perms: String,
        file: String,
        anonymous_kb: Option<u64>,
    }
    let mut entries: Vec<Entry> = Vec::new();
    for line in lines {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { continue };
        if let Some((start, end)) = first.split_once('-')
            && let (Ok(start), Ok(end)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
            )
        {
            let perms = words.next().unwrap_or_default().to_owned();
            // offset, device, inode: the file is identified by device and inode.
            let _offset = words.next();
            let device = words.next().unwrap_or_default();
            let inode = words.next().unwrap_or_default();
            entries.push(Entry {
                start,
                end,
                perms,
                file: format!("{device} {inode}"),
                anonymous_kb: None,
            });
        } else if first == "Anonymous:"
            && let Some(entry) = entries.last_mut()
        {
            entry.anonymous_kb = words.next().and_then(|kb| kb.parse().ok());
        }
    }
    let Some(own) = entries
        .iter()
        .find(|e| e.start <= anchor && anchor < e.end && e.perms == "r-xp")
        .map(|e| e.file.clone())
    else {
        return Vec::new();
    };
    entries
        .into_iter()
        .filter(|e| {
            e.file == own && (e.perms == "r-xp" || e.perms == "r--p") && e.anonymous_kb == Some(0)
        })
        .map(|e| FileMapping {
            start: e.start,
            end: e.end,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smaps(text: &str) -> Vec<String> {
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn only_clean_read_only_mappings_of_the_own_file_are_released() {
        let lines = smaps(
            "1000-2000 r--p 00000000 fe:01 77 /usr/bin/snakebox\n\
             Rss: 8 kB\n\
             Anonymous: 0 kB\n\
             2000-5000 r-xp 00001000 fe:01 77 /usr/bin/snakebox\n\
             Anonymous: 0 kB\n\
             5000-6000 r--p 00004000 fe:01 77 /usr/bin/snakebox\n\
             Anonymous: 4 kB\n\
             6000-7000 rw-p 00005000 fe:01 77 /usr/bin/snakebox\n\
             Anonymous: 0 kB\n\
             8000-9000 r-xp 00000000 fe:01 12 /usr/lib/libc.so.6\n\
             Anonymous: 0 kB\n",
        );
        assert_eq!(
            releasable(&lines, 0x2100),
            vec![
                FileMapping {
                    start: 0x1000,
                    end: 0x2000
                },
                FileMapping {
                    start: 0x2000,
                    end: 0x5000
                },
            ]
        );
        // An anchor outside any code mapping: nothing is released.
        assert!(releasable(&lines, 0x6100).is_empty());
    }

    #[test]
    fn releasing_keeps_the_process_running() {
        let released = release_startup_pages();
        assert!(
            released > 0,
            "the test binary's own code should be released"
        );
        // Code runs again after its pages were dropped (mapped back by a fault), and the
        // same mappings are still there, still clean.
        let lines: Vec<String> = fs_err::read_to_string("/proc/self/smaps")
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect();
        assert!(!releasable(&lines, release_startup_pages as *const () as usize).is_empty());
    }
}
