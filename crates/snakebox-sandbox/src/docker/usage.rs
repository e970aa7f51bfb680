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

/// The parent cgroup of one container.
#[derive(Debug)]
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
}
