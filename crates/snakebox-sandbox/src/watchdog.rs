//! The memory limit where no memory cgroup is available: a watchdog over the run's processes.
//!
//! Why not `RLIMIT_AS`: it limits address space, not memory, and libraries that reserve large
//! address ranges up front (polars, duckdb, anything on jemalloc or mimalloc, the JVM, Go)
//! fail at start under a 1 GiB address-space limit while using a fraction of it. So without
//! a memory cgroup (a normal user on a cgroup v1 host, or v2 without delegation) the
//! supervisor samples the resident anonymous memory of every process in the sandbox's PID
//! namespace (all descendants of its pid 1) and kills the sandbox when the sum exceeds the
//! limit; the run is then reported as `memory_limit`, as an OOM kill in a cgroup is.
//!
//! What this measures and what it does not (reported in `check_environment`): the sum of
//! `Pss_Anon` and `Pss_Shmem` (from `/proc/<pid>/smaps_rollup`: private anonymous memory, and
//! shared anonymous memory such as `mmap(MAP_SHARED | MAP_ANONYMOUS)`, Python's
//! `mmap.mmap(-1, n)`, each page divided between the processes that map it) of each process,
//! sampled every [`INTERVAL`]; where that cannot be read, `RssAnon` and `RssShmem` of
//! `/proc/<pid>/status` (a page shared after `fork` then counts once per process: a fork bomb
//! of 126 interpreters counted 1 GiB for a few MiB, and was reported as `memory_limit`). Page cache and mapped files are not counted
//! (the kernel can reclaim them); `/tmp` and `/dev/shm` are size-capped tmpfs of their own;
//! pages shared between processes (copy-on-write after `fork`, a shared mapping) count once
//! over the tree (the part shared with a process outside it, such as a forked run's fork
//! server, is that process's). A burst between two samples can overshoot the limit briefly; memory the kernel holds
//! for a process without mapping it (pipe buffers, unmapped memfd contents) is not seen. The
//! sandbox's processes have `oom_score_adj` 1000, so if the host itself runs out of memory,
//! the kernel kills them before anything else.

use std::time::Duration;

/// How often the tree is sampled.
pub(crate) const INTERVAL: Duration = Duration::from_millis(100);

/// Most processes walked per sample (a fork bomb is held by the process limit long before).
const MAX_PROCESSES: usize = 4096;

/// The pids of `root` and all its descendants, found through each thread's `children` file
/// (children are listed under the thread that forked them). In a PID namespace every process
/// of the sandbox descends from its pid 1: orphans are re-parented to it.
pub(crate) fn tree(root: i32) -> Vec<i32> {
    let mut out = vec![root];
    let mut next = 0;
    while next < out.len() && out.len() < MAX_PROCESSES {
        let pid = out[next];
        next += 1;
        let Ok(tasks) = fs_err::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.filter_map(Result::ok) {
            let path = task.path().join("children");
            let Ok(children) = fs_err::read_to_string(&path) else {
                continue;
            };
            out.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            );
        }
    }
    out
}

/// Resident anonymous bytes of one process, or `None` when it is gone: its proportional share
/// (`Pss_Anon + Pss_Shmem` of `/proc/<pid>/smaps_rollup`: a page mapped by n processes counts
/// 1/n in each, so the sum over a tree counts each page once), else, where that cannot be
/// read, `RssAnon + RssShmem` of `/proc/<pid>/status` (each process counts every page it
/// maps, so the sum errs high).
pub(crate) fn anon_bytes(pid: i32) -> Option<u64> {
    if let Ok(rollup) = fs_err::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        && let Some(bytes) = parse_rollup_anon(&rollup)
    {
        return Some(bytes);
    }
    let status = fs_err::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_status_anon(&status)
}

/// `Pss_Anon + Pss_Shmem` of a `/proc/<pid>/smaps_rollup`, in bytes (`None` where the kernel
/// has no such lines, before 5.8, or the process has no memory).
pub(crate) fn parse_rollup_anon(rollup: &str) -> Option<u64> {
    anon_sum(rollup, "Pss_Anon:", "Pss_Shmem:")
}

/// `RssAnon + RssShmem` of a `/proc/<pid>/status`, in bytes (`None` for a kernel thread or
/// a zombie, which have no such lines).
pub(crate) fn parse_status_anon(status: &str) -> Option<u64> {
    anon_sum(status, "RssAnon:", "RssShmem:")
}

/// `anon + shmem` of a procfs file of `name:  N kB` lines, in bytes (`None` without `anon`).
fn anon_sum(text: &str, anon: &str, shmem: &str) -> Option<u64> {
    let kib = |name: &str| -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    Some((kib(anon)? + kib(shmem).unwrap_or(0)) * 1024)
}

/// The resident anonymous memory of the tree rooted at `root`, in bytes.
pub(crate) fn tree_anon_bytes(root: i32) -> u64 {
    tree(root).into_iter().filter_map(anon_bytes).sum()
}

/// Whether the process behind `pidfd` has not exited (a pidfd turns readable when it does).
pub(crate) fn pidfd_alive(pidfd: &std::os::fd::OwnedFd) -> bool {
    let mut poll = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(pidfd),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one descriptor we own, with a zero timeout.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    ready == 0
}

/// Threads of every process whose real uid is `uid`: what the kernel counts against
/// RLIMIT_NPROC at the host level (read from `/proc/<pid>/status`; processes that vanish
/// meanwhile are skipped).
pub(crate) fn threads_of_uid(uid: u32) -> u64 {
    let Ok(dir) = fs_err::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| fs_err::read_to_string(e.path().join("status")).ok())
        .filter_map(|status| parse_status_threads(&status, uid))
        .sum()
}

/// `Threads:` of a `/proc/<pid>/status` whose real uid (first `Uid:` field) is `uid`.
pub(crate) fn parse_status_threads(status: &str, uid: u32) -> Option<u64> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
    };
    (field("Uid:")?.parse::<u32>().ok()? == uid).then_some(())?;
    field("Threads:")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_shared_after_fork_counts_once_over_the_tree() {
        let rollup = "Rss:\t 1736 kB\nPss:\t 337 kB\nPss_Anon:\t 112 kB\nPss_File:\t 225 kB\nPss_Shmem:\t 8 kB\n";
        assert_eq!(parse_rollup_anon(rollup), Some(120 * 1024));
        assert_eq!(parse_rollup_anon("Rss:\t 1736 kB\nPss:\t 337 kB\n"), None);
        // A parent and its fork, each mapping the same 64 MiB written before the fork: the
        // proportional sum over both is one copy, where the resident one counted two.
        let mut pages = vec![1u8; 64 << 20];
        pages[0] = 2;
        // SAFETY: fork in a test; the child only sleeps and exits.
        let child = unsafe { libc::fork() };
        if child == 0 {
            std::thread::sleep(std::time::Duration::from_secs(3));
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(0) };
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        let own = i32::try_from(std::process::id()).unwrap();
        let both = anon_bytes(own).unwrap() + anon_bytes(child).unwrap();
        // SAFETY: kill and reap our own child.
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
        }
        assert!(both < 96 << 20, "{both} bytes counted for one 64 MiB copy");
        assert!(both >= 64 << 20, "{both} bytes counted for one 64 MiB copy");
        drop(pages);
    }

    #[test]
    fn anonymous_memory_is_private_plus_shared_anonymous() {
        let status =
            "VmRSS:\t  5000 kB\nRssAnon:\t  3000 kB\nRssFile:\t  1500 kB\nRssShmem:\t   500 kB\n";
        assert_eq!(parse_status_anon(status), Some(3500 * 1024));
        assert_eq!(parse_status_anon("RssAnon:\t 7 kB\n"), Some(7 * 1024));
        assert_eq!(parse_status_anon("Name:\tkthreadd\n"), None);
    }

    #[test]
    fn status_threads_count_for_the_real_uid_only() {
        let status = "Name:\tpython3\nUid:\t1001\t1001\t1001\t1001\nThreads:\t201\n";
        assert_eq!(parse_status_threads(status, 1001), Some(201));
        assert_eq!(parse_status_threads(status, 0), None);
        assert_eq!(parse_status_threads("Uid:\t5\t5\t5\t5\n", 5), None);
        // SAFETY: getuid has no preconditions.
        let me = unsafe { libc::getuid() };
        assert!(threads_of_uid(me) >= 1, "this test's own threads count");
    }

    #[test]
    fn a_child_is_found_and_its_memory_counted() {
        // A real child that touches 64 MiB of anonymous memory, then waits.
        let mut child = std::process::Command::new("python3")
            .args([
                "-c",
                "import sys,time; b=bytearray(64<<20); print('ok', flush=True); time.sleep(30)",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line.trim(), "ok");
        let me = i32::try_from(std::process::id()).unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        assert!(tree(me).contains(&pid), "the child is in our tree");
        let bytes = anon_bytes(pid).unwrap();
        assert!(bytes >= 64 << 20, "{bytes} bytes");
        assert!(tree_anon_bytes(me) >= bytes);
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
