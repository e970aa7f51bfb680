//! What a container's run used (peak memory, CPU time), read from the host's cgroup file
//! system after the container is gone.
//!
//! Why a cgroup of ours: the engine removes the container's own cgroup when the container
//! ends, before anything can read it, and its stats API samples once a second (a short run
//! has no sample at all). So each container gets a parent cgroup of its own
//! (`HostConfig.CgroupParent` = `/snakebox-docker/<server>/<container>`), which the engine
//! creates and never removes: the kernel counts the container's memory high-water mark and
//! CPU time in it too, and it is still there after the removal. We read it, then remove it.
//! Only with the engine's `cgroupfs` driver (with `systemd` the parent would be a systemd
//! slice): elsewhere the usage is unknown, as is the count of refused forks (the kernel keeps
//! that in the container's own cgroup only).

use std::path::{Path, PathBuf};

use crate::ResourceUsage;

/// Where the cgroup file systems are mounted.
const CGROUP_FS: &str = "/sys/fs/cgroup";
/// The cgroup every container's parent goes under.
const TOP: &str = "snakebox-docker";

/// This server's cgroup directory (relative to each hierarchy's root).
#[derive(Debug, Clone)]
pub(crate) struct UsageRoot {
    relative: PathBuf,
    unified: bool,
}

impl UsageRoot {
    /// For an engine with this cgroup driver: `None` unless it is `cgroupfs` and the cgroup
    /// file system is where we read it.
    pub(crate) fn for_engine(driver: &str) -> Option<UsageRoot> {
        if driver != "cgroupfs" || !Path::new(CGROUP_FS).is_dir() {
            return None;
        }
        Some(UsageRoot {
            relative: Path::new(TOP).join(super::server_identity()),
            unified: Path::new(CGROUP_FS).join("cgroup.controllers").exists(),
        })
    }

    /// The cgroup of one container's run.
    pub(crate) fn for_run(&self, container: &str) -> RunCgroup {
        RunCgroup {
            relative: self.relative.join(container),
            unified: self.unified,
        }
    }

    /// Remove what is left under this server's directory, then the directory (at shutdown,
    /// after its containers were removed). Best effort.
    pub(crate) fn remove_all(&self) {
        for hierarchy in hierarchies(self.unified) {
            let dir = hierarchy.join(&self.relative);
            if let Ok(entries) = fs_err::read_dir(&dir) {
                for entry in entries.flatten() {
                    if entry.path().is_dir() {
                        let _ = fs_err::remove_dir(entry.path());
                    }
                }
            }
            let _ = fs_err::remove_dir(&dir);
        }
    }
}

/// Whether the kernel killed a container for memory, as far as the host can tell the moment
/// it ended: `engine_says` (the engine's `OOMKilled`), or a death by `SIGKILL` (`exit_code`
/// 137: the container init's 128 + 9) with the memory high-water mark of its cgroup (`peak`) at its
/// `limit`.
///
/// Why not the engine's word alone: its `OOMKilled` is set by the runtime's OOM event, which
/// races the exit event (they come independently), so just after the end it may still say
/// `false` for a container the kernel killed. The kernel charges memory to a cgroup up to its
/// limit and kills when a charge fails, so at that moment the usage is within one failed charge
/// (at most a huge page, or a batch of pages) of the limit; the slack allows for that. A run
/// that the server itself killed (a timeout, a cancel) is told apart by the supervisor.
pub(crate) fn killed_for_memory(
    engine_says: bool,
    exit_code: Option<i32>,
    limit: Option<u64>,
    peak: Option<u64>,
) -> bool {
    const KILLED: i32 = 128 + libc::SIGKILL;
    let at_limit = |limit: u64, peak: u64| peak >= limit.saturating_sub((limit / 32).max(4 << 20));
    engine_says
        || (exit_code == Some(KILLED)
            && limit
                .zip(peak)
                .is_some_and(|(limit, peak)| at_limit(limit, peak)))
}

/// The parent cgroup of one container.
#[derive(Debug, Clone)]
pub(crate) struct RunCgroup {
    relative: PathBuf,
    unified: bool,
}

impl RunCgroup {
    /// The value of `HostConfig.CgroupParent`.
    pub(crate) fn parent(&self) -> String {
        format!("/{}", self.relative.display())
    }

    /// Peak memory and CPU time, once the container is removed (its own cgroup was a child
    /// of this one).
    pub(crate) fn usage(&self) -> ResourceUsage {
        let read = |path: PathBuf| fs_err::read_to_string(path).ok();
        let number = |text: Option<String>| text.and_then(|t| t.trim().parse::<u64>().ok());
        let root = Path::new(CGROUP_FS);
        if self.unified {
            let dir = root.join(&self.relative);
            let cpu_usec = read(dir.join("cpu.stat")).and_then(|stat| {
                stat.lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            });
            ResourceUsage {
                peak_memory_bytes: number(read(dir.join("memory.peak"))),
                cpu_time_ms: cpu_usec.map(|us| us / 1000),
                process_limit_hits: None,
            }
        } else {
            let memory = root.join("memory").join(&self.relative);
            let cpuacct = root.join("cpuacct").join(&self.relative);
            ResourceUsage {
                peak_memory_bytes: number(read(memory.join("memory.max_usage_in_bytes"))),
                cpu_time_ms: number(read(cpuacct.join("cpuacct.usage"))).map(|ns| ns / 1_000_000),
                process_limit_hits: None,
            }
        }
    }

    /// Remove it in every hierarchy (the container's own cgroup below it is gone). Best
    /// effort: a cgroup still in use stays until the server's [`UsageRoot::remove_all`].
    pub(crate) fn remove(&self) {
        for hierarchy in hierarchies(self.unified) {
            let dir = hierarchy.join(&self.relative);
            if dir.is_dir() {
                let _ = fs_err::remove_dir(&dir);
            }
        }
    }
}

/// Remove the cgroups of servers that are gone (killed before their shutdown's sweep): each
/// server's directory under `snakebox-docker` in every hierarchy, when `gone` says so of its
/// name (the server's label value). Their containers were removed first. Best effort.
pub(crate) fn remove_orphans(gone: impl Fn(&str) -> bool) {
    let unified = Path::new(CGROUP_FS).join("cgroup.controllers").exists();
    for hierarchy in hierarchies(unified) {
        let Ok(servers) = fs_err::read_dir(hierarchy.join(TOP)) else {
            continue;
        };
        for server in servers.flatten() {
            let name = server.file_name().to_string_lossy().into_owned();
            if !server.path().is_dir() || !gone(&name) {
                continue;
            }
            if let Ok(runs) = fs_err::read_dir(server.path()) {
                for run in runs.flatten() {
                    let _ = fs_err::remove_dir(run.path());
                }
            }
            let _ = fs_err::remove_dir(server.path());
        }
    }
}

/// The cgroup hierarchies' roots: the one of cgroup v2, or each v1 controller's.
fn hierarchies(unified: bool) -> Vec<PathBuf> {
    if unified {
        return vec![PathBuf::from(CGROUP_FS)];
    }
    fs_err::read_dir(CGROUP_FS)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_run_has_a_parent_of_its_own_under_the_servers() {
        let root = UsageRoot {
            relative: Path::new(TOP).join("1.2.3"),
            unified: true,
        };
        assert_eq!(
            root.for_run("snakebox-ab").parent(),
            "/snakebox-docker/1.2.3/snakebox-ab"
        );
        assert!(UsageRoot::for_engine("systemd").is_none());
    }

    #[test]
    fn a_sigkill_at_the_memory_limit_is_the_limit_even_before_the_engine_says_so() {
        let limit = Some(512 << 20);
        // The engine's word is enough.
        assert!(killed_for_memory(true, Some(1), limit, None));
        // Killed with the cgroup's high-water mark at the limit (less than one failed charge).
        assert!(killed_for_memory(
            false,
            Some(137),
            limit,
            Some((512 << 20) - (2 << 20))
        ));
        // Killed far below the limit, or ended otherwise at the limit, or nothing known.
        assert!(!killed_for_memory(false, Some(137), limit, Some(100 << 20)));
        assert!(!killed_for_memory(false, Some(0), limit, Some(512 << 20)));
        assert!(!killed_for_memory(false, Some(1), limit, Some(512 << 20)));
        assert!(!killed_for_memory(false, Some(137), None, Some(512 << 20)));
        assert!(!killed_for_memory(false, Some(137), limit, None));
    }
}
