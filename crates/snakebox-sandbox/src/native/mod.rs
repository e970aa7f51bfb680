//! The `native` backend: bubblewrap namespaces + our seccomp program + cgroup or rlimit limits.
//!
//! **Host-side uid.** When the server runs as root, bwrap itself is started as host uid/gid
//! 65534 (setgroups/setresgid/setresuid in `pre_exec`), and bwrap maps sandbox uid 65534 to it.
//! So the user's code is unprivileged on the host as well as inside: a sandbox escape lands on
//! `nobody`, not on root with a user namespace around it. (The alternative, bwrap as root with
//! `--uid 65534`, maps the sandbox user to host uid 0; an escape would then read any root-owned
//! file.) An unprivileged bwrap cannot reach paths under `/root` (mode 700), and bwrap 0.8's
//! `--ro-bind-fd` resolves `/proc/self/fd/N` by path, which fails the same way. So the child,
//! while still root, enters a private mount namespace, mounts a small tmpfs on the staging
//! directory, and bind-mounts each policy source there from an `O_PATH` descriptor we opened;
//! bwrap then binds the staged paths. The staging namespace is private: the host never sees it.
//! When the server is not root, bwrap runs as the server's own (unprivileged) uid, binding
//! the policy's paths directly.
//!
//! Writable mounts must therefore be writable by host uid 65534 when the server is root: see
//! [`crate::Sandbox::sandbox_host_uid`].

pub(crate) mod forkserver;
pub(crate) mod fuse;
pub(crate) mod policy;
pub(crate) mod seccomp;

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;

use self::policy::{
    ARGS_FD, CONTROL_FD, FORKED_RUN_PROGRAM_FDS, GROUP, GROUP_FD, HOSTS, HOSTS_FD, INFO_FD, PASSWD,
    PASSWD_FD, SANDBOX_GID, SANDBOX_UID, SECCOMP_ENOSYS_FD, SECCOMP_EPERM_FD, SystemView,
};
use crate::cgroup::{CgroupSet, RunCgroup};
use crate::child::{ChildPlan, StagedMount, Staging, memfd_with, pipe, raise_fd, rlimits_for};
use crate::error::{NamespaceError, SandboxError, SeccompError, SpawnError};
use crate::none::FD_SOURCE_MIN;
use crate::process::{ProcessBackend, Started, spawn_child};
use crate::supervise::Teardown;
use crate::{
    BackendKind, BackendReport, Identity, LimitReport, Limits, Policy, SandboxCommand,
    SandboxConfig,
};

/// Host uid/gid of install sandboxes under a root server: not the one user code runs as, so a
/// run cannot touch uv's cache or an environment being built.
pub(crate) const INSTALLER_UID: u32 = 65533;
/// See [`INSTALLER_UID`].
pub(crate) const INSTALLER_GID: u32 = 65533;

/// Where the staging tmpfs is mounted (inside the child's private mount namespace only).
pub(crate) const STAGING_ROOT: &str = "/run/snakebox-stage";

/// A probed, ready bubblewrap backend.
#[derive(Debug)]
pub(crate) struct NativeBackend {
    bwrap: PathBuf,
    version: String,
    view: SystemView,
    seccomp_eperm: Vec<u8>,
    seccomp_enosys: Vec<u8>,
    /// The fork server's own programs (see [`seccomp::Holder::ForkServer`]).
    fork_server_eperm: Vec<u8>,
    fork_server_enosys: Vec<u8>,
    /// A run's programs as a fork server installs them in each run it forks (before and
    /// after its directories are attached; see [`seccomp::ForkedRunPrograms`]), in the
    /// order of the descriptors they are handed over at ([`policy::FORKED_RUN_PROGRAM_FDS`]).
    forked_run_programs: [Vec<u8>; 4],
    /// Whether we switch bwrap to an unprivileged host uid (the server is root).
    drop_privileges: bool,
    staging: Option<PathBuf>,
    cgroups: Option<Arc<CgroupSet>>,
    cgroup_note: String,
    /// Where the process limit is set inside the sandbox's own user namespace (the server is
    /// not root and has no pids cgroup): `prlimit` runs first in the sandbox, lowers
    /// RLIMIT_NPROC there and executes the command. See [`nproc_in_sandbox`].
    nproc_in_sandbox: Option<PathBuf>,
    /// The niceness every sandbox takes where no CPU cgroup holds it (see
    /// [`crate::child::RUN_NICE`]); decided once, at probe time.
    run_nice: Option<libc::c_int>,
}

/// `prlimit` (util-linux), run as the sandbox's first command where the process limit is an
/// RLIMIT_NPROC set inside the sandbox's user namespace.
const PRLIMIT: &str = "/usr/bin/prlimit";

/// Where RLIMIT_NPROC is set, when no pids cgroup limits processes and the server is not root.
///
/// Since Linux 5.14 the kernel counts RLIMIT_NPROC per user namespace ("ucounts"): a fork is
/// checked against the process's own limit with the count of its uid *in its own user
/// namespace*, and at each ancestor namespace against the limit its creator had when it made
/// the namespace. So the limit must not be set on bwrap (it would be stored for the host
/// level, where every process of the user counts: an IDE with 150 threads made every run fail
/// with `Creating new namespace failed`); it is set by the sandbox's first command, after the
/// namespaces exist, and then counts the run's processes only. Verified on the dev machines
/// (Linux 6.x): with 200 threads of the same user outside, a sandbox with RLIMIT_NPROC 64 set
/// inside forks up to 62 children (pid 1 and the shell count too). Before 5.14 the counter
/// was per host uid and this degrades to the old behaviour, which the report says.
fn nproc_in_sandbox(root: bool, pids_cgroup: bool) -> Option<PathBuf> {
    let prlimit = PathBuf::from(PRLIMIT);
    (!root && !pids_cgroup && prlimit.is_file()).then_some(prlimit)
}

/// Whether the running kernel is at least `major.minor` (unknown: no).
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = fs_err::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    found >= (major, minor)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn find_bwrap(config: &SandboxConfig) -> Result<PathBuf, NamespaceError> {
    let candidates: Vec<PathBuf> = match &config.bwrap_path {
        Some(p) => vec![p.clone()],
        None => std::env::var_os("PATH")
            .map(|paths| {
                std::env::split_paths(&paths)
                    .map(|d| d.join("bwrap"))
                    .collect()
            })
            .unwrap_or_default(),
    };
    candidates
        .into_iter()
        .find(|p| {
            use std::os::unix::fs::PermissionsExt;
            fs_err::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .ok_or_else(|| NamespaceError::BwrapMissing {
            path: config
                .bwrap_path
                .clone()
                .unwrap_or_else(|| "bwrap (on PATH)".into()),
            given: config.bwrap_path.is_some(),
        })
}

fn seccomp_available() -> Result<(), SeccompError> {
    // PR_GET_SECCOMP fails with EINVAL when the kernel has no seccomp support.
    // SAFETY: prctl with an integer option only.
    if unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) } < 0 {
        return Err(SeccompError::Unavailable {
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

impl NativeBackend {
    /// See [`crate::Sandbox::remove_own_cgroups`].
    pub(crate) fn remove_own_cgroups(&self) {
        if let Some(cgroups) = &self.cgroups {
            cgroups.remove_own();
        }
    }

    /// Find bwrap, compile seccomp, prepare staging and cgroups, then start one real sandbox
    /// to prove that it works here (fail closed).
    pub(crate) fn new(config: &SandboxConfig) -> Result<Self, SandboxError> {
        let bwrap = find_bwrap(config)?;
        let version = std::process::Command::new(&bwrap)
            .arg("--version")
            .env_clear()
            .output()
            .map_err(|source| NamespaceError::Probe {
                path: bwrap.clone(),
                source,
            })?;
        let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
        seccomp_available()?;
        let programs = seccomp::programs(seccomp::Holder::Run)?;
        let fork_server_programs = seccomp::programs(seccomp::Holder::ForkServer)?;
        let forked = seccomp::forked_run_programs()?;
        let (drop_privileges, staging) = if is_root() {
            let root = PathBuf::from(STAGING_ROOT);
            fs_err::create_dir_all(&root).map_err(|source| NamespaceError::Staging {
                path: root.clone(),
                source,
            })?;
            (true, Some(root))
        } else {
            (false, None)
        };
        let (cgroups, cgroup_note) = match CgroupSet::detect() {
            Ok(set) => {
                let note = set.describe();
                (Some(Arc::new(set)), note)
            }
            Err(e) => (
                None,
                match e.hint() {
                    // The hint says how to get cgroups and what stands in meanwhile.
                    Some(hint) => format!("cgroups unusable ({e}); to have them, {hint}"),
                    None => format!(
                        "cgroups unusable ({e}): memory is limited by the supervisor's watchdog and processes by RLIMIT_NPROC (see the limits)"
                    ),
                },
            ),
        };
        let nproc_in_sandbox = nproc_in_sandbox(
            drop_privileges,
            cgroups
                .as_deref()
                .and_then(CgroupSet::pids_mechanism)
                .is_some(),
        );
        let run_nice = cgroups
            .as_deref()
            .and_then(CgroupSet::cpu_mechanism)
            .is_none()
            .then_some(crate::child::RUN_NICE);
        let backend = Self {
            nproc_in_sandbox,
            run_nice,
            bwrap,
            version,
            view: policy::probe_system_view(),
            seccomp_eperm: seccomp::SeccompPrograms::to_bytes(&programs.eperm),
            seccomp_enosys: seccomp::SeccompPrograms::to_bytes(&programs.enosys),
            fork_server_eperm: seccomp::SeccompPrograms::to_bytes(&fork_server_programs.eperm),
            fork_server_enosys: seccomp::SeccompPrograms::to_bytes(&fork_server_programs.enosys),
            forked_run_programs: [
                &forked.before.eperm,
                &forked.before.enosys,
                &forked.seal.eperm,
                &forked.seal.enosys,
            ]
            .map(|program| seccomp::SeccompPrograms::to_bytes(program)),
            drop_privileges,
            staging,
            cgroups,
            cgroup_note,
        };
        backend.probe()?;
        Ok(backend)
    }

    /// Start `/usr/bin/id -u` in a real sandbox and check it ran as the sandbox user. Where
    /// the process limit is set inside the sandbox, the probe sets one too, so that a server
    /// whose runs could not start does not start either.
    fn probe(&self) -> Result<(), SandboxError> {
        let program = ["/usr/bin/id", "/bin/id"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists());
        let Some(program) = program else {
            return Err(NamespaceError::NotIsolated {
                property: "a probe program (/usr/bin/id) exists".into(),
            }
            .into());
        };
        let policy = Policy {
            mounts: vec![],
            network: false,
            env: vec![],
            cwd: "/tmp".into(),
            limits: Limits {
                wall_time: Duration::from_secs(10),
                cpu_time: None,
                memory_bytes: None,
                max_processes: self.nproc_in_sandbox.as_ref().map(|_| 16),
                max_output_bytes: 4096,
                scratch_bytes: Some(1 << 20),
                file_size_bytes: None,
                open_files: None,
                cpu_millicores: None,
            },
            identity: crate::Identity::Untrusted,
            cpu: None,
        };
        let command = SandboxCommand {
            program,
            args: vec!["-u".into()],
            control_channel: false,
            init: false,
        };
        let mut prepared = self.prepare(&policy, &command, None, None)?;
        prepared
            .command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = prepared
            .command
            .spawn()
            .map_err(|source| NamespaceError::Probe {
                path: self.bwrap.clone(),
                source,
            })?;
        drop(prepared.keep_until_spawned);
        let out = wait_with_timeout(child, Duration::from_secs(10)).map_err(|source| {
            NamespaceError::Probe {
                path: self.bwrap.clone(),
                source,
            }
        })?;
        if !out.status.success() {
            return Err(NamespaceError::SandboxRefused {
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            }
            .into());
        }
        if String::from_utf8_lossy(&out.stdout).trim() != SANDBOX_UID.to_string() {
            return Err(NamespaceError::NotIsolated {
                property: format!("uid {SANDBOX_UID} inside"),
            }
            .into());
        }
        Ok(())
    }

    /// Host uid/gid of a sandbox of this identity when we switch to it.
    pub(crate) fn host_ids(&self, identity: Identity) -> Option<(u32, u32)> {
        self.drop_privileges.then_some(match identity {
            Identity::Untrusted => (SANDBOX_UID, SANDBOX_GID),
            Identity::Installer => (INSTALLER_UID, INSTALLER_GID),
            Identity::Leased(uid) => (uid, uid),
        })
    }

    /// The report of this backend.
    pub(crate) fn report(&self) -> BackendReport {
        let host_uid = match self.host_ids(Identity::Untrusted) {
            Some((uid, _)) => format!(
                "host uid: bwrap and the command run as an unprivileged host uid: one of their own per one-shot run and per fork server, shared by the runs it forks ({}-{}), {uid} for sessions, {INSTALLER_UID} for installs (the server is root; sources are staged in a private mount namespace at {STAGING_ROOT})",
                crate::LEASED_UID_BASE,
                crate::LEASED_UID_BASE + crate::LEASED_UIDS - 1
            ),
            // SAFETY: geteuid has no preconditions.
            None => format!("host uid: bwrap runs as the server's own uid {}", unsafe {
                libc::geteuid()
            }),
        };
        let details = vec![
            format!("bubblewrap: {} ({})", self.bwrap.display(), self.version),
            "namespaces: user, mount, pid, ipc, uts, cgroup, net (runs always get their own; a run with network reaches out only through its proxy); nested user namespaces disabled".into(),
            format!("sandbox uid/gid {SANDBOX_UID}/{SANDBOX_GID}, hostname sandbox, no capabilities, new session, die-with-parent"),
            host_uid,
            seccomp::summary(),
            "filesystem: read-only /usr and minimal /etc (synthetic passwd/group/hosts), fresh /proc and /dev, tmpfs /tmp and /dev/shm, root read-only".into(),
            self.cgroup_note.clone(),
        ];
        BackendReport {
            backend: BackendKind::Native,
            isolation_active: true,
            details,
            limits: self.limit_reports(),
        }
    }

    fn limit_reports(&self) -> Vec<LimitReport> {
        let r = |name: &str, enforced: bool, mechanism: String| LimitReport {
            name: name.into(),
            enforced,
            mechanism,
        };
        let memory = self
            .cgroups
            .as_deref()
            .and_then(CgroupSet::memory_mechanism);
        let pids = self.cgroups.as_deref().and_then(CgroupSet::pids_mechanism);
        let nproc_note = if self.drop_privileges {
            "RLIMIT_NPROC on the run's own host uid (shared by sessions, which all run as 65534)"
        } else if self.nproc_in_sandbox.is_some() {
            if kernel_at_least(5, 14) {
                "RLIMIT_NPROC set inside the sandbox's own user namespace (by `prlimit` before the command): the kernel counts the run's processes and threads only, not the user's others (per-user-namespace counts, Linux 5.14+)"
            } else {
                "RLIMIT_NPROC set inside the sandbox (this kernel is older than 5.14 and counts every process of the server's uid against it: a user with many processes makes runs fail)"
            }
        } else {
            "RLIMIT_NPROC on the server's uid (counts every process of the server's user)"
        };
        vec![
            r("wall_time", true, "supervisor timer; SIGKILL of the sandbox's pid 1 (PID namespace), bwrap and the run cgroup".into()),
            r("cpu_time", true, "RLIMIT_CPU per process (SIGXCPU, SIGKILL one second later)".into()),
            {
                let cpu = self.cgroups.as_deref().and_then(CgroupSet::cpu_mechanism);
                r(
                    "cpu_bandwidth",
                    cpu.is_some(),
                    cpu.unwrap_or_else(|| format!("no writable cpu cgroup here (a cgroup v1 cpu controller the server may write to, or a delegated v2 one); sandboxes run at niceness {}, behind the server and the host's other programs", crate::child::RUN_NICE)),
                )
            },
            {
                let weight = self
                    .cgroups
                    .as_deref()
                    .and_then(CgroupSet::cpu_weight_mechanism);
                r(
                    "cpu_weight",
                    weight.is_some(),
                    weight.unwrap_or_else(|| "no writable cpu cgroup here: every busy sandbox gets an equal part of the CPU, whoever it works for".into()),
                )
            },
            r("memory", true, memory.unwrap_or_else(|| format!("no memory cgroup: the supervisor sums the resident anonymous memory of the sandbox's processes (Pss_Anon + Pss_Shmem: a page shared after fork counts once) every {} ms and kills the sandbox above the limit (status memory_limit); a burst between samples can overshoot briefly, /tmp and /dev/shm are capped by scratch_bytes, page cache is not counted; address space is not limited (RLIMIT_AS breaks polars, duckdb and other libraries that reserve it)", crate::watchdog::INTERVAL.as_millis()))),
            r("max_processes", true, pids.unwrap_or_else(|| nproc_note.into())),
            r("max_output_bytes", true, "supervisor capture, head and tail, shared budget".into()),
            {
                let own = crate::own_mounts::entered();
                r(
                    "scratch_bytes",
                    self.drop_privileges || own,
                    if self.drop_privileges {
                        "bwrap tmpfs --size on /tmp and /dev/shm; /work a size- and inode-capped tmpfs".into()
                    } else if own {
                        "bwrap tmpfs --size on /tmp and /dev/shm; /work a size- and inode-capped tmpfs, mounted in the server's own user and mount namespace (the server is not root)".into()
                    } else {
                        "bwrap tmpfs --size on /tmp and /dev/shm only: /work is a plain host directory (the server is not root, and could not make a user namespace of its own to mount a capped one)".into()
                    },
                )
            },
            r("file_size_bytes", true, "RLIMIT_FSIZE".into()),
            r("open_files", true, "RLIMIT_NOFILE".into()),
            r("network", true, "network namespace (loopback only); with network, only through the run proxy".into()),
        ]
    }

    /// Build the bwrap command and the child plan for one run (or, with `zygote`, for the
    /// fork server).
    fn prepare(
        &self,
        policy: &Policy,
        command: &SandboxCommand,
        cgroup: Option<&RunCgroup>,
        zygote: Option<forkserver::ZygoteSetup>,
    ) -> Result<Prepared, SandboxError> {
        let desc = |what: &'static str| move |source| SpawnError::Descriptor { what, source };
        let mut keep: Vec<OwnedFd> = Vec::new();
        let mut plan = ChildPlan::default();

        // Mount sources: staged (root server) or direct.
        let mut sources = Vec::with_capacity(policy.mounts.len());
        if let Some(root) = &self.staging {
            let mut staged = Vec::new();
            for (i, mount) in policy.mounts.iter().enumerate() {
                // The source is bound by path in the child, after it entered its private mount
                // namespace: a descriptor opened here would belong to the host's namespace, and
                // the kernel refuses to bind a mount of another namespace (EINVAL). The paths
                // are ours (environments, run directories) under root-owned parents, so the
                // sandbox user cannot swap them for a symlink in between.
                let is_dir = fs_err::metadata(&mount.host)
                    .map_err(|source| SpawnError::Path {
                        path: mount.host.clone(),
                        source,
                    })?
                    .is_dir();
                let target = root.join(i.to_string());
                staged.push(StagedMount {
                    source: cstring(mount.host.as_os_str().as_bytes())?,
                    target: cstring(target.as_os_str().as_bytes())?,
                    is_dir,
                });
                sources.push(target);
            }
            if !staged.is_empty() {
                plan.staging = Some(Staging {
                    root: cstring(root.as_os_str().as_bytes())?,
                    mounts: staged,
                });
            }
        } else {
            sources.extend(policy.mounts.iter().map(|m| m.host.clone()));
        }

        let ops = match &zygote {
            None => policy::setup_ops(policy, &self.view, &sources, command.init)?,
            Some(setup) => policy::zygote_ops(policy, &self.view, &sources, &setup.mount_points)?,
        };
        let payload = policy::args_payload(&policy::option_args(&ops))?;

        let mut map = |fd: OwnedFd, target: i32, what: &'static str| -> Result<(), SpawnError> {
            let fd = raise_fd(fd, FD_SOURCE_MIN).map_err(desc(what))?;
            plan.fd_map.push((fd.as_raw_fd(), target));
            keep.push(fd);
            Ok(())
        };
        map(
            memfd_with(c"bwrap-args", &payload).map_err(desc("bwrap arguments"))?,
            ARGS_FD,
            "bwrap arguments",
        )?;
        // The sandbox's own programs; a fork server also gets a run's, which it installs in
        // each run it forks (on top of its own).
        let (eperm, enosys) = if zygote.is_some() {
            for (program, target) in self.forked_run_programs.iter().zip(FORKED_RUN_PROGRAM_FDS) {
                map(
                    memfd_with(c"seccomp-run", program).map_err(desc("seccomp"))?,
                    target,
                    "seccomp",
                )?;
            }
            (&self.fork_server_eperm, &self.fork_server_enosys)
        } else {
            (&self.seccomp_eperm, &self.seccomp_enosys)
        };
        map(
            memfd_with(c"seccomp-eperm", eperm).map_err(desc("seccomp"))?,
            SECCOMP_EPERM_FD,
            "seccomp",
        )?;
        map(
            memfd_with(c"seccomp-enosys", enosys).map_err(desc("seccomp"))?,
            SECCOMP_ENOSYS_FD,
            "seccomp",
        )?;
        map(
            memfd_with(c"passwd", PASSWD.as_bytes()).map_err(desc("/etc/passwd"))?,
            PASSWD_FD,
            "/etc/passwd",
        )?;
        map(
            memfd_with(c"group", GROUP.as_bytes()).map_err(desc("/etc/group"))?,
            GROUP_FD,
            "/etc/group",
        )?;
        map(
            memfd_with(c"hosts", HOSTS.as_bytes()).map_err(desc("/etc/hosts"))?,
            HOSTS_FD,
            "/etc/hosts",
        )?;
        let is_zygote = zygote.is_some();
        if let Some(setup) = zygote {
            map(setup.socket, CONTROL_FD, "fork server socket")?;
        }
        let (info_read, info_write) = pipe().map_err(desc("bwrap info"))?;
        map(info_write, INFO_FD, "bwrap info")?;
        let control_read = if command.control_channel {
            let (r, w) = pipe().map_err(desc("control channel"))?;
            map(w, CONTROL_FD, "control channel")?;
            Some(r)
        } else {
            None
        };

        let limits = &policy.limits;
        let pids_by_cgroup = cgroup.is_some_and(RunCgroup::limits_pids);
        // The process limit inside the sandbox's user namespace, when that is where it goes
        // (see `nproc_in_sandbox`): not on bwrap, where it would count the user's processes.
        // (A fork server's is the sum of its own and its runs': see `start_fork_server`.)
        let nproc_inside = match (&self.nproc_in_sandbox, limits.max_processes) {
            (Some(prlimit), Some(n)) if !pids_by_cgroup => Some((prlimit, n)),
            _ => None,
        };
        // Memory without a cgroup is the supervisor's watchdog (crate::watchdog), not
        // RLIMIT_AS.
        let nproc_rlimit = !pids_by_cgroup && nproc_inside.is_none();
        plan.rlimits = if is_zygote {
            forkserver::rlimits(limits, nproc_rlimit)
        } else {
            rlimits_for(limits, false, nproc_rlimit)
        };
        plan.cgroup_procs = match cgroup {
            Some(cg) => cg
                .procs_files()
                .iter()
                .map(|p| cstring(join_file(p).as_os_str().as_bytes()))
                .collect::<Result<_, _>>()?,
            None => Vec::new(),
        };
        plan.drop_to = self.host_ids(policy.identity);
        // No CPU cgroup: behind the server (see RUN_NICE). A fork server's runs inherit it.
        plan.nice = self.run_nice;

        let wrapped;
        let command = match nproc_inside {
            Some((prlimit, n)) => {
                let mut args: Vec<std::ffi::OsString> =
                    vec![format!("--nproc={n}:{n}").into(), "--".into()];
                args.push(command.program.clone().into_os_string());
                args.extend(command.args.iter().cloned());
                wrapped = SandboxCommand {
                    program: prlimit.clone(),
                    args,
                    control_channel: command.control_channel,
                    init: command.init,
                };
                &wrapped
            }
            None => command,
        };
        let mut cmd = std::process::Command::new(&self.bwrap);
        cmd.args(policy::bwrap_argv(command))
            .env_clear()
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: `apply` only makes async-signal-safe system calls on data prepared above.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || plan.apply());
        }
        Ok(Prepared {
            command: cmd,
            keep_until_spawned: keep,
            info_read,
            control_read,
        })
    }
}

impl ProcessBackend for NativeBackend {
    /// Start one command in a fresh sandbox: its own cgroup (for the sandbox's whole life),
    /// bwrap spawned, and a task that learns the sandbox's pid 1 for the kill path. With
    /// `requests`, the command's stdin is a private pipe from us (a long-lived sandbox reads its
    /// requests there); otherwise it is `/dev/null`.
    fn start(
        &self,
        policy: &Policy,
        command: &SandboxCommand,
        requests: bool,
    ) -> Result<Started, SandboxError> {
        let cgroup = match &self.cgroups {
            Some(set) => Some(set.create_run(&policy.limits)?),
            None => None,
        };
        // Before the spawn: the sandbox starts at its holder's weight.
        let cpu = attach_cpu(cgroup.as_ref(), policy.cpu.as_ref());
        let prepared = self.prepare(policy, command, cgroup.as_ref(), None)?;
        let Prepared {
            command: mut std_cmd,
            keep_until_spawned,
            info_read,
            control_read,
        } = prepared;
        if requests {
            std_cmd.stdin(Stdio::piped());
        }
        let (child, started) = spawn_child(std_cmd, &self.bwrap)?;
        // The child has its copies; ours must go (pipes reach EOF, memfds are freed).
        drop(keep_until_spawned);

        let memory_watch = policy
            .limits
            .memory_bytes
            .filter(|_| !cgroup.as_ref().is_some_and(RunCgroup::limits_memory));
        let teardown = Arc::new(NativeTeardown {
            sandbox_pidfd: std::sync::Mutex::new(None),
            sandbox_pid: AtomicI32::new(0),
            cgroup,
            cpu: std::sync::Mutex::new(cpu),
            memory_watch,
            memory_hit: AtomicBool::new(false),
            command_ran: AtomicBool::new(false),
            namespaces: None,
            all_dying: AtomicBool::new(false),
        });
        let info_task = tokio::spawn(follow_status(info_read, teardown.clone()));
        Ok(Started {
            child,
            teardown,
            control_read,
            info_task: Some(info_task),
            started,
            shell_style_signals: true,
        })
    }
}

/// Attach `cgroup` to `share` for the run's life, if both are there; a weight that cannot be
/// written leaves the run at the default weight (logged), it does not fail the run.
fn attach_cpu(
    cgroup: Option<&RunCgroup>,
    share: Option<&crate::CpuShare>,
) -> Option<crate::CpuAttachment> {
    let knob = cgroup?.cpu_knob()?;
    share?
        .attach(knob, None)
        .inspect_err(|err| tracing::warn!(error = %err, "could not set a run's CPU weight"))
        .ok()
}

/// A prepared bwrap command with the descriptors that must live until it is spawned.
struct Prepared {
    command: std::process::Command,
    keep_until_spawned: Vec<OwnedFd>,
    info_read: OwnedFd,
    control_read: Option<OwnedFd>,
}

/// The file the forked child writes `0` into to join a run cgroup, given its `cgroup.procs`.
///
/// On cgroup v1 that is the hierarchy's `tasks` file (v2 has none, so `cgroup.procs` stays).
/// Both move the writer into the cgroup, and the child is single-threaded after `fork`, so
/// moving its one thread moves the whole process, before exec, as before. The difference is
/// cost: a `cgroup.procs` write takes the kernel's global threadgroup lock for writing, which
/// waits for an RCU grace period (10-20 ms on the dev machines, measured in BENCHMARKS.md);
/// moving only the calling thread (`tasks`, pid 0) skips that lock (Linux 6.0+; older kernels
/// take it either way, so nothing is lost there).
fn join_file(procs: &std::path::Path) -> PathBuf {
    let tasks = procs.with_file_name("tasks");
    if procs.file_name().is_some_and(|name| name == "cgroup.procs") && tasks.is_file() {
        tasks
    } else {
        procs.to_path_buf()
    }
}

fn cstring(bytes: &[u8]) -> Result<CString, SpawnError> {
    CString::new(bytes).map_err(|_| SpawnError::NulByte {
        value: String::from_utf8_lossy(bytes).into_owned(),
    })
}

fn wait_with_timeout(
    mut child: std::process::Child,
    timeout: Duration,
) -> std::io::Result<std::process::Output> {
    let deadline = Instant::now() + timeout;
    loop {
        if child.try_wait()?.is_some() {
            return child.wait_with_output();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return child.wait_with_output();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Follow bwrap's `--json-status-fd` until bwrap exits: remember the sandbox's pid 1 as a
/// pidfd (first line), note whether the command was executed (the `exit-code` line, which
/// bwrap writes only when the sandbox's setup finished), and meanwhile, where memory is the
/// watchdog's, sample the sandbox's processes and kill it above the limit.
async fn follow_status(fd: OwnedFd, teardown: Arc<NativeTeardown>) {
    use tokio::io::AsyncBufReadExt;
    let Ok(pipe) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
        return;
    };
    let mut lines = tokio::io::BufReader::new(pipe.take(64 * 1024)).lines();
    let mut tick = tokio::time::interval(crate::watchdog::INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let watching = teardown.memory_watch.is_some()
            && teardown.sandbox_pid.load(Ordering::SeqCst) > 0
            && !teardown.memory_hit.load(Ordering::SeqCst);
        tokio::select! {
            line = lines.next_line() => match line {
                Ok(Some(line)) => teardown.status_line(&line),
                // bwrap exited (only it holds the write end): the sandbox is gone.
                _ => return,
            },
            // procfs reads are served from memory (a few small files per sample): done
            // here, not on the blocking pool, whose hand-off costs more than the reads.
            _ = tick.tick(), if watching => teardown.check_memory(),
        }
    }
}

/// The number after `"key":` in one line of bwrap's JSON status.
fn json_number(line: &str, key: &str) -> Option<i32> {
    let rest = line.split(&format!("\"{key}\":")).nth(1)?;
    rest.trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// A pidfd of process `pid`: signals sent through it can never reach a later process that
/// reused the pid.
pub(crate) fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open returns a fresh descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    match i32::try_from(fd) {
        // SAFETY: a fresh descriptor owned only here.
        Ok(fd) if fd >= 0 => Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) }),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// SIGKILL the process behind `pidfd` (nothing when it is gone already).
pub(crate) fn pidfd_kill(pidfd: &OwnedFd) {
    // SAFETY: pidfd_send_signal on a pidfd we own; immune to pid reuse.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<u8>(),
            0,
        );
    }
}

/// Kills a native run: the sandbox's pid 1 (the kernel then kills its whole PID namespace)
/// and everything left in the run's cgroup. bwrap itself is killed by `supervise` through the
/// child handle (never by a bare pid, which may already be reaped and reused).
#[derive(Debug)]
struct NativeTeardown {
    sandbox_pidfd: std::sync::Mutex<Option<OwnedFd>>,
    sandbox_pid: AtomicI32,
    cgroup: Option<RunCgroup>,
    /// The cgroup's attachment to the CPU share of whoever holds the run's slot (see
    /// [`crate::CpuShare`]), until [`Teardown::release`].
    cpu: std::sync::Mutex<Option<crate::CpuAttachment>>,
    /// The memory limit the watchdog enforces (no memory cgroup), in bytes.
    memory_watch: Option<u64>,
    /// The watchdog killed the sandbox for its memory.
    memory_hit: AtomicBool,
    /// bwrap reported the command's exit code: its setup finished and the command ran.
    command_ran: AtomicBool,
    /// The run's namespaces, held from its kill until [`Teardown::release`] (see
    /// [`hold_namespaces`]); `None`: not held (a cold run releases on the runtime, where their
    /// end would block a thread).
    namespaces: Option<std::sync::Mutex<Vec<OwnedFd>>>,
    /// Every process of the run has SIGKILL pending or is gone, and none can be made any
    /// more: a forked run's pid 1 says so in its report of the run's end (it killed the rest
    /// of its pid namespace first). The reply then need not wait for their exits; the
    /// cgroup's removal does, off the call's path.
    all_dying: AtomicBool,
}

impl NativeTeardown {
    /// One line of bwrap's JSON status.
    fn status_line(&self, line: &str) {
        if let Some(pid) = json_number(line, "child-pid") {
            if let Ok(fd) = pidfd_open(pid) {
                *self
                    .sandbox_pidfd
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(fd);
            }
            self.sandbox_pid.store(pid, Ordering::SeqCst);
        }
        if json_number(line, "exit-code").is_some() {
            self.command_ran.store(true, Ordering::SeqCst);
        }
    }

    /// One watchdog sample: kill the sandbox when its processes hold more than the limit.
    fn check_memory(&self) {
        let (Some(limit), pid) = (self.memory_watch, self.sandbox_pid.load(Ordering::SeqCst))
        else {
            return;
        };
        if pid <= 0 || crate::watchdog::tree_anon_bytes(pid) <= limit {
            return;
        }
        let pidfd = self
            .sandbox_pidfd
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Only a sandbox that is still alive (its pid not reused) was over the limit.
        if let Some(fd) = pidfd.as_ref().filter(|fd| crate::watchdog::pidfd_alive(fd)) {
            self.memory_hit.store(true, Ordering::SeqCst);
            pidfd_kill(fd);
        }
    }
}

impl NativeTeardown {
    /// SIGKILL the sandbox's pid 1 (the kernel then kills its whole PID namespace).
    fn kill_sandbox(&self) {
        if let Some(fd) = self
            .sandbox_pidfd
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
        {
            pidfd_kill(fd);
        }
    }
}

/// How long [`Teardown::release`] waits for the exits of a run whose reply did not (its
/// processes have SIGKILL pending) before it removes the run's cgroup, which sweeps again.
const EXITS_WAIT: Duration = Duration::from_secs(2);

/// Block until each of `pids` has exited (its pidfd is readable) or `timeout` has passed.
fn wait_for_exits(pids: &[i32], timeout: Duration) {
    let mut watched: Vec<OwnedFd> = pids
        .iter()
        .take(GONE_WATCHED)
        .filter_map(|&pid| pidfd_open(pid).ok())
        .collect();
    let deadline = std::time::Instant::now() + timeout;
    while !watched.is_empty() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Ok(millis) = nix::poll::PollTimeout::try_from(left.as_millis().max(1)) else {
            return;
        };
        let mut polled: Vec<nix::poll::PollFd<'_>> = watched
            .iter()
            .map(|fd| {
                nix::poll::PollFd::new(std::os::fd::AsFd::as_fd(fd), nix::poll::PollFlags::POLLIN)
            })
            .collect();
        match nix::poll::poll(&mut polled, millis) {
            Ok(0) => return,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return,
        }
        let exited: Vec<bool> = polled
            .iter()
            .map(|p| p.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(polled);
        watched = watched
            .into_iter()
            .zip(exited)
            .filter_map(|(fd, gone)| (!gone).then_some(fd))
            .collect();
    }
}

/// How many times [`gone`] sweeps a cgroup that keeps filling before it leaves the rest to
/// the cgroup's removal (which sweeps again).
const GONE_SWEEPS: usize = 20;
/// How long [`gone`] waits for the processes of one sweep to exit.
const GONE_WAIT: Duration = Duration::from_millis(200);
/// How many processes of one sweep [`gone`] waits for through pidfds (a fork bomb's thousand
/// would take as many descriptors); the others are killed by pid and looked for again.
const GONE_WATCHED: usize = 64;

/// Namespaces whose end, when the last process in one exits, waits for RCU grace periods in
/// that process's exit (each ≈ 0.2-0.5 ms, measured): a run's pid 1 ends faster, and the call
/// goes on sooner, when something else still holds them.
const HELD_NAMESPACES: [&str; 3] = ["mnt", "net", "ipc"];
/// Open the namespaces of the first of `pids` that still has them (a run's processes share
/// theirs: a run cannot make new ones) and keep them in `held`, so that their teardown
/// happens when `held` is cleared ([`Teardown::release`], after the reply) rather than in the
/// exit of the run's last process, which the call waits for. Best effort: a process already
/// past that point (or gone) has nothing to open; a reused pid's namespaces are held a moment
/// longer, no more. The fds are never used for anything else.
fn hold_namespaces(pids: &[i32], held: &std::sync::Mutex<Vec<OwnedFd>>) {
    for pid in pids {
        let opened: Vec<OwnedFd> = HELD_NAMESPACES
            .iter()
            .filter_map(|ns| std::fs::File::open(format!("/proc/{pid}/ns/{ns}")).ok())
            .map(OwnedFd::from)
            .collect();
        if !opened.is_empty() {
            held.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend(opened);
            return;
        }
    }
}

/// SIGKILL everything in `cgroup` and wait, on the runtime, until it is empty: each sweep
/// kills the processes it finds and waits for exactly those to exit (through pidfds, which
/// become readable then, opened before the kill so that a reused pid is never waited for),
/// instead of polling the cgroup on a timer that holds a runtime thread. A fork that raced
/// a sweep is in the next one.
async fn gone(cgroup: &RunCgroup, held: Option<&std::sync::Mutex<Vec<OwnedFd>>>) {
    for sweep in 0..GONE_SWEEPS {
        let pids = cgroup.pids();
        if pids.is_empty() {
            return;
        }
        if let (0, Some(held)) = (sweep, held) {
            hold_namespaces(&pids, held);
        }
        let mut exits = Vec::with_capacity(pids.len().min(GONE_WATCHED));
        let mut unwatched = Vec::new();
        for (index, &pid) in pids.iter().enumerate() {
            // A pid that is gone already has no pidfd (ESRCH).
            let watched = (index < GONE_WATCHED)
                .then(|| pidfd_open(pid).ok())
                .flatten();
            let Some(fd) = watched else {
                unwatched.push(pid);
                continue;
            };
            pidfd_kill(&fd);
            // SAFETY: an OwnedFd keeps its one descriptor open until the AsyncFd drops it.
            let registered = unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
            };
            if let Ok(fd) = registered {
                exits.push(fd);
            }
        }
        crate::cgroup::sigkill_all(&unwatched);
        if exits.is_empty() {
            // Nothing to wait on (all unwatched): look again shortly.
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        }
        let all_exited = async {
            for exit in &exits {
                let _ = exit.readable().await;
            }
        };
        let _ = tokio::time::timeout(GONE_WAIT, all_exited).await;
    }
}

impl Teardown for NativeTeardown {
    fn kill_all(&self) {
        self.kill_sandbox();
        if let Some(cg) = &self.cgroup {
            cg.kill_all();
        }
    }

    fn kill_now(&self) {
        self.kill_sandbox();
        if let Some(cg) = &self.cgroup {
            cg.kill_once();
        }
    }

    fn kill_all_and_wait(&self) -> crate::supervise::Waiting<'_> {
        Box::pin(async move {
            self.kill_sandbox();
            if self.all_dying.load(Ordering::SeqCst) {
                return;
            }
            if let Some(cg) = &self.cgroup {
                gone(cg, self.namespaces.as_ref()).await;
            }
        })
    }

    fn memory_exceeded(&self) -> bool {
        self.memory_hit.load(Ordering::SeqCst)
            || self.cgroup.as_ref().is_some_and(RunCgroup::oom_killed)
    }

    fn setup_failed(&self) -> bool {
        !self.command_ran.load(Ordering::SeqCst)
    }

    fn usage(&self) -> crate::ResourceUsage {
        self.cgroup
            .as_ref()
            .map(RunCgroup::usage)
            .unwrap_or_default()
    }

    fn cpu_knob(&self) -> Option<crate::cgroup::CpuKnob> {
        self.cgroup.as_ref().and_then(RunCgroup::cpu_knob)
    }

    fn release(&self) {
        // Its share's other cgroups no longer split the share with this one.
        drop(
            self.cpu
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take(),
        );
        // The run's namespaces end here, off the call's path.
        if let Some(held) = &self.namespaces {
            drop(std::mem::take(
                &mut *held
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            ));
        }
        if let Some(cg) = &self.cgroup {
            let mut left = cg.pids();
            if self.all_dying.load(Ordering::SeqCst) {
                // The reply did not wait for the exits: wait for them here, on their pidfds,
                // rather than have the removal read the cgroup again every millisecond.
                wait_for_exits(&left, EXITS_WAIT);
                left = cg.pids();
            }
            if !left.is_empty() {
                tracing::warn!(
                    ?left,
                    "processes left in the run cgroup after the kill; retrying"
                );
            }
            cg.remove();
        }
    }
}

impl crate::backend::Backend for NativeBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Native
    }

    fn report(&self) -> BackendReport {
        NativeBackend::report(self)
    }

    crate::process::process_backend_methods!();

    fn forks_runs(&self) -> bool {
        self.drop_privileges || crate::own_mounts::entered()
    }

    fn start_fork_server(
        &self,
        spec: &forkserver::ForkServerSpec,
        lease: crate::IdentityLease,
    ) -> Result<forkserver::ForkServer, SandboxError> {
        NativeBackend::start_fork_server(self, spec, lease)
    }

    fn host_ids(&self, identity: Identity) -> Option<(u32, u32)> {
        NativeBackend::host_ids(self, identity)
    }

    fn remove_own_cgroups(&self) {
        NativeBackend::remove_own_cgroups(self);
    }

    fn host_work_group(&self) -> Option<crate::HostWorkGroup> {
        self.cgroups.as_deref().and_then(CgroupSet::host_work_group)
    }

    /// A tmpfs on the run directories, which fork servers pass on to their runs.
    fn prepare_runs_root(&self, runs_dir: &std::path::Path) -> std::io::Result<()> {
        forkserver::mount_runs_root(runs_dir)
    }

    fn release_runs_root(&self, runs_dir: &std::path::Path) {
        forkserver::unmount_runs_root(runs_dir);
    }

    /// Everything the command sees is mounted where the policy says.
    fn path_inside(&self, _host: &std::path::Path, dest: &std::path::Path) -> PathBuf {
        dest.to_path_buf()
    }
}

#[cfg(test)]
mod tests {
    use super::join_file;

    #[test]
    fn joins_through_tasks_on_v1_and_cgroup_procs_on_v2() {
        let v1 = tempfile::tempdir().unwrap();
        fs_err::write(v1.path().join("cgroup.procs"), "").unwrap();
        fs_err::write(v1.path().join("tasks"), "").unwrap();
        assert_eq!(
            join_file(&v1.path().join("cgroup.procs")),
            v1.path().join("tasks")
        );
        let v2 = tempfile::tempdir().unwrap();
        fs_err::write(v2.path().join("cgroup.procs"), "").unwrap();
        assert_eq!(
            join_file(&v2.path().join("cgroup.procs")),
            v2.path().join("cgroup.procs")
        );
    }
}
