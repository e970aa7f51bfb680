//! Per-run cgroups: memory and process limits, OOM detection, and the authoritative
//! "kill everything of this run" (a cgroup cannot be escaped by `setsid` or double forks).
//!
//! One [`CgroupManager`] trait, two implementations: v2 (a delegated unified hierarchy whose
//! own cgroup already enables `memory` and `pids` for its children) and v1 (separate `memory`
//! and `pids` hierarchies, as on the dev/CI machines). Each run gets a child of the server's own
//! cgroup (from `/proc/self/cgroup`), joined by the child before exec, torn down after the run.
//! Everything takes a root path, so tests run against a tempdir with fixture files.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::Limits;
use crate::cpu_share::CpuWeight;
use crate::error::CgroupError;

/// What a run's cgroup counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CgroupStats {
    /// OOM kills inside the cgroup.
    pub(crate) oom_kills: u64,
    /// Peak memory charged (v1 `memory.max_usage_in_bytes`, v2 `memory.peak`).
    pub(crate) peak_memory_bytes: Option<u64>,
    /// CPU time in microseconds (v2 `cpu.stat` `usage_usec`; v1's `cpu` controller has none).
    pub(crate) cpu_usec: Option<u64>,
    /// Forks refused at `pids.max` (`pids.events` `max`).
    pub(crate) pids_max_hits: Option<u64>,
}

/// The number in a one-value file.
fn number(path: &Path) -> Option<u64> {
    fs_err::read_to_string(path).ok()?.trim().parse().ok()
}

/// One run's cgroup(s), whatever the version.
pub(crate) trait CgroupManager: Send + Sync + std::fmt::Debug {
    /// The `cgroup.procs` files a process writes `0` into to join (before exec).
    fn procs_files(&self) -> Vec<PathBuf>;
    /// Add a host pid from outside (for callers that adopt an already running process; the
    /// runs here join from inside, before exec, through [`CgroupManager::procs_files`]).
    #[allow(dead_code)]
    fn add_task(&self, pid: i32) -> Result<(), CgroupError>;
    /// Write the limits.
    fn apply(&self, limits: &Limits) -> Result<(), CgroupError>;
    /// Pids currently in the cgroup(s).
    fn pids(&self) -> Vec<i32>;
    /// Counters.
    fn stats(&self) -> CgroupStats;
    /// OOM kills so far: one counter, read alone (a run's end asks for it first).
    fn oom_kills(&self) -> u64;
    /// SIGKILL everything in it (`cgroup.kill` where the kernel has it), until it is empty.
    fn kill(&self);
    /// SIGKILL everything in it now, without waiting for it to go.
    fn kill_once(&self);
    /// The file that sets its CPU weight against the other run cgroups; `None` where the
    /// cpu controller is not ours.
    fn cpu_knob(&self) -> Option<CpuKnob>;
    /// Kill, then remove the directories, retrying while processes are exiting.
    fn remove(&self) -> Result<(), CgroupError>;
    /// Whether it limits memory / processes.
    fn limits(&self) -> (bool, bool);
}

fn read(path: &Path) -> Result<String, CgroupError> {
    fs_err::read_to_string(path).map_err(|e| CgroupError::Read {
        path: path.to_path_buf(),
        source: e,
    })
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    fs_err::write(path, value).map_err(|e| CgroupError::Write {
        path: path.to_path_buf(),
        value: value.into(),
        source: e,
    })
}

/// The pids of a `cgroup.procs` file: positive ones only. The kernel writes 0 for a process
/// whose pid the reader cannot see (one exiting while the file is read), and a 0 or a
/// negative pid given to kill(2) signals the caller's whole process group or every process
/// it may signal: the server, and whatever started it.
fn parse_pids(text: &str) -> Vec<i32> {
    text.lines()
        .filter_map(|l| l.trim().parse().ok())
        .filter(|&pid: &i32| pid > 0)
        .collect()
}

/// The value of `key` in a flat keyed file (`memory.events`, `memory.oom_control`).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next()? == key)
            .then(|| it.next()?.parse().ok())
            .flatten()
    })
}

/// The file that sets one run cgroup's CPU weight against its siblings (cgroup v1
/// `cpu.shares`, v2 `cpu.weight`), written by [`CpuKnob::write`] in either's units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CpuKnob {
    file: PathBuf,
    v2: bool,
}

/// cgroup v1 `cpu.shares` bounds, and v2 `cpu.weight` bounds and default.
const V1_SHARES_MAX: u32 = 262_144;
const V2_WEIGHT_MAX: u32 = 10_000;
const V2_WEIGHT_DEFAULT: u32 = 100;

impl CpuKnob {
    /// The `cpu.shares` of the cgroup v1 directory `dir`.
    pub(crate) fn v1(dir: &Path) -> CpuKnob {
        CpuKnob {
            file: dir.join("cpu.shares"),
            v2: false,
        }
    }

    /// The `cpu.weight` of the cgroup v2 directory `dir`.
    pub(crate) fn v2(dir: &Path) -> CpuKnob {
        CpuKnob {
            file: dir.join("cpu.weight"),
            v2: true,
        }
    }

    /// What the file is given for `weight`: v1 shares as they are, v2 the same fraction of
    /// its default (1024 shares are weight 100, 64 are 6), each within the kernel's bounds.
    fn value(&self, weight: CpuWeight) -> u32 {
        let shares = weight.shares();
        if self.v2 {
            let scaled = u64::from(shares) * u64::from(V2_WEIGHT_DEFAULT)
                / u64::from(CpuWeight::DEFAULT.shares());
            u32::try_from(scaled)
                .unwrap_or(V2_WEIGHT_MAX)
                .clamp(1, V2_WEIGHT_MAX)
        } else {
            shares.clamp(CpuWeight::MIN.shares(), V1_SHARES_MAX)
        }
    }

    /// Give the cgroup `weight`.
    pub(crate) fn write(&self, weight: CpuWeight) -> Result<(), CgroupError> {
        write(&self.file, &self.value(weight).to_string())
    }
}

/// SIGKILL each of `pids`; never a pid that is not positive (see [`parse_pids`]).
pub(crate) fn sigkill_all(pids: &[i32]) {
    for &pid in pids.iter().filter(|&&pid| pid > 0) {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

fn kill_loop(mgr: &dyn CgroupManager) {
    // A fork bomb races each sweep; pids.max bounds how many there can be.
    for _ in 0..50 {
        let pids = mgr.pids();
        if pids.is_empty() {
            return;
        }
        sigkill_all(&pids);
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn rmdir_with_retries(dirs: &[PathBuf], mgr: &dyn CgroupManager) -> Result<(), CgroupError> {
    for dir in dirs {
        let mut last = None;
        for _ in 0..100 {
            match fs_err::remove_dir(dir) {
                Ok(()) => {
                    last = None;
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    last = None;
                    break;
                }
                // EBUSY: processes are still exiting. Anything else will not get better.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    last = Some(e);
                    mgr.kill();
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => {
                    last = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = last {
            return Err(CgroupError::Remove {
                path: dir.clone(),
                source: e,
            });
        }
    }
    Ok(())
}

/// cgroup v1: a memory, a pids and/or a cpu directory.
#[derive(Debug)]
pub(crate) struct V1 {
    memory: Option<PathBuf>,
    pids: Option<PathBuf>,
    cpu: Option<PathBuf>,
}

impl V1 {
    fn dirs(&self) -> Vec<PathBuf> {
        self.memory
            .iter()
            .chain(self.pids.iter())
            .chain(self.cpu.iter())
            .cloned()
            .collect()
    }
}

/// CFS period used for CPU bandwidth (the kernel's default, 100 ms).
const CFS_PERIOD_US: u64 = 100_000;

/// Quota per period for `millicores` thousandths of a core.
fn cfs_quota_us(millicores: u64) -> u64 {
    (millicores.saturating_mul(CFS_PERIOD_US) / 1000).max(1000)
}

impl CgroupManager for V1 {
    fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs()
            .into_iter()
            .map(|d| d.join("cgroup.procs"))
            .collect()
    }
    fn add_task(&self, pid: i32) -> Result<(), CgroupError> {
        self.procs_files()
            .iter()
            .try_for_each(|f| write(f, &pid.to_string()))
    }
    fn apply(&self, limits: &Limits) -> Result<(), CgroupError> {
        if let (Some(dir), Some(bytes)) = (&self.memory, limits.memory_bytes) {
            write(&dir.join("memory.limit_in_bytes"), &bytes.to_string())?;
            // With swap accounting, memory + swap is capped at the same value: no swap use.
            // Must follow limit_in_bytes (the kernel requires memsw >= limit).
            let memsw = dir.join("memory.memsw.limit_in_bytes");
            if memsw.exists() {
                write(&memsw, &bytes.to_string())?;
            }
        }
        if let (Some(dir), Some(n)) = (&self.pids, limits.max_processes) {
            write(&dir.join("pids.max"), &n.to_string())?;
        }
        if let (Some(dir), Some(millicores)) = (&self.cpu, limits.cpu_millicores) {
            write(&dir.join("cpu.cfs_period_us"), &CFS_PERIOD_US.to_string())?;
            write(
                &dir.join("cpu.cfs_quota_us"),
                &cfs_quota_us(millicores).to_string(),
            )?;
        }
        Ok(())
    }
    fn pids(&self) -> Vec<i32> {
        // Every process joins the hierarchies in the order of `procs_files` (the sandbox's
        // child, a forked run's pid 1) and its children are born in all of them, so the
        // first one holds every process that is in any: one read, not three (each a
        // cgroup v1 pid list the kernel builds and sorts).
        self.procs_files()
            .first()
            .and_then(|f| fs_err::read_to_string(f).ok())
            .map(|t| parse_pids(&t))
            .unwrap_or_default()
    }
    fn oom_kills(&self) -> u64 {
        self.memory
            .as_ref()
            .and_then(|d| fs_err::read_to_string(d.join("memory.oom_control")).ok())
            .and_then(|t| keyed(&t, "oom_kill"))
            .unwrap_or(0)
    }
    fn stats(&self) -> CgroupStats {
        CgroupStats {
            oom_kills: self.oom_kills(),
            peak_memory_bytes: self
                .memory
                .as_ref()
                .and_then(|d| number(&d.join("memory.max_usage_in_bytes"))),
            cpu_usec: None,
            pids_max_hits: self
                .pids
                .as_ref()
                .and_then(|d| fs_err::read_to_string(d.join("pids.events")).ok())
                .and_then(|t| keyed(&t, "max")),
        }
    }
    fn kill(&self) {
        kill_loop(self);
    }
    fn kill_once(&self) {
        sigkill_all(&self.pids());
    }
    fn cpu_knob(&self) -> Option<CpuKnob> {
        self.cpu.as_deref().map(CpuKnob::v1)
    }
    fn remove(&self) -> Result<(), CgroupError> {
        self.kill();
        rmdir_with_retries(&self.dirs(), self)
    }
    fn limits(&self) -> (bool, bool) {
        (self.memory.is_some(), self.pids.is_some())
    }
}

/// cgroup v2: one directory.
#[derive(Debug)]
pub(crate) struct V2 {
    dir: PathBuf,
}

impl CgroupManager for V2 {
    fn procs_files(&self) -> Vec<PathBuf> {
        vec![self.dir.join("cgroup.procs")]
    }
    fn add_task(&self, pid: i32) -> Result<(), CgroupError> {
        write(&self.dir.join("cgroup.procs"), &pid.to_string())
    }
    fn apply(&self, limits: &Limits) -> Result<(), CgroupError> {
        if let Some(bytes) = limits.memory_bytes {
            write(&self.dir.join("memory.max"), &bytes.to_string())?;
            if self.dir.join("memory.swap.max").exists() {
                write(&self.dir.join("memory.swap.max"), "0")?;
            }
            // Kill the whole run on OOM, not just the biggest process.
            write(&self.dir.join("memory.oom.group"), "1")?;
        }
        if let Some(n) = limits.max_processes {
            write(&self.dir.join("pids.max"), &n.to_string())?;
        }
        // cpu.max exists only where the cpu controller is delegated too.
        if let Some(millicores) = limits.cpu_millicores
            && self.dir.join("cpu.max").exists()
        {
            write(
                &self.dir.join("cpu.max"),
                &format!("{} {CFS_PERIOD_US}", cfs_quota_us(millicores)),
            )?;
        }
        Ok(())
    }
    fn pids(&self) -> Vec<i32> {
        fs_err::read_to_string(self.dir.join("cgroup.procs"))
            .map(|t| parse_pids(&t))
            .unwrap_or_default()
    }
    fn oom_kills(&self) -> u64 {
        fs_err::read_to_string(self.dir.join("memory.events"))
            .ok()
            .and_then(|t| keyed(&t, "oom_kill"))
            .unwrap_or(0)
    }
    fn stats(&self) -> CgroupStats {
        CgroupStats {
            oom_kills: self.oom_kills(),
            peak_memory_bytes: number(&self.dir.join("memory.peak")),
            cpu_usec: fs_err::read_to_string(self.dir.join("cpu.stat"))
                .ok()
                .and_then(|t| keyed(&t, "usage_usec")),
            pids_max_hits: fs_err::read_to_string(self.dir.join("pids.events"))
                .ok()
                .and_then(|t| keyed(&t, "max")),
        }
    }
    fn kill(&self) {
        // cgroup.kill (Linux 5.14) kills atomically, forks included; fall back to a sweep.
        let _ = fs_err::write(self.dir.join("cgroup.kill"), "1");
        kill_loop(self);
    }
    fn kill_once(&self) {
        if fs_err::write(self.dir.join("cgroup.kill"), "1").is_err() {
            sigkill_all(&self.pids());
        }
    }
    fn cpu_knob(&self) -> Option<CpuKnob> {
        // cpu.weight exists only where the cpu controller is delegated too.
        self.dir
            .join("cpu.weight")
            .exists()
            .then(|| CpuKnob::v2(&self.dir))
    }
    fn remove(&self) -> Result<(), CgroupError> {
        self.kill();
        rmdir_with_retries(std::slice::from_ref(&self.dir), self)
    }
    fn limits(&self) -> (bool, bool) {
        (true, true)
    }
}

/// One mounted cgroup hierarchy from `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupMount {
    /// `cgroup` or `cgroup2`.
    pub(crate) fstype: String,
    /// Where it is mounted.
    pub(crate) mount_point: PathBuf,
    /// The mount's root inside the hierarchy.
    pub(crate) root: String,
    /// Super options (v1 controllers appear here).
    pub(crate) options: Vec<String>,
}

/// Parse the cgroup lines of `/proc/self/mountinfo`.
pub(crate) fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let l: Vec<&str> = left.split_whitespace().collect();
            let r: Vec<&str> = right.split_whitespace().collect();
            let fstype = *r.first()?;
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            Some(CgroupMount {
                fstype: fstype.into(),
                mount_point: PathBuf::from(unescape(l.get(4)?)),
                root: unescape(l.get(3)?),
                options: r
                    .get(2)
                    .map(|o| o.split(',').map(String::from).collect())
                    .unwrap_or_default(),
            })
        })
        .collect()
}

fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// Our cgroup path for a v1 controller (`memory`) or v2 (`""`), from `/proc/self/cgroup`.
pub(crate) fn own_path(proc_self_cgroup: &str, controller: &str) -> Option<String> {
    proc_self_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let _id = parts.next()?;
        let controllers = parts.next()?;
        let path = parts.next()?;
        let matches = if controller.is_empty() {
            controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == controller)
        };
        matches.then(|| path.to_string())
    })
}

fn join_hierarchy(mount: &CgroupMount, path: &str) -> PathBuf {
    let rel = path
        .strip_prefix(mount.root.trim_end_matches('/'))
        .unwrap_or(path);
    mount.mount_point.join(rel.trim_start_matches('/'))
}

/// Why our own cgroup v2 cannot be divided into run cgroups (see [`v2_parent`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undelegated {
    /// The server runs as root and systemd did not mark the cgroup as delegated
    /// (`trusted.delegate`, set for units with `Delegate=yes` since systemd 251): it is
    /// systemd's to manage.
    NotMarked,
    /// The server runs as a normal user who does not own the cgroup.
    NotOwned,
    /// Other processes share the cgroup (a terminal's, a desktop's or an IDE's scope), so its
    /// controllers cannot be handed to children ("no internal processes").
    Shared {
        /// How many.
        others: usize,
    },
    /// The cgroup is not offered a controller runs need.
    ControllerMissing {
        /// `memory` or `pids`.
        controller: &'static str,
    },
    /// Enabling the controllers for its children failed; the server moved back where it was.
    Refused {
        /// What the kernel said.
        detail: String,
    },
}

impl std::fmt::Display for Undelegated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotMarked => f.write_str("the server runs as root and systemd did not mark it delegated (no `trusted.delegate`)"),
            Self::NotOwned => f.write_str("it belongs to another user"),
            Self::Shared { others } => write!(f, "{others} other process(es) share it"),
            Self::ControllerMissing { controller } => write!(f, "it is not offered the `{controller}` controller"),
            Self::Refused { detail } => write!(f, "enabling its controllers for runs failed ({detail})"),
        }
    }
}

/// The value of the extended attribute `name` of `path`, if it has one.
fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let name = std::ffi::CString::new(name).ok()?;
    let mut buf = [0u8; 16];
    // SAFETY: both strings are NUL-terminated; the kernel writes at most `buf.len()` bytes.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    let n = usize::try_from(n).ok()?;
    Some(buf[..n.min(buf.len())].to_vec())
}

/// Whether systemd marked `dir` as a delegated unit's cgroup: `trusted.delegate` (systemd
/// 251 and later, for a unit with `Delegate=yes`; readable by root only) or `user.delegate`
/// (252 and later sets it too, on the system manager's units).
fn systemd_marked(dir: &Path) -> bool {
    ["trusted.delegate", "user.delegate"]
        .into_iter()
        .any(|name| xattr(dir, name).is_some_and(|v| v == b"1"))
}

/// Whether the normal user `euid` owns `dir`'s files that dividing it writes.
fn owned_by(dir: &Path, euid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    ["cgroup.subtree_control", "cgroup.procs"]
        .into_iter()
        .all(|file| fs_err::metadata(dir.join(file)).is_ok_and(|m| m.uid() == euid))
}

/// Decide whether our own v2 cgroup `dir` can be the parent of run cgroups, and make it so.
///
/// It can when its `memory` and `pids` are handed to children already, or when it was
/// delegated to the server and the server can hand them over itself. Delegated means: for
/// root, marked so by systemd (owning proves nothing to root: a service's cgroup without
/// `Delegate=yes` is systemd's to manage); for a normal user, owned by that user (systemd 252
/// marks nothing in the user manager's units, so `Delegate=yes` and a plain scope look the
/// same) — and in both cases the server is the cgroup's only process, and enabling the
/// controllers works. The server then lives in a leaf of its own, `snakebox-server`
/// ([`enable_delegated`]); when enabling fails it moves back, so nothing of ours is left in a
/// cgroup we cannot use.
pub(crate) fn v2_parent(dir: &Path, pid: u32, euid: u32) -> Result<PathBuf, CgroupError> {
    let words = |file: &str| -> Result<Vec<String>, CgroupError> {
        Ok(read(&dir.join(file))?
            .split_whitespace()
            .map(String::from)
            .collect())
    };
    let has = |list: &[String], c: &str| list.iter().any(|w| w == c);
    let enabled = words("cgroup.subtree_control")?;
    if has(&enabled, "memory") && has(&enabled, "pids") {
        return Ok(dir.to_path_buf());
    }
    let refuse = |why: Undelegated| CgroupError::NotDelegated {
        path: dir.to_path_buf(),
        root: euid == 0,
        why,
    };
    let offered = words("cgroup.controllers")?;
    if let Some(controller) = ["memory", "pids"].into_iter().find(|c| !has(&offered, c)) {
        return Err(refuse(Undelegated::ControllerMissing { controller }));
    }
    if euid == 0 && !systemd_marked(dir) {
        return Err(refuse(Undelegated::NotMarked));
    }
    if euid != 0 && !owned_by(dir, euid) {
        return Err(refuse(Undelegated::NotOwned));
    }
    let others = parse_pids(&read(&dir.join("cgroup.procs"))?)
        .into_iter()
        .filter(|&p| u32::try_from(p).ok() != Some(pid))
        .count();
    if others > 0 {
        return Err(refuse(Undelegated::Shared { others }));
    }
    enable_delegated(dir, pid).map_err(|e| {
        refuse(Undelegated::Refused {
            detail: std::error::Error::source(&e)
                .map_or_else(|| e.to_string(), |s| format!("{e}: {s}")),
        })
    })?;
    Ok(dir.to_path_buf())
}

/// Hand the memory and pids controllers (and cpu, when offered) of a delegated cgroup `dir`
/// to its children. cgroup v2 allows that only while `dir` itself holds no process ("no
/// internal processes"), so the server (`pid`) first moves itself into a leaf of its own,
/// `snakebox-server`; run cgroups are then made beside it. When the controllers cannot be
/// enabled, the server moves back into `dir` and the leaf goes, as if nothing had been tried.
pub(crate) fn enable_delegated(dir: &Path, pid: u32) -> Result<(), CgroupError> {
    let controllers = read(&dir.join("cgroup.controllers"))?;
    let offered: Vec<&str> = controllers.split_whitespace().collect();
    for needed in ["memory", "pids"] {
        if !offered.contains(&needed) {
            return Err(CgroupError::NotFound {
                controller: needed.into(),
            });
        }
    }
    let leaf = dir.join("snakebox-server");
    if let Err(source) = fs_err::create_dir(&leaf)
        && source.kind() != std::io::ErrorKind::AlreadyExists
    {
        return Err(CgroupError::Create { path: leaf, source });
    }
    let undo = || {
        let _ = write(&dir.join("cgroup.procs"), &pid.to_string());
        let _ = fs_err::remove_dir(&leaf);
    };
    if let Err(e) = write(&leaf.join("cgroup.procs"), &pid.to_string()) {
        undo();
        return Err(e);
    }
    let subtree = dir.join("cgroup.subtree_control");
    if offered.contains(&"cpu") && write(&subtree, "+memory +pids +cpu").is_ok() {
        return Ok(());
    }
    write(&subtree, "+memory +pids").inspect_err(|_| undo())
}

/// Names of the host-work CPU cgroups (`snakebox-host-<server pid>-<instance>`): not a run
/// cgroup's (`snakebox-<pid>-…`), so that removing a server's run cgroups, which kills what
/// is in them, never touches the one that holds the server's own threads.
const HOST_WORK_PREFIX: &str = "snakebox-host-";

/// The server pid a cgroup named `<prefix><pid>-…` belongs to (run cgroups and host-work
/// cgroups alike), if `name` is one.
fn server_pid(name: &std::ffi::OsStr, prefix: &str) -> Option<u32> {
    name.to_str()?
        .strip_prefix(prefix)?
        .split('-')
        .next()?
        .parse()
        .ok()
}

/// This server's host-work cgroup under the cpu hierarchy's `parent`.
fn host_work_dir(parent: &Path) -> PathBuf {
    parent.join(format!(
        "{HOST_WORK_PREFIX}{}-{:x}",
        std::process::id(),
        instance()
    ))
}

/// A CPU cgroup of the server's own, beside its run cgroups, that the host-work threads join
/// (cgroup v1 allows single threads of a process in a cpu cgroup): with the weight
/// [`CpuWeight::HOST_WORK`], the work the server does on the host for callers yields the CPU
/// to the sandboxes' work and to the server's other threads, whoever queued it.
///
/// Why not niceness: the kernel orders threads by niceness only within one scheduling group
/// (a cgroup, or an autogroup: every session in the root cgroup is one where
/// `kernel.sched_autogroup_enabled` is 1, as on Debian), so host-work threads at niceness 5
/// still weighed as the server's whole group against a run's cgroup (measured in
/// BENCHMARKS.md, issue 32).
#[derive(Debug)]
pub struct HostWorkGroup {
    dir: PathBuf,
}

impl HostWorkGroup {
    /// Move the calling thread (only it) into this cgroup.
    ///
    /// # Errors
    /// When the kernel refuses the move (the cgroup was removed, say).
    pub fn join_this_thread(&self) -> Result<(), CgroupError> {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        write(&self.dir.join("tasks"), &tid.to_string())
    }

    /// Where it is (for the report).
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

/// The parent directories new run cgroups are created in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CgroupSet {
    /// Delegated unified hierarchy.
    V2 {
        /// Our own cgroup directory.
        parent: PathBuf,
    },
    /// Legacy hierarchies (any may be missing).
    V1 {
        /// Our memory cgroup directory.
        memory: Option<PathBuf>,
        /// Our pids cgroup directory.
        pids: Option<PathBuf>,
        /// Our cpu cgroup directory (bandwidth and fair sharing between runs).
        cpu: Option<PathBuf>,
    },
}

static RUN_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A number fixed for this process's life that a later process with the same pid will not
/// have: the time this process first asked for it.
fn instance() -> u64 {
    static INSTANCE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *INSTANCE.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| {
                u64::try_from(d.as_nanos() & u128::from(u64::MAX)).unwrap_or(0)
            })
    })
}

impl CgroupSet {
    /// Detect on this host.
    pub(crate) fn detect() -> Result<Self, CgroupError> {
        let cg = read(Path::new("/proc/self/cgroup"))?;
        let mi = read(Path::new("/proc/self/mountinfo"))?;
        let mut set = Self::from_host_files(&cg, &mi)?;
        set.check_writable()?;
        set.remove_stale();
        Ok(set)
    }

    /// Decide from the contents of `/proc/self/cgroup` and `/proc/self/mountinfo` (the paths
    /// they name are read for `cgroup.controllers` and `cgroup.subtree_control`).
    pub(crate) fn from_host_files(
        proc_self_cgroup: &str,
        mountinfo: &str,
    ) -> Result<Self, CgroupError> {
        let mounts = parse_mountinfo(mountinfo);
        // v2 first (see v2_parent); why it is not usable is the answer when v1 is absent too.
        let mut v2_refusal = None;
        if let (Some(m), Some(path)) = (
            mounts.iter().find(|m| m.fstype == "cgroup2"),
            own_path(proc_self_cgroup, ""),
        ) {
            let dir = join_hierarchy(m, &path);
            // SAFETY: geteuid has no preconditions.
            let euid = unsafe { libc::geteuid() };
            match v2_parent(&dir, std::process::id(), euid) {
                Ok(parent) => return Ok(Self::V2 { parent }),
                // A hybrid host's unified hierarchy (this one's v1 machines) offers nothing.
                Err(CgroupError::NotDelegated {
                    why: Undelegated::ControllerMissing { .. },
                    ..
                }) if mounts.iter().any(|m| m.fstype == "cgroup") => {}
                Err(e) => v2_refusal = Some(e),
            }
        }
        let v1 = |controller: &str| -> Option<PathBuf> {
            let m = mounts
                .iter()
                .find(|m| m.fstype == "cgroup" && m.options.iter().any(|o| o == controller))?;
            let path = own_path(proc_self_cgroup, controller)?;
            Some(join_hierarchy(m, &path))
        };
        let (memory, pids) = (v1("memory"), v1("pids"));
        if memory.is_none() && pids.is_none() {
            return Err(v2_refusal.unwrap_or(CgroupError::NotFound {
                controller: "memory or pids".into(),
            }));
        }
        Ok(Self::V1 {
            memory,
            pids,
            cpu: v1("cpu"),
        })
    }

    /// Every run cgroup of any server under our parents (`snakebox-<server pid>-…`), with the
    /// pid of the server that made it.
    fn run_cgroups(&self) -> Vec<(u32, PathBuf)> {
        let parents: Vec<&PathBuf> = match self {
            Self::V2 { parent } => vec![parent],
            Self::V1 { memory, pids, cpu } => {
                memory.iter().chain(pids.iter()).chain(cpu.iter()).collect()
            }
        };
        parents
            .into_iter()
            .filter_map(|parent| fs_err::read_dir(parent).ok())
            .flat_map(|entries| entries.filter_map(Result::ok))
            .filter_map(|entry| {
                let pid = server_pid(&entry.file_name(), "snakebox-")?;
                Some((pid, entry.path()))
            })
            .collect()
    }

    /// Remove the empty run cgroups that servers no longer alive left behind (killed before they
    /// could clean up). Best effort: a cgroup that still holds processes is left alone.
    fn remove_stale(&self) {
        if let Self::V1 { cpu: Some(cpu), .. } = self
            && let Ok(entries) = fs_err::read_dir(cpu)
        {
            for entry in entries.filter_map(Result::ok) {
                let pid = server_pid(&entry.file_name(), HOST_WORK_PREFIX);
                if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
                    let _ = fs_err::remove_dir(entry.path());
                }
            }
        }
        for (pid, dir) in self.run_cgroups() {
            if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = fs_err::remove_dir(dir);
            }
        }
    }

    /// Kill what is left in this server's run cgroups and remove them (at shutdown, after its
    /// runs ended; a run cut short by a deadline may still hold processes). Best effort,
    /// bounded: each directory is retried for at most a second while the kernel reaps.
    pub(crate) fn remove_own(&self) {
        // The host-work cgroup holds the server's own threads: they move back to the parent
        // (never killed) and the cgroup goes.
        if let Self::V1 { cpu: Some(cpu), .. } = self {
            let dir = host_work_dir(cpu);
            let tasks = fs_err::read_to_string(dir.join("tasks")).unwrap_or_default();
            for tid in parse_pids(&tasks) {
                let _ = write(&cpu.join("tasks"), &tid.to_string());
            }
            let _ = fs_err::remove_dir(&dir);
        }
        let own = self
            .run_cgroups()
            .into_iter()
            .filter(|(pid, _)| *pid == std::process::id());
        for (_, dir) in own {
            for _ in 0..20 {
                let procs = fs_err::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                for pid in parse_pids(&procs) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                if fs_err::remove_dir(&dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    }

    /// Prove we can create (and remove) a child in each parent. The cpu hierarchy is optional:
    /// where we cannot create a child there, CPU bandwidth is reported as not enforced.
    fn check_writable(&mut self) -> Result<(), CgroupError> {
        let probe = |parent: &Path| -> Result<(), CgroupError> {
            let dir = parent.join(format!("snakebox-probe-{}", std::process::id()));
            fs_err::create_dir(&dir).map_err(|e| CgroupError::Create {
                path: dir.clone(),
                source: e,
            })?;
            let _ = fs_err::remove_dir(&dir);
            Ok(())
        };
        match self {
            Self::V2 { parent } => probe(parent),
            Self::V1 { memory, pids, cpu } => {
                if cpu.as_deref().is_some_and(|p| probe(p).is_err()) {
                    *cpu = None;
                }
                memory.iter().chain(pids.iter()).try_for_each(|p| probe(p))
            }
        }
    }

    /// Create and configure the cgroup(s) of one run.
    pub(crate) fn create_run(&self, limits: &Limits) -> Result<RunCgroup, CgroupError> {
        // The pid alone is not unique over time: a server killed before it removed its run
        // cgroups leaves them behind, and a later server may get the same pid.
        let name = format!(
            "snakebox-{}-{:x}-{}",
            std::process::id(),
            instance(),
            RUN_COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let mkdir = |parent: &Path| -> Result<PathBuf, CgroupError> {
            let dir = parent.join(&name);
            fs_err::create_dir(&dir).map_err(|e| CgroupError::Create {
                path: dir.clone(),
                source: e,
            })?;
            Ok(dir)
        };
        let manager: Box<dyn CgroupManager> = match self {
            Self::V2 { parent } => Box::new(V2 {
                dir: mkdir(parent)?,
            }),
            Self::V1 { memory, pids, cpu } => {
                let memory = memory.as_deref().map(mkdir).transpose()?;
                let pids = match pids.as_deref().map(mkdir).transpose() {
                    Ok(p) => p,
                    Err(e) => {
                        let _ = V1 {
                            memory,
                            pids: None,
                            cpu: None,
                        }
                        .remove();
                        return Err(e);
                    }
                };
                let cpu = match cpu.as_deref().map(mkdir).transpose() {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = V1 {
                            memory,
                            pids,
                            cpu: None,
                        }
                        .remove();
                        return Err(e);
                    }
                };
                Box::new(V1 { memory, pids, cpu })
            }
        };
        if let Err(e) = manager.apply(limits) {
            let _ = manager.remove();
            return Err(e);
        }
        Ok(RunCgroup { manager })
    }

    /// The CPU cgroup the server's host-work threads join, where there is a cgroup v1 cpu
    /// hierarchy to make it in: see [`HostWorkGroup`]. `None` elsewhere (cgroup v2, where
    /// threads of one process can be split only over a threaded subtree, is not done yet).
    pub(crate) fn host_work_group(&self) -> Option<HostWorkGroup> {
        let Self::V1 { cpu: Some(cpu), .. } = self else {
            return None;
        };
        let dir = host_work_dir(cpu);
        let made = match fs_err::create_dir(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(e),
        };
        let written = made.map_err(|source| CgroupError::Create {
            path: dir.clone(),
            source,
        });
        match written.and_then(|()| CpuKnob::v1(&dir).write(CpuWeight::HOST_WORK)) {
            Ok(()) => Some(HostWorkGroup { dir }),
            Err(err) => {
                tracing::warn!(%err, "no CPU cgroup for the host-work threads: they weigh as the server's own");
                let _ = fs_err::remove_dir(&dir);
                None
            }
        }
    }

    /// For the backend report.
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::V2 { parent } => format!("cgroup v2 (delegated) under {}", parent.display()),
            Self::V1 { memory, pids, cpu } => format!(
                "cgroup v1: memory {}, pids {}, cpu {}",
                memory
                    .as_ref()
                    .map_or("unavailable".into(), |p| p.display().to_string()),
                pids.as_ref()
                    .map_or("unavailable".into(), |p| p.display().to_string()),
                cpu.as_ref()
                    .map_or("unavailable".into(), |p| p.display().to_string()),
            ),
        }
    }

    /// The memory mechanism, if cgroups handle it.
    pub(crate) fn memory_mechanism(&self) -> Option<String> {
        match self {
            Self::V2 { .. } => Some("cgroup v2 memory.max + memory.swap.max=0 + memory.oom.group".into()),
            Self::V1 { memory: Some(_), .. } => {
                Some("cgroup v1 memory.limit_in_bytes + memory.memsw.limit_in_bytes (OOM from memory.oom_control)".into())
            }
            Self::V1 { memory: None, .. } => None,
        }
    }

    /// Whether run cgroups of a v2 `parent` have the cpu controller.
    fn v2_cpu(parent: &Path) -> bool {
        parent.join("cpu.max").exists()
            || fs_err::read_to_string(parent.join("cgroup.subtree_control"))
                .is_ok_and(|t| t.split_whitespace().any(|c| c == "cpu"))
    }

    /// The CPU-bandwidth mechanism, if cgroups handle it.
    pub(crate) fn cpu_mechanism(&self) -> Option<String> {
        match self {
            Self::V2 { parent } if Self::v2_cpu(parent) => {
                Some("cgroup v2 cpu.max per run".into())
            }
            Self::V1 { cpu: Some(_), .. } => Some(
                "cgroup v1 cpu.cfs_quota_us per run (and a cpu cgroup per run: fair sharing by run, not by thread)".into(),
            ),
            _ => None,
        }
    }

    /// How a run's CPU weight against the others is set ([`crate::CpuShare`]), if cgroups
    /// handle it.
    pub(crate) fn cpu_weight_mechanism(&self) -> Option<String> {
        const HOW: &str = "of each run cgroup, from the CPU share of whoever holds its slot, rewritten when that changes; a session's interpreter between calls and a pre-forked child before its run at the background weight (1/16 of the default)";
        match self {
            Self::V2 { parent } if Self::v2_cpu(parent) => {
                Some(format!("cgroup v2 cpu.weight {HOW}"))
            }
            Self::V1 { cpu: Some(_), .. } => Some(format!(
                "cgroup v1 cpu.shares {HOW}; the server's host-work threads together in a cpu cgroup of their own at a quarter of the default"
            )),
            _ => None,
        }
    }

    /// The process-count mechanism, if cgroups handle it.
    pub(crate) fn pids_mechanism(&self) -> Option<String> {
        match self {
            Self::V2 { .. } => Some("cgroup v2 pids.max".into()),
            Self::V1 { pids: Some(_), .. } => Some("cgroup v1 pids.max".into()),
            Self::V1 { pids: None, .. } => None,
        }
    }
}

/// The cgroup(s) of one run; removed by [`RunCgroup::remove`] (and on drop, as a backstop).
#[derive(Debug)]
pub(crate) struct RunCgroup {
    manager: Box<dyn CgroupManager>,
}

impl RunCgroup {
    /// `cgroup.procs` files to join before exec.
    pub(crate) fn procs_files(&self) -> Vec<PathBuf> {
        self.manager.procs_files()
    }
    /// Whether memory is limited here (else the supervisor's watchdog stands in).
    pub(crate) fn limits_memory(&self) -> bool {
        self.manager.limits().0
    }
    /// Whether processes are limited here (else RLIMIT_NPROC stands in: on the run's host uid,
    /// or set inside its user namespace for a normal user's server).
    pub(crate) fn limits_pids(&self) -> bool {
        self.manager.limits().1
    }
    /// SIGKILL everything in the run's cgroup(s), until they are empty.
    pub(crate) fn kill_all(&self) {
        self.manager.kill();
    }
    /// SIGKILL everything in the run's cgroup(s) once, without waiting for it to go.
    pub(crate) fn kill_once(&self) {
        self.manager.kill_once();
    }
    /// Give the run's processes a small share of the CPU against others that want it
    /// (`background`: [`CpuWeight::BACKGROUND`], work that may wait, such as a sandbox made
    /// before its run), or the default share again. Nothing where the cpu controller is not
    /// ours.
    pub(crate) fn set_background(&self, background: bool) -> Result<(), CgroupError> {
        match self.manager.cpu_knob() {
            Some(knob) => knob.write(if background {
                CpuWeight::BACKGROUND
            } else {
                CpuWeight::DEFAULT
            }),
            None => Ok(()),
        }
    }
    /// The file that sets the run's CPU weight, to attach to a [`crate::CpuShare`]; `None`
    /// where the cpu controller is not ours.
    pub(crate) fn cpu_knob(&self) -> Option<CpuKnob> {
        self.manager.cpu_knob()
    }
    /// Whether the kernel OOM-killed something in the run.
    pub(crate) fn oom_killed(&self) -> bool {
        self.manager.oom_kills() > 0
    }
    /// What the run used so far (read before the cgroup is removed).
    pub(crate) fn usage(&self) -> crate::ResourceUsage {
        let stats = self.manager.stats();
        crate::ResourceUsage {
            peak_memory_bytes: stats.peak_memory_bytes.filter(|&bytes| bytes > 0),
            cpu_time_ms: stats.cpu_usec.map(|usec| usec / 1000),
            process_limit_hits: stats.pids_max_hits,
        }
    }
    /// Pids still inside.
    pub(crate) fn pids(&self) -> Vec<i32> {
        self.manager.pids()
    }
    /// Kill and remove; failures are logged (the directory is retried on drop).
    pub(crate) fn remove(&self) {
        if let Err(e) = self.manager.remove() {
            tracing::warn!(error = %e, "could not remove a run cgroup");
        }
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        let _ = self.manager.remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
31 25 0:27 / /sys/fs/cgroup/pids rw,relatime shared:10 - cgroup cgroup rw,pids
32 25 0:28 / /sys/fs/cgroup/unified rw,relatime shared:11 - cgroup2 cgroup2 rw
33 25 0:29 / /proc rw - proc proc rw
";
    const SELF_CGROUP: &str = "8:pids:/\n4:memory:/process_api/abc\n0::/\n";

    #[test]
    fn a_sweep_reads_and_kills_positive_pids_only() {
        assert_eq!(parse_pids("12\n0\n-1\n 7 \nx\n"), vec![12, 7]);
        // In a child of its own process group: were the 0 given to kill(2), the child would
        // SIGKILL itself (its group) instead of exiting.
        // SAFETY: fork in a test; the child calls only async-signal-safe functions and exits.
        let child = unsafe { libc::fork() };
        if child == 0 {
            unsafe {
                libc::setpgid(0, 0);
            }
            sigkill_all(&[0]);
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: reaps our own child.
        unsafe { libc::waitpid(child, &raw mut status, 0) };
        assert!(libc::WIFEXITED(status), "the child was killed: {status:#x}");
    }

    #[test]
    fn parses_v1_layout_like_the_dev_machines() {
        let set = CgroupSet::from_host_files(SELF_CGROUP, MOUNTINFO).unwrap();
        assert_eq!(
            set,
            CgroupSet::V1 {
                memory: Some("/sys/fs/cgroup/memory/process_api/abc".into()),
                pids: Some("/sys/fs/cgroup/pids".into()),
                cpu: None,
            }
        );
    }

    #[test]
    fn a_delegated_subtree_gets_a_server_leaf_and_its_controllers_enabled() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        fs_err::write(dir.join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        fs_err::write(dir.join("cgroup.subtree_control"), "").unwrap();
        enable_delegated(dir, 4242).unwrap();
        assert_eq!(
            fs_err::read_to_string(dir.join("snakebox-server/cgroup.procs")).unwrap(),
            "4242"
        );
        assert_eq!(
            fs_err::read_to_string(dir.join("cgroup.subtree_control")).unwrap(),
            "+memory +pids +cpu"
        );
        // Idempotent (a restarted server finds its leaf), and refused without memory.
        enable_delegated(dir, 4243).unwrap();
        fs_err::write(dir.join("cgroup.controllers"), "cpu pids\n").unwrap();
        assert!(matches!(
            enable_delegated(dir, 4244),
            Err(CgroupError::NotFound { controller }) if controller == "memory"
        ));
    }

    /// A fixture of a unit's v2 cgroup: offered `controllers`, nothing enabled, `procs` in it.
    fn unit_cgroup(controllers: &str, procs: &[u32]) -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        fs_err::write(tmp.path().join("cgroup.controllers"), controllers).unwrap();
        fs_err::write(tmp.path().join("cgroup.subtree_control"), "").unwrap();
        let procs: Vec<String> = procs.iter().map(u32::to_string).collect();
        fs_err::write(tmp.path().join("cgroup.procs"), procs.join("\n")).unwrap();
        tmp
    }

    fn mark_delegated(dir: &Path) -> bool {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
        // SAFETY: NUL-terminated strings and a one-byte value.
        unsafe {
            libc::setxattr(
                path.as_ptr(),
                c"trusted.delegate".as_ptr(),
                b"1".as_ptr().cast(),
                1,
                0,
            ) == 0
        }
    }

    fn why(result: Result<PathBuf, CgroupError>) -> Undelegated {
        match result {
            Err(CgroupError::NotDelegated { why, .. }) => why,
            other => panic!("expected NotDelegated, got {other:?}"),
        }
    }

    #[test]
    fn root_divides_only_a_cgroup_systemd_marked_delegated() {
        let unit = unit_cgroup("cpu memory pids\n", &[4242]);
        let dir = unit.path();
        // Owned by root and holding only the server, but not marked: systemd's, not ours.
        assert_eq!(why(v2_parent(dir, 4242, 0)), Undelegated::NotMarked);
        assert!(!dir.join("snakebox-server").exists());
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 || !mark_delegated(dir) {
            return; // trusted.* xattrs need root (and a file system that keeps them)
        }
        assert!(systemd_marked(dir));
        assert_eq!(v2_parent(dir, 4242, 0).unwrap(), dir);
        assert_eq!(
            fs_err::read_to_string(dir.join("snakebox-server/cgroup.procs")).unwrap(),
            "4242"
        );
        // Not offered memory: refused whoever asks, and the fix names it.
        let bare = unit_cgroup("cpu pids\n", &[4242]);
        assert_eq!(
            why(v2_parent(bare.path(), 4242, 0)),
            Undelegated::ControllerMissing {
                controller: "memory"
            }
        );
    }

    #[test]
    fn a_cgroup_shared_with_other_processes_is_left_as_it_was() {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        // A desktop terminal's scope: the user owns it, but the shell and the client are in it.
        let unit = unit_cgroup("cpu memory pids\n", &[4242, 100, 101]);
        let dir = unit.path();
        let result = v2_parent(dir, 4242, euid.max(1000));
        if euid == 0 {
            // (Root, pretending to be a user: the fixture is not owned by uid 1000.)
            assert_eq!(why(result), Undelegated::NotOwned);
            return;
        }
        assert_eq!(why(result), Undelegated::Shared { others: 2 });
        assert!(
            !dir.join("snakebox-server").exists(),
            "the server moved into a cgroup it cannot use"
        );
    }

    #[test]
    fn a_failed_enable_moves_the_server_back_and_removes_its_leaf() {
        let unit = unit_cgroup("memory pids\n", &[4242]);
        let dir = unit.path();
        // The kernel refuses `+memory +pids` (here: the file cannot be written at all).
        fs_err::remove_file(dir.join("cgroup.subtree_control")).unwrap();
        fs_err::create_dir(dir.join("cgroup.subtree_control")).unwrap();
        fs_err::write(dir.join("cgroup.procs"), "").unwrap();
        assert!(enable_delegated(dir, 4242).is_err());
        // Back where it was. (The leaf's removal is the real cgroupfs's: in this fixture the
        // leaf keeps the `cgroup.procs` file written into it; the guest stage checks it.)
        assert_eq!(
            fs_err::read_to_string(dir.join("cgroup.procs")).unwrap(),
            "4242"
        );
    }

    #[test]
    fn the_hint_fits_the_situation() {
        let hint = |path: &str, root: bool, why: Undelegated| {
            CgroupError::NotDelegated {
                path: path.into(),
                root,
                why,
            }
            .hint()
            .unwrap()
        };
        let root = hint(
            "/sys/fs/cgroup/system.slice/x.service",
            true,
            Undelegated::NotMarked,
        );
        assert!(
            root.contains("systemd-run --scope -p Delegate=yes"),
            "{root}"
        );
        assert!(root.contains("no fork server"), "{root}");
        let login = hint(
            "/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope",
            false,
            Undelegated::NotOwned,
        );
        assert!(
            login.contains("login session")
                && login.contains("systemd-run --user --scope -p Delegate=yes"),
            "{login}"
        );
        let desktop = hint(
            "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1.scope",
            false,
            Undelegated::Shared { others: 2 },
        );
        assert!(desktop.contains("shares its cgroup"), "{desktop}");
    }

    #[test]
    fn own_path_picks_the_right_line() {
        assert_eq!(
            own_path("2:cpu,cpuacct:/a\n4:memory:/m\n", "cpuacct").as_deref(),
            Some("/a")
        );
        assert_eq!(own_path(SELF_CGROUP, "").as_deref(), Some("/"));
        assert_eq!(own_path(SELF_CGROUP, "blkio"), None);
    }

    #[test]
    fn v2_is_chosen_when_memory_and_pids_are_handed_to_children_and_else_says_why() {
        let tmp = tempfile::tempdir().unwrap();
        let unified = tmp.path().join("unified");
        fs_err::create_dir_all(unified.join("svc")).unwrap();
        fs_err::write(unified.join("svc/cgroup.controllers"), "hugetlb\n").unwrap();
        fs_err::write(unified.join("svc/cgroup.subtree_control"), "hugetlb\n").unwrap();
        let mi = format!(
            "32 25 0:28 / {} rw - cgroup2 cgroup2 rw\n",
            unified.display()
        );
        let cg = "0::/svc\n";
        // A v2-only host: the answer is why v2 is not usable, not a v1 lookup's.
        assert!(matches!(
            CgroupSet::from_host_files(cg, &mi),
            Err(CgroupError::NotDelegated {
                why: Undelegated::ControllerMissing {
                    controller: "memory"
                },
                ..
            })
        ));
        fs_err::write(unified.join("svc/cgroup.subtree_control"), "memory pids\n").unwrap();
        assert_eq!(
            CgroupSet::from_host_files(cg, &mi).unwrap(),
            CgroupSet::V2 {
                parent: unified.join("svc")
            }
        );
    }

    #[test]
    fn v1_run_cgroup_writes_limits_and_reads_oom_in_a_fixture_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let set = CgroupSet::V1 {
            memory: Some(tmp.path().join("mem")),
            pids: Some(tmp.path().join("pids")),
            cpu: Some(tmp.path().join("cpu")),
        };
        fs_err::create_dir_all(tmp.path().join("mem")).unwrap();
        fs_err::create_dir_all(tmp.path().join("pids")).unwrap();
        fs_err::create_dir_all(tmp.path().join("cpu")).unwrap();
        let limits = Limits {
            wall_time: Duration::from_secs(1),
            cpu_time: None,
            memory_bytes: Some(1 << 28),
            max_processes: Some(32),
            max_output_bytes: 10,
            scratch_bytes: None,
            file_size_bytes: None,
            open_files: None,
            cpu_millicores: Some(1500),
        };
        // A fixture directory is not a cgroupfs: files appear when written; memsw absent.
        let run = set.create_run(&limits).unwrap();
        let files = run.procs_files();
        assert_eq!(files.len(), 3);
        let cpu_dir = files[2].parent().unwrap().to_path_buf();
        assert_eq!(
            fs_err::read_to_string(cpu_dir.join("cpu.cfs_quota_us")).unwrap(),
            "150000"
        );
        assert_eq!(
            fs_err::read_to_string(cpu_dir.join("cpu.cfs_period_us")).unwrap(),
            "100000"
        );
        let mem_dir = files[0].parent().unwrap().to_path_buf();
        let pids_dir = files[1].parent().unwrap().to_path_buf();
        assert_eq!(
            fs_err::read_to_string(mem_dir.join("memory.limit_in_bytes")).unwrap(),
            "268435456"
        );
        assert!(!mem_dir.join("memory.memsw.limit_in_bytes").exists());
        assert_eq!(
            fs_err::read_to_string(pids_dir.join("pids.max")).unwrap(),
            "32"
        );
        // Its CPU weight: the background one for a sandbox made before its run, the default
        // again, and a share's part through the same file.
        run.set_background(true).unwrap();
        assert_eq!(
            fs_err::read_to_string(cpu_dir.join("cpu.shares")).unwrap(),
            "64"
        );
        run.set_background(false).unwrap();
        assert_eq!(
            fs_err::read_to_string(cpu_dir.join("cpu.shares")).unwrap(),
            "1024"
        );
        let share = crate::CpuShare::new(CpuWeight::DEFAULT.divided(3));
        let _attached = share.attach(run.cpu_knob().unwrap(), None).unwrap();
        assert_eq!(
            fs_err::read_to_string(cpu_dir.join("cpu.shares")).unwrap(),
            "341"
        );
        assert!(!run.oom_killed());
        fs_err::write(
            mem_dir.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        )
        .unwrap();
        assert!(run.oom_killed());
        assert!(run.pids().is_empty());
        assert!(run.limits_memory() && run.limits_pids());
    }

    #[test]
    fn a_v2_run_cgroup_has_a_cpu_weight_only_where_the_cpu_controller_is_delegated() {
        let tmp = tempfile::tempdir().unwrap();
        let without = V2 {
            dir: tmp.path().to_path_buf(),
        };
        assert!(without.cpu_knob().is_none());
        fs_err::write(tmp.path().join("cpu.weight"), "100").unwrap();
        let knob = without.cpu_knob().unwrap();
        knob.write(CpuWeight::BACKGROUND).unwrap();
        assert_eq!(
            fs_err::read_to_string(tmp.path().join("cpu.weight")).unwrap(),
            "6"
        );
    }

    #[test]
    fn keyed_values() {
        assert_eq!(
            keyed("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n", "oom_kill"),
            Some(2)
        );
        assert_eq!(keyed("oom 1\n", "oom_kill"), None);
    }
}
