//! The `none` backend: NO isolation, only the supervisor's own guarantees.
//!
//! It exists for hosts where the operator explicitly chose `--sandbox-backend none`. The
//! command runs as the server's own host uid with the server's filesystem view and network.
//! What it still guarantees: a clean environment (only `Policy::env`), stdin from `/dev/null`,
//! no inherited descriptors, its own session, capped output, and a wall-time / cancellation kill
//! of the whole tree (process group, then every process in the same session or descended from
//! the child). Limits are best effort — `report()` says so: memory by the supervisor's watchdog
//! over the command's tree (see `crate::watchdog`; the command is a child subreaper, so its
//! orphans stay in the tree), processes by RLIMIT_NPROC set to the user's current thread count
//! plus the limit (not when root, where it does not apply): there is no user namespace to count
//! the run's processes apart from the user's others.
//!
//! `Policy::mounts` are ignored and `Policy::cwd` is taken as a *host* path.

use std::os::fd::OwnedFd;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::child::{ChildPlan, pipe, raise_fd, rlimits_for};
use crate::error::{SandboxError, SpawnError};
use crate::host::{RealHost, kill_tree};
use crate::process::{ProcessBackend, Started, spawn_child};
use crate::supervise::Teardown;
use crate::{LimitReport, Limits, Policy, SandboxCommand};

/// Descriptors handed to the child are first moved at least this high, above every target.
pub(crate) const FD_SOURCE_MIN: i32 = 64;

/// Kills the session/process group of the child and every straggler we can find.
#[derive(Debug)]
struct SessionTeardown {
    leader: i32,
    /// The memory watchdog killed the tree.
    memory_hit: Arc<AtomicBool>,
}

impl Teardown for SessionTeardown {
    fn kill_all(&self) {
        if self.leader > 0 {
            kill_tree(&RealHost, self.leader, 8);
        }
    }

    fn memory_exceeded(&self) -> bool {
        self.memory_hit.load(Ordering::SeqCst)
    }
}

/// Sample the tree of `leader` (our child, watched through `pidfd`) until it exits; above
/// `limit` bytes, kill it and raise `hit`.
async fn watch_memory(leader: i32, pidfd: OwnedFd, limit: u64, hit: Arc<AtomicBool>) {
    // A pidfd turns readable when its process exits: the watch ends with the command, so
    // the supervisor (which waits for this task) is not held up.
    // SAFETY: an OwnedFd keeps its one descriptor open until the AsyncFd drops it.
    let Ok(exited) = (unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)
    }) else {
        return;
    };
    let mut tick = tokio::time::interval(crate::watchdog::INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = exited.readable() => return,
            _ = tick.tick() => {}
        }
        let pidfd = exited.get_ref();
        // Not reaped until the supervisor waits for it, so `leader` is still ours here.
        if !crate::watchdog::pidfd_alive(pidfd) {
            return;
        }
        let over =
            tokio::task::spawn_blocking(move || crate::watchdog::tree_anon_bytes(leader) > limit)
                .await
                .unwrap_or(false);
        if over && crate::watchdog::pidfd_alive(pidfd) {
            hit.store(true, Ordering::SeqCst);
            let _ = tokio::task::spawn_blocking(move || kill_tree(&RealHost, leader, 8)).await;
            return;
        }
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// How each limit is (not) enforced by this backend.
pub(crate) fn limit_reports() -> Vec<LimitReport> {
    let nproc = if is_root() {
        ("RLIMIT_NPROC is ignored for root: not enforced", false)
    } else {
        (
            "RLIMIT_NPROC set to the server's user's current thread count plus the limit, at the start of each run (best effort: the user's other processes and concurrent runs move the count)",
            true,
        )
    };
    let r = |name: &str, enforced: bool, mechanism: &str| LimitReport {
        name: name.into(),
        enforced,
        mechanism: mechanism.into(),
    };
    vec![
        r(
            "wall_time",
            true,
            "supervisor timer, SIGKILL of process group and session stragglers",
        ),
        r(
            "cpu_time",
            true,
            "RLIMIT_CPU per process (SIGXCPU, SIGKILL one second later)",
        ),
        r(
            "cpu_bandwidth",
            false,
            "none: no CPU cgroup without isolation",
        ),
        r(
            "cpu_weight",
            false,
            "none: no CPU cgroup without isolation (every process gets the scheduler's default share)",
        ),
        r(
            "memory",
            true,
            "the supervisor sums the resident anonymous memory of the command's process tree (Pss_Anon + Pss_Shmem: a page shared after fork counts once) every 100 ms and kills the tree above the limit (best effort: a burst between samples overshoots; files and page cache not counted)",
        ),
        r("max_processes", nproc.1, nproc.0),
        r(
            "max_output_bytes",
            true,
            "supervisor capture, head and tail, shared budget",
        ),
        r(
            "scratch_bytes",
            false,
            "none: no private scratch space without isolation",
        ),
        r("file_size_bytes", true, "RLIMIT_FSIZE"),
        r("open_files", true, "RLIMIT_NOFILE"),
        r("network", false, "none: the host network is shared"),
        r(
            "filesystem",
            false,
            "none: the host filesystem is visible with the server's permissions",
        ),
    ]
}

impl ProcessBackend for NoneBackend {
    /// Start `command` without isolation; with `requests`, its stdin is a private pipe from us.
    fn start(
        &self,
        policy: &Policy,
        command: &SandboxCommand,
        requests: bool,
    ) -> Result<Started, SandboxError> {
        let limits: &Limits = &policy.limits;
        let mut std_cmd = std::process::Command::new(&command.program);
        std_cmd
            .args(&command.args)
            .env_clear()
            .envs(policy.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&policy.cwd)
            .stdin(if requests {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());

        // RLIMIT_NPROC counts every thread of the user: relative to what the user runs now.
        let nproc = limits.max_processes.filter(|_| !is_root()).map(|n| {
            // SAFETY: getuid has no preconditions.
            n + crate::watchdog::threads_of_uid(unsafe { libc::getuid() })
        });
        let rlimit_limits = Limits {
            max_processes: nproc,
            ..limits.clone()
        };
        let mut plan = ChildPlan {
            rlimits: rlimits_for(&rlimit_limits, false, nproc.is_some()),
            subreaper: true,
            ..ChildPlan::default()
        };
        let mut control_write = None;
        let control_read = if command.control_channel {
            let (r, w) = pipe().map_err(|source| SpawnError::Descriptor {
                what: "control channel",
                source,
            })?;
            let w = raise_fd(w, FD_SOURCE_MIN).map_err(|source| SpawnError::Descriptor {
                what: "control channel",
                source,
            })?;
            plan.fd_map.push((std::os::fd::AsRawFd::as_raw_fd(&w), 3));
            control_write = Some(w);
            Some(r)
        } else {
            None
        };
        // SAFETY: `apply` only makes async-signal-safe system calls on data prepared above.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut std_cmd, move || plan.apply());
        }
        let (child, started) = spawn_child(std_cmd, &command.program)?;
        // The child has its copy; ours must go or the control channel never reaches EOF.
        drop(control_write);
        let leader = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .unwrap_or(0);
        let memory_hit = Arc::new(AtomicBool::new(false));
        let info_task = match (limits.memory_bytes, crate::native::pidfd_open(leader)) {
            (Some(limit), Ok(pidfd)) if leader > 0 => Some(tokio::spawn(watch_memory(
                leader,
                pidfd,
                limit,
                Arc::clone(&memory_hit),
            ))),
            _ => None,
        };
        Ok(Started {
            child,
            teardown: Arc::new(SessionTeardown { leader, memory_hit }),
            control_read,
            info_task,
            started,
            shell_style_signals: false,
        })
    }
}

/// The `none` backend: commands run with the server's uid, view and network (see the module
/// documentation). Only ever used when the operator asked for it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct NoneBackend;

impl crate::backend::Backend for NoneBackend {
    fn kind(&self) -> crate::BackendKind {
        crate::BackendKind::None
    }

    fn report(&self) -> crate::BackendReport {
        crate::BackendReport {
            backend: crate::BackendKind::None,
            isolation_active: false,
            details: vec![
                "no isolation: commands run with the server's host uid, filesystem view and network"
                    .into(),
                "policy mounts are ignored and the policy cwd is a host path".into(),
                "clean environment, stdin /dev/null, no inherited descriptors, own session".into(),
            ],
            limits: limit_reports(),
        }
    }

    crate::process::process_backend_methods!();

    /// Nothing is mounted: the command sees the host's paths.
    fn path_inside(&self, host: &std::path::Path, _dest: &std::path::Path) -> std::path::PathBuf {
        host.to_path_buf()
    }
}
