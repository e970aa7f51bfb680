//! The fork server: one-shot runs forked from a pre-initialised interpreter, each in a fresh
//! sandbox of its own.
//!
//! Starting bubblewrap and an interpreter for every run costs 25-40 ms of CPU, which caps two
//! cores at well under 100 runs a second. The fork server pays that once: an interpreter of one
//! environment, with the run module imported, waits in a sandbox, and each run's pid 1 is a
//! clone of it made straight into new namespaces, which joins the run's cgroup, attaches the
//! run's directories, mounts a fresh `/proc`, `/tmp` and `/dev/shm`, drops every capability
//! and installs a run's seccomp programs before it forks the run's code (`forkserver.py` has
//! the steps), and reports the run's end on a socket of its own. The server supervises the run as any other:
//! it owns the run's pipes and cgroup, so output caps, limits, time-outs and the kill path are
//! the same.
//!
//! **It holds no more than a run.** Everything the fork server's interpreter imports is code a
//! caller chose (an environment's `.pth` lines and `sitecustomize` run when it starts; a later
//! version preloads the environment's own modules), so its sandbox is a run's: bubblewrap
//! started as an unprivileged host uid leased for the fork server's lifetime, its own user
//! namespace (uid 65534, no capabilities), every other namespace new, no network, no-new-privs,
//! a cgroup with a run's limits, and a run's seccomp program with three exceptions that only
//! matter inside namespaces it makes itself ([`super::seccomp::Holder::ForkServer`]). It sees
//! no run directory: each run's directories reach it as detached mounts of that run's own
//! (`open_tree`), sent with the request together with the request itself (in a memfd that only
//! the forked child reads, so the fork server's memory never holds a run's data).
//!
//! **Pre-forked children.** With [`ForkServerSpec::prefork`] above 0, it keeps that many
//! children already forked into a run's fresh namespaces, each in a cgroup of its own with the
//! run limits the spec names, its `/tmp`, `/dev/shm`, devpts, `/proc`, counter shares and
//! loopback set up, waiting on a socket of its own for the one run it will serve. A run whose
//! limits match takes one: its request goes straight to that child, which attaches the run's
//! directories, drops its capabilities, installs the seccomp programs and forks the script,
//! so the call pays only for that and the code. A child has seen nothing of any run before
//! its own (it is made before the request, from the fork server, which holds no run's data),
//! serves exactly one, and is replaced off the call's path by a thread of its own, once the
//! run it served has ended (so that making it takes no CPU from that run). A run that finds
//! none ready (or whose limits differ) gets one made the same way at once. Dropping the fork
//! server (or its stopping) ends its waiting children and removes their cgroups.
//!
//! **Without root, or without cgroups.** A normal user's server runs its fork server as the
//! user (in the user and mount namespace the server made for itself, `own_mounts`, where it
//! may mount the run directories and make detached copies of them). Where no cgroup holds a
//! run's memory and processes (such a server without delegation; a root server on an
//! undelegated cgroup v2 unit), each child's pid 1 first sends the server a pidfd of itself
//! ([`Pid1`]): the run is killed through it, and the memory watchdog walks its tree; the
//! process limit is the run's own `RLIMIT_NPROC`, counted in its own user namespace. The fork
//! server's own bounds then count it and its runs together ([`OwnMemoryWatch`], and a process
//! limit set inside its user namespace), at its limit plus each run's it may serve at once.
//!
//! **What its runs share.** Every run it forks is its fork: the same interpreter memory (the
//! same hash seed, address layout and stack canary), and the fork server's host uid, under a
//! user namespace of its own nested in the fork server's. Per-user kernel counters (inotify
//! instances and watches) are charged to that uid, so each run gets an equal share of them
//! (the host's per-user limit divided by the concurrency cap plus one) and a run that takes
//! all of its share leaves the others theirs. What an environment's own code does in
//! the fork server, it could do in each of that environment's runs anyway; a fork server
//! serves one environment.

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::{NativeBackend, NativeTeardown, join_file, pidfd_kill, pidfd_open, policy};
use crate::cgroup::{CgroupSet, RunCgroup};
use crate::child::{Rlimit, RlimitKind, memfd_with, pipe, rlimits_for};
use crate::error::{SandboxError, SpawnError};
use crate::supervise::{AbortOnDrop, DirectChild, outcome, supervise};
use crate::{Identity, IdentityLease, Limits, Mount, Outcome, OutputChunk, Policy};

/// The tmpfs of the run directories: scripts and the runner only (input files and the run's
/// own files are in each run's capped scratch mount below it).
const RUNS_ROOT_OPTIONS: &str = "mode=0755,size=1g,nr_inodes=1048576";
/// Where the fork server's own program appears inside its sandbox (read-only).
const FILES_INSIDE: &str = "/run/snakebox/forkserver";
/// An empty mount point each run builds its fresh `/tmp` on (see `forkserver.py`).
const SPARE_INSIDE: &str = "/run/snakebox/spare";
/// The fork server program.
const SOURCE: &str = include_str!("forkserver.py");
/// How long the fork server may take to start (import its modules) before we give up on it.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// The same when it preloads packages: importing them at its small CPU share takes longer.
const READY_TIMEOUT_PRELOADING: Duration = Duration::from_secs(90);
/// How a failed setup is reported (no user code ran).
const SETUP_FAILED: &str = "the run's sandbox could not be set up";
/// How long a killed run's end may take to be reported.
const KILLED_REPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest message from the fork server.
const MESSAGE_MAX: usize = 64 * 1024;
/// Pre-forked children a fork server may keep at most ([`ForkServerSpec::prefork`]).
pub const MAX_PREFORK: usize = 16;
/// The niceness of the thread that makes pre-forked children (a run's work goes first).
const MAKER_NICE: libc::c_int = 10;
/// How long the refill waits after a failed attempt to make a pre-forked child.
const SPARE_RETRY: Duration = Duration::from_secs(1);

/// The CPU a fork server may use (thousandths of a core): a fork costs it well under a
/// millisecond, so this serves hundreds of runs a second, while code of its environment that
/// keeps running in it (a thread a `.pth` line started) can take no more than this.
const FORK_SERVER_MILLICORES: u64 = 250;

/// The fork server's own share of the per-user kernel counters of its uid, besides one per run
/// it may serve at once.
const SHARES_EXTRA: u64 = 1;

/// Descriptors the fork server's bwrap command needs (see `NativeBackend::prepare`).
pub(crate) struct ZygoteSetup {
    /// Its end of the request socket (fd 3 inside).
    pub(crate) socket: OwnedFd,
    /// Mount points each run attaches its directories on.
    pub(crate) mount_points: Vec<PathBuf>,
}

/// How a forked run ended: `Exit` and `Fail` as its pid 1 reports them, `Gone` and `Fail`
/// as the fork server does.
#[derive(Debug, PartialEq, Eq)]
enum Report {
    /// The run's wait status (of its pid 2, the script's process).
    Exit(i32),
    /// Its setup failed before user code ran (or the fork server could not clone it).
    Fail(String),
    /// The run's pid 1 was reaped (its wait status): it ended without a report, killed with
    /// the run.
    Gone(i32),
}

type Waiters = Arc<Mutex<HashMap<u64, oneshot::Sender<Report>>>>;

/// A pre-forked child waiting for its run (see the module documentation).
#[derive(Debug)]
struct Spare {
    id: u64,
    /// Our end of its socket: its run's request is sent here.
    socket: OwnedFd,
    /// Its cgroup, made with [`Spares::limits`]: the run's once taken (`None` without
    /// cgroups: the run is then killed and watched through [`Spare::pid1`]).
    cgroup: Option<RunCgroup>,
    /// Its pid 1, when there is no cgroup to kill and watch the run through.
    pid1: Option<Pid1>,
    /// Its cgroup's attachment to its run's CPU share, once taken (see [`ForkRun::cpu`]).
    cpu: Option<crate::CpuAttachment>,
}

/// A run's pid 1, as the server holds it where no cgroup does: a pidfd (killing it kills the
/// whole PID namespace, and a signal through it never reaches a later process of that pid)
/// and its pid here (the root of the memory watchdog's walk).
#[derive(Debug)]
struct Pid1 {
    pidfd: OwnedFd,
    pid: i32,
}

/// The pre-forked children of one fork server, and what keeps them made.
#[derive(Debug)]
struct Spares {
    state: Mutex<SpareState>,
    changed: Condvar,
    /// How many to keep ready.
    target: usize,
    /// The limits they are made with: a run takes one only if its limits match.
    limits: Limits,
    /// What every one is told (`forkserver.py`: `fork <n> <json>`).
    spec: String,
    /// Whether runs are killed and watched through their pid 1 ([`Pid1`]): the server's
    /// cgroups (if any) do not hold both their memory and their processes.
    by_pid1: bool,
    /// Runs served by one.
    served: AtomicU64,
}

#[derive(Debug, Default)]
struct SpareState {
    ready: VecDeque<Spare>,
    /// Ones that ended (or failed to set up) before any run was handed to them.
    dead: HashSet<u64>,
    /// Taken ones whose runs have not ended: each is replaced when its run ends, so that
    /// making its replacement does not take CPU from the run.
    in_flight: usize,
    stopping: bool,
}

/// A taken pre-forked child's place: its replacement is made once this is dropped (when its
/// run has ended, however it ends).
struct InFlight<'a>(&'a Spares);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        drop(state);
        self.0.changed.notify_all();
    }
}

impl Spares {
    fn lock(&self) -> std::sync::MutexGuard<'_, SpareState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a run with `limits` may take one: the same cgroup limits and scratch size.
    fn fits(&self, limits: &Limits) -> bool {
        self.limits.memory_bytes == limits.memory_bytes
            && self.limits.max_processes == limits.max_processes
            && self.limits.cpu_millicores == limits.cpu_millicores
            && self.limits.scratch_bytes == limits.scratch_bytes
    }

    /// Stop keeping them, and end those waiting (their sockets close, their cgroups go).
    fn stop(&self) {
        let ready = {
            let mut state = self.lock();
            state.stopping = true;
            std::mem::take(&mut state.ready)
        };
        self.changed.notify_all();
        drop(ready);
    }
}

/// What the fork server is started with.
#[derive(Debug, Clone)]
pub struct ForkServerSpec {
    /// The sandbox of the fork server: the environment's mounts, variables and limits, as for
    /// a run of that environment (its `identity` and `network` are ignored: it runs as a uid
    /// leased for it, never with network).
    pub policy: Policy,
    /// The interpreter, as seen inside.
    pub python: PathBuf,
    /// Source of the module each run executes: the fork server imports it once, and each run
    /// calls its `main()` with `sys.argv` set to the run's `argv`.
    pub module_source: String,
    /// Where the server keeps run directories (`<data>/runs/<server pid>`): the fork server's
    /// own program is written below it (its runs' directories reach it as detached mounts).
    pub runs_root: PathBuf,
    /// Where runs mount their directories inside (created empty in the fork server's view).
    pub mount_points: Vec<PathBuf>,
    /// How many runs it may serve at once: each gets an equal share of the per-user kernel
    /// counters charged to the fork server's uid.
    pub concurrent_runs: usize,
    /// Distributions of the environment whose top-level modules the fork server imports
    /// before it serves, so that a forked run finds them in memory (empty: none). Their
    /// import-time code runs in the fork server's sandbox, under its limits.
    pub preload: Vec<String>,
    /// Modules (dotted names) it imports after those: what recent runs of the environment
    /// imported (the engine learns them; names only, checked to be identifiers). Their
    /// import-time code runs in the fork server's sandbox too.
    pub modules: Vec<String>,
    /// Children kept already forked into a run's sandbox, waiting for a run (0: none; at
    /// most [`MAX_PREFORK`]). They are made with `policy.limits`: runs with other memory,
    /// process, CPU or scratch limits are forked when they come.
    pub prefork: usize,
}

/// One run for the fork server. It runs as the fork server's identity
/// ([`ForkServer::host_ids`] must own its writable directories).
#[derive(Debug, Clone)]
pub struct ForkRun {
    /// The run's own directories (host paths, each attached at its destination).
    pub mounts: Vec<Mount>,
    /// Its limits (`wall_time` counts from the request).
    pub limits: Limits,
    /// `sys.argv` of the module's `main()`; `argv[0]`'s directory is `sys.path[0]`.
    pub argv: Vec<String>,
    /// Working directory inside.
    pub cwd: PathBuf,
    /// The CPU share the run's cgroup is attached to from the moment it takes its child (a
    /// pre-forked one waits at the background weight before); `None`: the default weight.
    pub cpu: Option<crate::CpuShare>,
}

/// A running fork server; see the module documentation. Dropping it stops it.
#[derive(Debug)]
pub struct ForkServer {
    /// A pidfd of its bwrap (killed when this is dropped).
    process: OwnedFd,
    /// bwrap's `--info-fd` pipe: kept open (bwrap dies of SIGPIPE when it cannot write it).
    _info: OwnedFd,
    socket: OwnedFd,
    waiters: Waiters,
    alive: Arc<AtomicBool>,
    /// The server's cgroups, when it has them; `None`: a normal user's server without
    /// delegation, where each run is killed through its pid 1 and its memory is watched
    /// ([`Pid1`]), and the fork server's own memory by a watchdog of its own.
    cgroups: Option<Arc<CgroupSet>>,
    /// Its own cgroup (a run's limits), killed and removed when it stops.
    cgroup: Option<RunCgroup>,
    /// The modules it imported before serving (see [`ForkServerSpec::preload`]).
    preloaded: Vec<String>,
    /// Its host uid, for its lifetime (its runs have it too).
    lease: IdentityLease,
    /// Each run's share of the per-user kernel counters (`/proc/sys/user` name, value).
    user_limits: Vec<(&'static str, u64)>,
    /// Each run's share of the message-queue and pending-signal limits.
    run_rlimits: Vec<Rlimit>,
    files: PathBuf,
    next: Arc<AtomicU64>,
    /// Its pre-forked children.
    spares: Arc<Spares>,
}

impl NativeBackend {
    /// Start a fork server (see the module documentation) as `lease`'s host uid, which it
    /// keeps for its lifetime. Blocks until it is ready (it has imported its modules), at most
    /// [`READY_TIMEOUT`].
    pub(crate) fn start_fork_server(
        &self,
        spec: &ForkServerSpec,
        lease: IdentityLease,
    ) -> Result<ForkServer, SandboxError> {
        let fail = |message: String| fork_server_error(message, true);
        if !self.drop_privileges && !crate::own_mounts::entered() {
            return Err(fail(
                "a normal user's fork server needs the server in a user and mount namespace \
                 of its own (to mount its runs' directories), and the kernel refused it one"
                    .into(),
            ));
        }
        if self.drop_privileges && !matches!(lease.identity(), Identity::Leased(_)) {
            return Err(fail("no host uid of its own is free".into()));
        }
        let cgroups = self.cgroups.clone();
        let files = write_files(&spec.runs_root, &spec.module_source)
            .map_err(|err| fail(format!("could not write its program: {err}")))?;
        let (ours, theirs) =
            seqpacket_pair().map_err(|err| fail(format!("could not make its socket: {err}")))?;

        let mut policy = spec.policy.clone();
        policy.network = false;
        policy.identity = lease.identity();
        let pids_by_cgroup = cgroups
            .as_ref()
            .is_some_and(|set| set.pids_mechanism().is_some());
        let memory_by_cgroup = cgroups
            .as_ref()
            .is_some_and(|set| set.memory_mechanism().is_some());
        // Without a pids cgroup, its process limit is a count in its own user namespace,
        // which every run's processes count in too (each run's own is in the run's
        // namespace): room for each run it may serve at once, and for itself.
        // Without a cgroup that holds both, each run is killed and watched through its pid 1.
        let by_pid1 = !memory_by_cgroup || !pids_by_cgroup;
        let whole = shares(spec.concurrent_runs);
        if !pids_by_cgroup {
            policy.limits.max_processes =
                policy.limits.max_processes.map(|n| n.saturating_mul(whole));
        }
        policy.mounts.push(Mount {
            host: files.clone(),
            dest: FILES_INSIDE.into(),
            writable: false,
        });
        let inside = Path::new(FILES_INSIDE);
        // The distributions and modules to preload travel on its command line, not in its
        // environment: a process's start-up environment stays readable in /proc/<pid>/environ
        // of every fork, and a run's must be a cold run's.
        let mut args: Vec<std::ffi::OsString> = vec![
            "-s".into(),
            inside.join("forkserver.py").into_os_string(),
            policy::CONTROL_FD.to_string().into(),
            inside.join("module.py").into_os_string(),
            spec.preload.join(",").into(),
            spec.modules.join(",").into(),
        ];
        args.extend(
            policy::FORKED_RUN_PROGRAM_FDS
                .iter()
                .map(|fd| fd.to_string().into()),
        );
        let command = crate::SandboxCommand {
            program: spec.python.clone(),
            args,
            control_channel: false,
            init: false,
        };
        let setup = ZygoteSetup {
            socket: theirs,
            mount_points: spec
                .mount_points
                .iter()
                .cloned()
                .chain([PathBuf::from(SPARE_INSIDE)])
                .collect(),
        };
        // Its own cgroup, with a run's limits: what its interpreter imports is caller-chosen
        // code, bounded like a run's. Its CPU share is smaller: it lives on between calls,
        // and all it does then is fork (a run's own CPU is charged to the run's cgroup).
        let cgroup = cgroups
            .as_ref()
            .map(|set| {
                set.create_run(&Limits {
                    cpu_millicores: Some(
                        policy
                            .limits
                            .cpu_millicores
                            .map_or(FORK_SERVER_MILLICORES, |run| {
                                run.min(FORK_SERVER_MILLICORES)
                            }),
                    ),
                    ..policy.limits.clone()
                })
            })
            .transpose()?;
        let mut prepared = self.prepare(&policy, &command, cgroup.as_ref(), Some(setup))?;
        prepared
            .command
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let (pidfd, process_pid, stderr) =
            spawn_kept(prepared.command).map_err(|source| SpawnError::Start {
                program: self.bwrap.clone(),
                source,
            })?;
        drop(prepared.keep_until_spawned);
        // What it prints goes to our log; the last of it explains a failed start.
        let said = Arc::new(Mutex::new(String::new()));
        if let Some(stderr) = stderr {
            let said = Arc::clone(&said);
            std::thread::spawn(move || log_stderr(stderr, &said));
        }

        let mut server = ForkServer {
            process: pidfd,
            _info: prepared.info_read,
            socket: ours,
            waiters: Arc::new(Mutex::new(HashMap::new())),
            alive: Arc::new(AtomicBool::new(false)),
            cgroups,
            cgroup,
            preloaded: Vec::new(),
            lease,
            user_limits: user_limit_shares(shares(spec.concurrent_runs)),
            run_rlimits: rlimit_shares(shares(spec.concurrent_runs)),
            files,
            next: Arc::new(AtomicU64::new(1)),
            spares: Arc::new(Spares {
                state: Mutex::new(SpareState::default()),
                changed: Condvar::new(),
                target: spec.prefork.min(MAX_PREFORK),
                // A run's limits, as the spec gave them (not the fork server's own).
                limits: spec.policy.limits.clone(),
                spec: child_spec(
                    policy.limits.scratch_bytes,
                    &user_limit_shares(shares(spec.concurrent_runs)),
                    by_pid1,
                ),
                by_pid1,
                served: AtomicU64::new(0),
            }),
        };
        let reader = server
            .socket
            .try_clone()
            .map_err(|err| fail(format!("could not share its socket: {err}")))?;
        let timeout = if spec.preload.is_empty() && spec.modules.is_empty() {
            READY_TIMEOUT
        } else {
            READY_TIMEOUT_PRELOADING
        };
        match wait_ready(&reader, &server.process, timeout) {
            Ok(preloaded) => server.preloaded = preloaded,
            Err(reason) => {
                drop(server);
                // (Its last words reach the log thread right after it dies.)
                std::thread::sleep(Duration::from_millis(100));
                let said = said.lock().unwrap_or_else(PoisonError::into_inner).clone();
                let said = said.trim();
                return Err(fail(if said.is_empty() {
                    reason
                } else {
                    format!("{reason}; it said: {}", tail(said, 2000))
                }));
            }
        }
        server.alive.store(true, Ordering::SeqCst);
        if let (false, Some(limit)) = (memory_by_cgroup, policy.limits.memory_bytes) {
            // Its own memory and its runs' together: each run's alone is its own watchdog's.
            let watched = OwnMemoryWatch {
                process: server
                    .process
                    .try_clone()
                    .map_err(|err| fail(format!("could not share its pidfd: {err}")))?,
                pid: process_pid,
                limit: limit.saturating_mul(whole),
                alive: Arc::clone(&server.alive),
            };
            std::thread::Builder::new()
                .name("snakebox-forkserver-memory".into())
                .spawn(move || watched.keep_watching())
                .map_err(|err| fail(format!("could not start its memory watchdog: {err}")))?;
        }
        let waiters = Arc::clone(&server.waiters);
        let alive = Arc::clone(&server.alive);
        let spares = Arc::clone(&server.spares);
        std::thread::Builder::new()
            .name("snakebox-forkserver".into())
            .spawn(move || read_reports(&reader, &waiters, &alive, &spares))
            .map_err(|err| fail(format!("could not start its reader: {err}")))?;
        if server.spares.target > 0 {
            let maker = SpareMaker {
                socket: server
                    .socket
                    .try_clone()
                    .map_err(|err| fail(format!("could not share its socket: {err}")))?,
                cgroups: server.cgroups.clone(),
                next: Arc::clone(&server.next),
                alive: Arc::clone(&server.alive),
                spares: Arc::clone(&server.spares),
            };
            std::thread::Builder::new()
                .name("snakebox-prefork".into())
                .spawn(move || {
                    // Its work may wait for that of runs in flight (see `SpareMaker::make`).
                    // SAFETY: setpriority(2) on this thread only; no memory is involved.
                    unsafe {
                        let thread = libc::id_t::try_from(libc::gettid()).unwrap_or(0);
                        libc::setpriority(libc::PRIO_PROCESS, thread, MAKER_NICE);
                    }
                    maker.keep_filled();
                })
                .map_err(|err| fail(format!("could not start its pre-forking thread: {err}")))?;
        }
        Ok(server)
    }
}

/// What the fork server is told of a child it forks (`fork <n> <json>`): the sizes of its fresh
/// `/tmp` and `/dev/shm`, its share of the per-user counters, and whether its pid 1 sends us
/// a pidfd of itself (`pidfd`: where no cgroup holds the run). Nothing of any run.
fn child_spec(
    scratch_bytes: Option<u64>,
    user_limits: &[(&'static str, u64)],
    pidfd: bool,
) -> String {
    serde_json::json!({
        "tmpfs": [["/tmp", scratch_bytes], ["/dev/shm", scratch_bytes]],
        "user_limits": user_limits,
        "pidfd": pidfd,
    })
    .to_string()
}

/// How long a new child's pid 1 may take to send its pidfd (it is the first thing it does).
const PID1_TIMEOUT: Duration = Duration::from_secs(5);

/// Receive a child's pid 1 on `socket`: the `pid1` message with a pidfd of itself, which must
/// name a live process that is pid 1 of its own PID namespace (the child's is new).
fn receive_pid1(socket: &OwnedFd) -> Result<Pid1, String> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut poll = [nix::poll::PollFd::new(
        socket.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    let millis = nix::poll::PollTimeout::try_from(PID1_TIMEOUT.as_millis())
        .unwrap_or(nix::poll::PollTimeout::MAX);
    match nix::poll::poll(&mut poll, millis) {
        Ok(n) if n > 0 => {}
        _ => return Err(format!("its pid 1 said nothing within {PID1_TIMEOUT:?}")),
    }
    let mut buf = [0u8; 64];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let received = recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|err| format!("its pid 1's message: {err}"))?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for message in received
        .cmsgs()
        .map_err(|err| format!("its pid 1's message: {err}"))?
    {
        if let ControlMessageOwned::ScmRights(raw) = message {
            // SAFETY: descriptors just received are ours alone.
            fds.extend(
                raw.into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    let said = received
        .iovs()
        .next()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default();
    if said != "pid1" || fds.len() != 1 {
        // Its set-up failed before it could say (`fail <reason>`), or it said something else.
        return Err(if let Some(reason) = said.strip_prefix("fail ") {
            reason.to_string()
        } else {
            "its pid 1 did not send its pidfd".into()
        });
    }
    let pidfd = fds.remove(0);
    let pid = pid1_of(&pidfd).ok_or("the pidfd its pid 1 sent is not of a pid 1")?;
    Ok(Pid1 { pidfd, pid })
}

/// The pid (here) of the process behind `pidfd`, if it lives and is pid 1 of its own PID
/// namespace (`/proc/self/fdinfo`'s `Pid` and `NSpid` lines).
fn pid1_of(pidfd: &OwnedFd) -> Option<i32> {
    let info = fs_err::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd())).ok()?;
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name))
            .map(str::split_whitespace)
    };
    let pid: i32 = field("Pid:")?.next()?.parse().ok()?;
    let innermost: i32 = field("NSpid:")?.last()?.parse().ok()?;
    (pid > 0 && innermost == 1).then_some(pid)
}

/// The memory watchdog of a fork server without a memory cgroup: the whole tree of its
/// sandbox (its interpreter, what that started, and its runs) may hold its own limit and each
/// run's it may serve at once; above that it is killed, runs and all, as an OOM kill of its
/// cgroup would. Each run is held to its own limit by the run's watchdog first.
struct OwnMemoryWatch {
    process: OwnedFd,
    pid: i32,
    limit: u64,
    alive: Arc<AtomicBool>,
}

/// How often [`OwnMemoryWatch`] samples (its tree holds every run's processes too, which the
/// runs' own watchdogs sample more often).
const OWN_MEMORY_INTERVAL: Duration = Duration::from_millis(500);

impl OwnMemoryWatch {
    fn keep_watching(self) {
        while self.alive.load(Ordering::SeqCst) && crate::watchdog::pidfd_alive(&self.process) {
            if crate::watchdog::tree_anon_bytes(self.pid) > self.limit {
                tracing::warn!(
                    limit = self.limit,
                    "a fork server's sandbox held more memory than its limit; it is stopped"
                );
                pidfd_kill(&self.process);
                return;
            }
            std::thread::sleep(OWN_MEMORY_INTERVAL);
        }
    }
}

/// The CPU weight a child is made at ([`fork_child`]).
enum MadeFor<'a> {
    /// Ahead of its run, at the background weight: runs in flight go first.
    Later,
    /// A run now, attached to the run's CPU share (`None`: the default weight).
    Now(Option<&'a crate::CpuShare>),
}

/// Ask the fork server (on `socket`) for a child in a new cgroup with `limits`, its run's pid 1
/// in fresh namespaces (`forkserver.py`), told `spec`, at the CPU weight `made_for` says. Its
/// id is `next`'s.
fn fork_child(
    socket: &OwnedFd,
    cgroups: Option<&CgroupSet>,
    id: u64,
    limits: &Limits,
    spec: &str,
    made_for: &MadeFor<'_>,
    by_pid1: bool,
) -> Result<Spare, String> {
    let cgroup = cgroups
        .map(|set| set.create_run(limits))
        .transpose()
        .map_err(|err| format!("its cgroup: {err}"))?;
    let mut attached = None;
    match (made_for, &cgroup) {
        (MadeFor::Later, Some(cgroup)) => cgroup
            .set_background(true)
            .map_err(|err| format!("its cgroup: {err}"))?,
        (MadeFor::Later, None) => {}
        (MadeFor::Now(cpu), cgroup) => attached = super::attach_cpu(cgroup.as_ref(), *cpu),
    }
    let mut fds = Vec::new();
    let (ours, theirs) = seqpacket_pair().map_err(|err| format!("its socket: {err}"))?;
    fds.push(theirs);
    for file in cgroup.iter().flat_map(RunCgroup::procs_files) {
        let path = join_file(&file);
        let opened = fs_err::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|err| format!("its cgroup: {err}"))?;
        fds.push(OwnedFd::from(opened.into_parts().0));
    }
    send_with_fds(socket, format!("fork {id} {spec}").as_bytes(), &fds)
        .map_err(|err| format!("the request to the fork server: {err}"))?;
    // Our copies go: the child's socket then ends when the child does (or was never made).
    drop(fds);
    // Without a cgroup to kill and watch the run through (or with one that holds only some
    // limits), its pid 1 is what is killed and watched.
    let pid1 = if by_pid1 {
        Some(receive_pid1(&ours)?)
    } else {
        None
    };
    Ok(Spare {
        id,
        socket: ours,
        cgroup,
        pid1,
        cpu: attached,
    })
}

/// The fork server's own rlimits: a run's, without the CPU-time limit (which would end it
/// after that much CPU over its whole life). Its memory is its cgroup's or its watchdog's
/// ([`OwnMemoryWatch`]), never `RLIMIT_AS`, which every run would inherit and none could raise.
pub(crate) fn rlimits(limits: &Limits, processes: bool) -> Vec<Rlimit> {
    let without_cpu = Limits {
        cpu_time: None,
        ..limits.clone()
    };
    rlimits_for(&without_cpu, false, processes)
}

/// Each run's share of the server's own message-queue and pending-signal limits (what a
/// cold run inherits whole): the kernel counts them for the fork server's uid across all its
/// runs.
fn rlimit_shares(shares: u64) -> Vec<Rlimit> {
    [RlimitKind::Msgqueue, RlimitKind::Sigpending]
        .into_iter()
        .filter_map(|kind| {
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: getrlimit fills the struct we own.
            let ok = unsafe { libc::getrlimit(kind.resource(), &mut limit) } == 0;
            let share = (limit.rlim_cur / shares).max(1);
            (ok && limit.rlim_cur != libc::RLIM_INFINITY).then_some(Rlimit {
                kind,
                soft: share,
                hard: share,
            })
        })
        .collect()
}

/// How many equal shares the per-user kernel counters of a fork server's uid are cut into:
/// one per run it may serve at once, and its own.
fn shares(concurrent_runs: usize) -> u64 {
    u64::try_from(concurrent_runs)
        .unwrap_or(u64::MAX)
        .saturating_add(SHARES_EXTRA)
        .max(1)
}

/// Each run's share of the per-user inotify limits, which the kernel counts for the fork
/// server's uid across all its runs, up to the host's per-user limits.
fn user_limit_shares(shares: u64) -> Vec<(&'static str, u64)> {
    [
        (
            "max_inotify_instances",
            "/proc/sys/fs/inotify/max_user_instances",
        ),
        (
            "max_inotify_watches",
            "/proc/sys/fs/inotify/max_user_watches",
        ),
    ]
    .into_iter()
    .filter_map(|(name, host)| {
        let total: u64 = fs_err::read_to_string(host).ok()?.trim().parse().ok()?;
        Some((name, (total / shares).max(1)))
    })
    .collect()
}

/// What makes a fork server's pre-forked children, on a thread of its own (off every call's
/// path).
struct SpareMaker {
    socket: OwnedFd,
    cgroups: Option<Arc<CgroupSet>>,
    next: Arc<AtomicU64>,
    alive: Arc<AtomicBool>,
    spares: Arc<Spares>,
}

impl SpareMaker {
    /// Keep [`Spares::target`] children ready until the fork server stops.
    fn keep_filled(self) {
        loop {
            let mut gone = Vec::new();
            {
                let mut state = self.spares.lock();
                loop {
                    // Those that ended before their run are replaced.
                    let SpareState { ready, dead, .. } = &mut *state;
                    let (ended, waiting): (VecDeque<Spare>, VecDeque<Spare>) =
                        std::mem::take(ready)
                            .into_iter()
                            .partition(|spare| dead.contains(&spare.id));
                    *ready = waiting;
                    for spare in &ended {
                        dead.remove(&spare.id);
                    }
                    gone.extend(ended);
                    if state.stopping
                        || !self.alive.load(Ordering::SeqCst)
                        || state.ready.len() + state.in_flight < self.spares.target
                    {
                        break;
                    }
                    state = self
                        .spares
                        .changed
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                if state.stopping || !self.alive.load(Ordering::SeqCst) {
                    break;
                }
            }
            // A child whose set-up failed said why on its socket. What makes a set-up fail (a
            // host limit, a broken environment) seldom goes at once: the next one waits.
            let failed: Vec<String> = gone
                .iter()
                .filter_map(|spare| setup_failure_said(&spare.socket))
                .collect();
            drop(gone);
            if let Some(reason) = failed.first() {
                tracing::warn!(
                    %reason,
                    failed = failed.len(),
                    "a pre-forked child's set-up failed; the next is made in {SPARE_RETRY:?}"
                );
                if !self.pause(SPARE_RETRY) {
                    break;
                }
            }
            match self.make() {
                Ok(spare) => {
                    let mut state = self.spares.lock();
                    if state.stopping {
                        drop(state);
                        drop(spare);
                        break;
                    }
                    state.ready.push_back(spare);
                }
                Err(message) => {
                    tracing::warn!(%message, "could not pre-fork a run's sandbox");
                    if !self.pause(SPARE_RETRY) {
                        break;
                    }
                }
            }
        }
        self.spares.stop();
    }

    /// Wait `how_long` unless the fork server stops first; whether to go on.
    fn pause(&self, how_long: Duration) -> bool {
        let until = Instant::now() + how_long;
        let mut state = self.spares.lock();
        loop {
            if state.stopping || !self.alive.load(Ordering::SeqCst) {
                return false;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return true;
            }
            state = self
                .spares
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Make one: its cgroup (at a small CPU share: runs in flight go first; the share is the
    /// default again once a run takes it), its socket, and the request to the fork server.
    fn make(&self) -> Result<Spare, String> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        fork_child(
            &self.socket,
            self.cgroups.as_deref(),
            id,
            &self.spares.limits,
            &self.spares.spec,
            &MadeFor::Later,
            self.spares.by_pid1,
        )
    }
}

impl ForkServer {
    /// Whether it is still serving.
    #[must_use]
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// The host uid and gid it and every run it forks have: the owner a run's writable
    /// directories must have.
    #[must_use]
    pub fn host_ids(&self) -> Option<(u32, u32)> {
        self.lease.host_ids()
    }

    /// The modules it imported before serving, besides the run module.
    #[must_use]
    pub fn preloaded(&self) -> &[String] {
        &self.preloaded
    }

    /// The most memory its cgroup has been charged (its interpreter, what it preloaded, and
    /// the page cache of files it read), when the cgroup counts it: what it costs the host.
    #[must_use]
    pub fn peak_memory_bytes(&self) -> Option<u64> {
        self.cgroup.as_ref()?.usage().peak_memory_bytes
    }

    /// Pre-forked children waiting for a run now.
    #[must_use]
    pub fn prefork_ready(&self) -> usize {
        self.spares.lock().ready.len()
    }

    /// Runs served by a pre-forked child since it started.
    #[must_use]
    pub fn preforked_runs(&self) -> u64 {
        self.spares.served.load(Ordering::Relaxed)
    }

    /// Take a pre-forked child for a run with `limits`, if one is ready and fits, with the
    /// run's waiter registered under its id (before any report of it can be read), its cgroup
    /// attached to the run's CPU share `cpu` (or back at the default weight).
    fn take_spare(
        &self,
        limits: &Limits,
        cpu: Option<&crate::CpuShare>,
    ) -> Option<(Spare, oneshot::Receiver<Report>)> {
        if self.spares.target == 0 || !self.spares.fits(limits) {
            return None;
        }
        // Waiters first, then spares: the order `read_reports` takes them in.
        let mut waiters = self.lock_waiters();
        let spare = {
            let mut state = self.spares.lock();
            let mut taken = None;
            while let Some(spare) = state.ready.pop_front() {
                if state.dead.remove(&spare.id) {
                    continue;
                }
                taken = Some(spare);
                break;
            }
            if taken.is_some() {
                state.in_flight += 1;
            }
            taken
        };
        let mut spare = spare?;
        // It waited at the background weight; its run has its holder's (or the default).
        let claimed = match (spare.cgroup.as_ref(), cpu) {
            (None, _) => Ok(None),
            (Some(cgroup), Some(share)) if let Some(knob) = cgroup.cpu_knob() => {
                share.attach(knob, None).map(Some)
            }
            (Some(cgroup), _) => cgroup.set_background(false).map(|()| None),
        };
        match claimed {
            Ok(attached) => spare.cpu = attached,
            Err(err) => {
                // Its run would compete at a sixteenth of the CPU: the child is dropped (and
                // replaced), the run forked anew.
                tracing::warn!(%err, "a pre-forked child's CPU weight could not be set");
                drop(InFlight(&self.spares));
                return None;
            }
        }
        let (report_tx, report_rx) = oneshot::channel();
        waiters.insert(spare.id, report_tx);
        Some((spare, report_rx))
    }

    /// The identity of its runs (for a run that must be started another way after all).
    #[must_use]
    pub fn identity(&self) -> Identity {
        self.lease.identity()
    }

    /// Run one request in a fresh sandbox forked from the fork server, supervised like
    /// [`crate::Sandbox::run`]: `limits.wall_time` counts from now; the whole tree is killed on
    /// timeout, when `cancel` fires or when the future is dropped.
    ///
    /// # Errors
    /// When the run cannot be handed to the fork server or its setup fails (no user code ran).
    pub async fn run(
        &self,
        run: &ForkRun,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> Result<Outcome, SandboxError> {
        let fail = |message: String| fork_server_error(message, true);
        let desc = |what: &'static str| move |source| SpawnError::Descriptor { what, source };
        if !self.is_alive() {
            return Err(fail("it is not running".into()));
        }
        let started = Instant::now();
        let mut fds: Vec<OwnedFd> = Vec::new();
        let (stdout_read, stdout_write) = pipe().map_err(desc("stdout"))?;
        let (stderr_read, stderr_write) = pipe().map_err(desc("stderr"))?;
        let (control_read, control_write) = pipe().map_err(desc("control channel"))?;
        fds.extend([stdout_write, stderr_write, control_write]);
        // The run's own directories, as detached mounts: the fork server sees no others.
        let mut mounts = Vec::with_capacity(run.mounts.len());
        for mount in &run.mounts {
            mounts.push(
                detached_mount(&mount.host).map_err(|source| SpawnError::Path {
                    path: mount.host.clone(),
                    source,
                })?,
            );
        }
        // A pre-forked child when one fits, else one forked now (the same, made for this run).
        let mut spare = self.take_spare(&run.limits, run.cpu.as_ref());
        // Its replacement is made when this run ends (the guard goes with this call).
        let _in_flight = spare.is_some().then(|| InFlight(&self.spares));
        if spare.is_some() {
            self.spares.served.fetch_add(1, Ordering::Relaxed);
        }
        let preforked = spare.is_some();
        let (child, gone) = match spare.take() {
            Some(taken) => taken,
            // Forking waits for the child's pidfd (bounded): off the runtime worker's queue.
            None => crate::off_the_runtime(|| self.fork_now(&run.limits, run.cpu.as_ref()))?,
        };
        let pids_in_cgroup = child.cgroup.as_ref().is_some_and(RunCgroup::limits_pids);
        let memory_in_cgroup = child.cgroup.as_ref().is_some_and(RunCgroup::limits_memory);
        // Memory without a cgroup is the watchdog's (crate::watchdog), never RLIMIT_AS; the
        // process limit without one counts in the run's own user namespace.
        let mut rlimits = rlimits_for(&run.limits, false, !pids_in_cgroup);
        rlimits.extend(self.run_rlimits.iter().copied());
        let rlimits: Vec<serde_json::Value> = rlimits
            .iter()
            .map(|limit| {
                let value = |v: u64| {
                    if v == libc::RLIM_INFINITY {
                        -1
                    } else {
                        i64::try_from(v).unwrap_or(i64::MAX)
                    }
                };
                serde_json::json!([limit.kind.resource(), value(limit.soft), value(limit.hard)])
            })
            .collect();
        let scratch = run.limits.scratch_bytes;
        let request = serde_json::json!({
            "argv": run.argv,
            "cwd": run.cwd.to_string_lossy(),
            "mounts": mounts.len(),
            "targets": run
                .mounts
                .iter()
                .map(|m| serde_json::json!([m.dest.to_string_lossy(), m.writable]))
                .collect::<Vec<_>>(),
            "tmpfs": [["/tmp", scratch], ["/dev/shm", scratch]],
            "rlimits": rlimits,
        });
        fds.push(
            memfd_with(c"run-request", request.to_string().as_bytes())
                .map_err(desc("run request"))?,
        );
        fds.extend(mounts);
        // Handed to the child directly (its pid 2 takes it): the fork server never sees it.
        if let Err(err) = send_with_fds(&child.socket, b"run", &fds) {
            self.lock_waiters().remove(&child.id);
            if preforked {
                // It ended before its run (its socket is closed): fork one now instead.
                tracing::debug!(%err, "a pre-forked child was gone");
                self.spares.served.fetch_sub(1, Ordering::Relaxed);
                return Box::pin(self.run(run, cancel, output)).await;
            }
            // Its set-up failed before the run reached it: its pid 1 said why.
            let said = setup_failure_said(&child.socket).unwrap_or_else(|| err.to_string());
            return Err(fail(format!("{SETUP_FAILED}: {said}")));
        }
        let Spare {
            socket,
            cgroup,
            pid1,
            cpu,
            ..
        } = child;
        let (sandbox_pidfd, sandbox_pid) = match pid1 {
            Some(Pid1 { pidfd, pid }) => (Some(pidfd), pid),
            None => (None, 0),
        };
        // SAFETY: an OwnedFd keeps its one descriptor open until the AsyncFd drops it.
        let socket = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(socket, tokio::io::Interest::READABLE)
        }
        .map_err(|err| desc("report socket")(err.into_parts().1))?;
        let teardown = Arc::new(NativeTeardown {
            sandbox_pidfd: Mutex::new(sandbox_pidfd),
            sandbox_pid: AtomicI32::new(sandbox_pid),
            cgroup,
            cpu: Mutex::new(cpu),
            // Memory is the cgroup's where it counts it, else the watchdog's over pid 1's tree
            // (below). A run forked here reports its own start failures.
            memory_watch: run.limits.memory_bytes.filter(|_| !memory_in_cgroup),
            memory_hit: std::sync::atomic::AtomicBool::new(false),
            command_ran: std::sync::atomic::AtomicBool::new(true),
            // Released off the runtime (below): the run's namespaces end there.
            namespaces: Some(Mutex::new(Vec::new())),
            all_dying: AtomicBool::new(false),
        });
        drop(fds);
        let receiver = |fd: OwnedFd, what: &'static str| {
            tokio::net::unix::pipe::Receiver::from_owned_fd(fd).map_err(desc(what))
        };
        let stdout = receiver(stdout_read, "stdout")?;
        let stderr = receiver(stderr_read, "stderr")?;
        let child = Forked {
            socket: Some(socket),
            gone: Some(gone),
            killed: false,
            teardown: teardown.clone(),
        };
        // Ends with this call, however it ends (the future may be dropped).
        let watchdog = teardown.memory_watch.is_some().then(|| {
            let teardown = Arc::clone(&teardown);
            AbortOnDrop(tokio::spawn(async move {
                let mut tick = tokio::time::interval(crate::watchdog::INTERVAL);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                while !teardown.memory_hit.load(Ordering::SeqCst) {
                    tick.tick().await;
                    teardown.check_memory();
                }
            }))
        });
        let raw = supervise(
            child,
            Some(stdout),
            Some(stderr),
            Some(control_read),
            &run.limits,
            cancel,
            output,
            teardown.as_ref(),
            started,
        )
        .await;
        drop(watchdog);
        let memory_hit = crate::supervise::Teardown::memory_exceeded(teardown.as_ref());
        let usage = crate::supervise::Teardown::usage(teardown.as_ref());
        let raw = raw.map_err(|err| match err {
            SpawnError::Wait { source, .. } if source.kind() == std::io::ErrorKind::Other => {
                let message = source.to_string();
                let before_user_code = message.starts_with(SETUP_FAILED);
                fork_server_error(message, before_user_code)
            }
            other => other.into(),
        })?;
        tokio::task::spawn_blocking(move || crate::supervise::Teardown::release(teardown.as_ref()));
        // The report is the script process's own wait status: an exit code is an exit code.
        Ok(outcome(raw, &run.limits, false, memory_hit, usage))
    }

    /// A child forked now for a run with `limits` (none of the pre-forked ones fits or is
    /// ready), with what the fork server says when it reaps it registered first.
    fn fork_now(
        &self,
        limits: &Limits,
        cpu: Option<&crate::CpuShare>,
    ) -> Result<(Spare, oneshot::Receiver<Report>), SandboxError> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (gone_tx, gone_rx) = oneshot::channel();
        self.lock_waiters().insert(id, gone_tx);
        let by_pid1 = self.spares.by_pid1;
        let spec = child_spec(limits.scratch_bytes, &self.user_limits, by_pid1);
        match fork_child(
            &self.socket,
            self.cgroups.as_deref(),
            id,
            limits,
            &spec,
            &MadeFor::Now(cpu),
            by_pid1,
        ) {
            Ok(child) => Ok((child, gone_rx)),
            Err(message) => {
                self.lock_waiters().remove(&id);
                Err(fork_server_error(
                    format!("could not fork the run's sandbox: {message}"),
                    true,
                ))
            }
        }
    }

    fn lock_waiters(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<Report>>> {
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for ForkServer {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::SeqCst);
        // Its keeper thread reaps it; anything it left in its cgroup is killed when the
        // cgroup is removed (dropped right after this).
        pidfd_kill(&self.process);
        // Its waiting children end with it; their cgroups go now.
        self.spares.stop();
        let _ = fs_err::remove_dir_all(&self.files);
    }
}

/// A forked run as its supervisor sees it: it ends when its pid 1 reports the run's end, or,
/// when pid 1 ended without a word (killed with the run), when the fork server reaped it.
struct Forked {
    /// Pid 1's socket, until its one report is read (or it closed without one).
    socket: Option<tokio::io::unix::AsyncFd<OwnedFd>>,
    /// What the fork server says once it reaped pid 1 (or that it could not make it).
    gone: Option<oneshot::Receiver<Report>>,
    /// Set once the run was killed: from then on the report is awaited for a bounded time
    /// only, so a fork server that stopped answering cannot hold the call.
    killed: bool,
    /// Told when a report shows that nothing of the run can run code any more.
    teardown: Arc<NativeTeardown>,
}

impl Forked {
    /// Nothing of the run can run code again: pid 1 killed every other process of its pid
    /// namespace before it reported the end (`exit`, see forkserver.py), or it was reaped
    /// (`gone`: its namespace is empty then).
    fn all_dying(&self) {
        self.teardown.all_dying.store(true, Ordering::SeqCst);
    }

    async fn report(&mut self) -> Result<Report, oneshot::error::RecvError> {
        if let Some(socket) = &self.socket {
            let said = read_child_report(socket).await;
            self.socket = None;
            if let Some(report) = said {
                if matches!(report, Report::Exit(_)) {
                    self.all_dying();
                }
                return Ok(report);
            }
        }
        if self.killed {
            // Pid 1 went without a word because we killed the run.
            return Ok(Report::Exit(libc::SIGKILL));
        }
        let Some(gone) = self.gone.as_mut() else {
            return Ok(Report::Exit(libc::SIGKILL));
        };
        let report = gone.await;
        self.gone = None;
        if matches!(report, Ok(Report::Gone(_))) {
            self.all_dying();
        }
        report
    }
}

impl DirectChild for Forked {
    fn pid(&self) -> u32 {
        0
    }

    async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        use std::os::unix::process::ExitStatusExt;
        // Waited for through a reference: a wait given up (on timeout) can be resumed.
        if self.socket.is_none() && self.gone.is_none() {
            return Err(std::io::Error::other("the run was already waited for"));
        }
        let report = if self.killed {
            match tokio::time::timeout(KILLED_REPORT_TIMEOUT, self.report()).await {
                Ok(report) => report,
                // Killed through its cgroup; neither pid 1 nor the fork server said so in time.
                Err(_) => Ok(Report::Exit(libc::SIGKILL)),
            }
        } else {
            self.report().await
        };
        self.socket = None;
        self.gone = None;
        let report = match report {
            // A run we killed is never started again, whatever its pid 1 managed to say.
            Ok(Report::Fail(_)) if self.killed => Ok(Report::Exit(libc::SIGKILL)),
            report => report,
        };
        match report {
            Ok(Report::Exit(status) | Report::Gone(status)) => {
                Ok(std::process::ExitStatus::from_raw(status))
            }
            Ok(Report::Fail(reason)) => {
                Err(std::io::Error::other(format!("{SETUP_FAILED}: {reason}")))
            }
            Err(_) => Err(std::io::Error::other(
                "the fork server stopped during the run",
            )),
        }
    }

    fn start_kill(&mut self) {
        // The teardown kills everything in the run's cgroup; pid 1 or the fork server reports
        // the end (see `Forked::report`).
        self.killed = true;
    }
}

/// The one report a run's pid 1 sends on its socket (`exit <wait status>` or `fail <reason>`);
/// `None` when the socket closed without one or the first message is not a report (pid 1 runs
/// beside the run's code, so what it sends is read once, bounded, and nothing more).
async fn read_child_report(socket: &tokio::io::unix::AsyncFd<OwnedFd>) -> Option<Report> {
    use nix::sys::socket::{MsgFlags, recv};
    let mut buf = [0u8; 4096];
    loop {
        let mut ready = socket.readable().await.ok()?;
        let received = ready.try_io(|fd| {
            recv(fd.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT).map_err(std::io::Error::from)
        });
        match received {
            Ok(Ok(0)) => return None,
            Ok(Ok(n)) => return parse_child_report(&buf[..n]),
            Ok(Err(err)) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(Err(_)) => return None,
            // Not readable after all: wait again.
            Err(_) => {}
        }
    }
}

/// `exit <wait status>` or `fail <reason>`, from a run's pid 1.
/// Why a child's set-up failed, if its pid 1 said so on `socket` (read without waiting: the
/// child has ended).
fn setup_failure_said(socket: &OwnedFd) -> Option<String> {
    match parse_child_report(&receive(socket, Some(Duration::ZERO))?)? {
        Report::Fail(reason) => Some(reason),
        _ => None,
    }
}

fn parse_child_report(message: &[u8]) -> Option<Report> {
    let text = String::from_utf8_lossy(message);
    let (kind, rest) = text.split_once(' ')?;
    match kind {
        "exit" => rest.trim().parse().ok().map(Report::Exit),
        "fail" => Some(Report::Fail(rest.to_string())),
        _ => None,
    }
}

/// Mount a fresh tmpfs on `dir`, the server's run directories: making and removing a run
/// directory then costs no disk inode allocation (a measurable share of a run's CPU on ext4).
/// Call it before any run directory exists (what is there already is covered). Done once per
/// directory; [`unmount_runs_root`] undoes it. The native backend's
/// [`crate::Backend::prepare_runs_root`] and [`crate::Backend::release_runs_root`].
///
/// # Errors
/// When the directory cannot be created or mounted (the server is not root).
pub(crate) fn mount_runs_root(dir: &Path) -> std::io::Result<()> {
    use nix::mount::{MsFlags, mount};
    static MOUNTED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    let mut mounted = MOUNTED.lock().unwrap_or_else(PoisonError::into_inner);
    if mounted.iter().any(|d| d == dir) {
        return Ok(());
    }
    fs_err::create_dir_all(dir)?;
    mount(
        Some("snakebox-runs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(RUNS_ROOT_OPTIONS),
    )
    .map_err(std::io::Error::from)?;
    mounted.push(dir.to_path_buf());
    Ok(())
}

/// Unmount what [`mount_runs_root`] mounted on `dir` (best effort; lazy).
pub(crate) fn unmount_runs_root(dir: &Path) {
    let _ = nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH);
}

/// A detached copy of the mount tree at `path` (`open_tree` with `OPEN_TREE_CLONE`): what a
/// forked run attaches as one of its directories. The fork server it passes through cannot
/// attach it anywhere (it has no capability in its own mount namespace) and sees nothing else
/// of the run directories.
fn detached_mount(path: &Path) -> std::io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("the path holds a NUL byte"))?;
    // SAFETY: open_tree reads a NUL-terminated path and returns a fresh descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_RECURSIVE as libc::c_uint,
        )
    };
    match i32::try_from(fd) {
        // SAFETY: a fresh descriptor owned only here.
        Ok(fd) if fd >= 0 => Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Write the fork server's program and the run module into a fresh directory below
/// `runs_root` (readable by the fork server's uid; bound read-only into its sandbox).
fn write_files(runs_root: &Path, module: &str) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let dir = runs_root.join(format!(
        ".forkserver-{}",
        COUNT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs_err::remove_dir_all(&dir);
    fs_err::create_dir_all(&dir)?;
    fs_err::write(dir.join("forkserver.py"), SOURCE)?;
    fs_err::write(dir.join("module.py"), module)?;
    for file in ["forkserver.py", "module.py"] {
        fs_err::set_permissions(dir.join(file), std::fs::Permissions::from_mode(0o644))?;
    }
    fs_err::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    Ok(dir)
}

/// The error of a fork server; `before_user_code`: the run can be started another way.
fn fork_server_error(message: String, before_user_code: bool) -> SandboxError {
    SpawnError::ForkServer {
        message,
        before_user_code,
    }
    .into()
}

/// Spawn `command` from a thread of its own that then waits for it: the process is started
/// with `PR_SET_PDEATHSIG`, which fires when the *thread* that forked it ends, so it must not
/// be a pool thread that may be retired while the fork server serves (H-05). Returns a pidfd
/// of the process, its pid and its stderr.
fn spawn_kept(
    mut command: std::process::Command,
) -> std::io::Result<(OwnedFd, i32, Option<std::process::ChildStderr>)> {
    let (sent, received) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("snakebox-forkserver-keeper".into())
        .spawn(move || {
            let mut child = match command.spawn() {
                Ok(child) => child,
                Err(err) => {
                    let _ = sent.send(Err(err));
                    return;
                }
            };
            // Our own child, not reaped before the `wait` below: the pid is still its.
            let pid = i32::try_from(child.id()).map_err(std::io::Error::other);
            let opened = pid.and_then(|pid| pidfd_open(pid).map(|pidfd| (pidfd, pid)));
            let failed = opened.is_err();
            let _ = sent.send(opened.map(|(pidfd, pid)| (pidfd, pid, child.stderr.take())));
            if failed {
                let _ = child.kill();
            }
            let _ = child.wait();
        })?;
    received
        .recv()
        .map_err(|_| std::io::Error::other("the fork server's keeper thread ended"))?
}

fn seqpacket_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: socketpair fills two fresh descriptors on success.
    let ret = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if ret == -1 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and owned only here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Send one message with descriptors attached. Never blocks: a fork server that does not read
/// its requests is treated as failed.
fn send_with_fds(socket: &OwnedFd, message: &[u8], fds: &[OwnedFd]) -> std::io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let raw: Vec<i32> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let iov = [std::io::IoSlice::new(message)];
    let control = [ControlMessage::ScmRights(&raw)];
    let sent = sendmsg::<()>(
        socket.as_raw_fd(),
        &iov,
        &control,
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(std::io::Error::from)?;
    if sent != message.len() {
        return Err(std::io::Error::other("the request was cut short"));
    }
    Ok(())
}

/// Receive one message (blocking); `None` at end of stream or on error.
fn receive(socket: &OwnedFd, timeout: Option<Duration>) -> Option<Vec<u8>> {
    if let Some(timeout) = timeout {
        let millis = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        let mut poll = [nix::poll::PollFd::new(
            socket.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        match nix::poll::poll(&mut poll, nix::poll::PollTimeout::try_from(millis).ok()?) {
            Ok(n) if n > 0 => {}
            _ => return None,
        }
    }
    let mut buf = vec![0u8; MESSAGE_MAX];
    let n = nix::sys::socket::recv(
        socket.as_raw_fd(),
        &mut buf,
        nix::sys::socket::MsgFlags::empty(),
    )
    .ok()
    .filter(|n| *n > 0)?;
    buf.truncate(n);
    Some(buf)
}

/// Wait for `ready` (or `ready <module>,<module>...`: what it preloaded), at most `timeout`,
/// or until `process` (a pidfd of its bwrap) ends: a fork server that dies while it starts
/// (what it imports may end it) is a failure at once, not at the time-out.
fn wait_ready(
    socket: &OwnedFd,
    process: &OwnedFd,
    timeout: Duration,
) -> Result<Vec<String>, String> {
    let millis = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    let mut poll = [
        nix::poll::PollFd::new(socket.as_fd(), nix::poll::PollFlags::POLLIN),
        nix::poll::PollFd::new(process.as_fd(), nix::poll::PollFlags::POLLIN),
    ];
    let waited = nix::poll::poll(
        &mut poll,
        nix::poll::PollTimeout::try_from(millis).unwrap_or(nix::poll::PollTimeout::MAX),
    );
    let said = poll[0].revents().is_some_and(|r| !r.is_empty());
    if !matches!(waited, Ok(n) if n > 0) {
        return Err(format!(
            "it did not become ready within {} s",
            timeout.as_secs()
        ));
    }
    if !said {
        return Err("it ended before it was ready".into());
    }
    match receive(socket, Some(Duration::ZERO)) {
        Some(message) => parse_ready(&message).ok_or_else(|| {
            format!(
                "it sent `{}` instead of `ready`",
                String::from_utf8_lossy(&message)
            )
        }),
        None => Err("it ended before it was ready".into()),
    }
}

/// `ready`, then optionally a space and the comma-separated modules it preloaded.
fn parse_ready(message: &[u8]) -> Option<Vec<String>> {
    let text = std::str::from_utf8(message).ok()?;
    let rest = text.strip_prefix("ready")?;
    if rest.is_empty() {
        return Some(Vec::new());
    }
    let list = rest.strip_prefix(' ')?;
    Some(
        list.split(',')
            .filter(|name| !name.is_empty())
            .map(str::to_owned)
            .collect(),
    )
}

/// Dispatch the fork server's reports to the runs waiting for them, until it goes away.
fn read_reports(socket: &OwnedFd, waiters: &Waiters, alive: &AtomicBool, spares: &Spares) {
    while let Some(message) = receive(socket, None) {
        let text = String::from_utf8_lossy(&message);
        let mut parts = text.splitn(3, ' ');
        let kind = parts.next().unwrap_or_default();
        let Some(id) = parts.next().and_then(|id| id.parse::<u64>().ok()) else {
            continue;
        };
        let rest = parts.next().unwrap_or_default();
        let status = || rest.trim().parse::<i32>().ok();
        let report = match kind {
            "gone" => match status() {
                Some(status) => Report::Gone(status),
                None => continue,
            },
            "fail" => Report::Fail(rest.to_string()),
            _ => continue,
        };
        let mut waiting = waiters.lock().unwrap_or_else(PoisonError::into_inner);
        match waiting.remove(&id) {
            Some(waiter) => {
                drop(waiting);
                let _ = waiter.send(report);
            }
            None => {
                // Nobody waits for it: a pre-forked child that ended before its run.
                let mut state = spares.lock();
                if state.ready.iter().any(|spare| spare.id == id) {
                    state.dead.insert(id);
                    drop(state);
                    drop(waiting);
                    spares.changed.notify_all();
                }
            }
        }
    }
    // Dropping the server clears `alive` before it kills the process: only a stop nobody
    // asked for is worth a warning (a server's shutdown stops every fork server).
    let unexpected = alive.swap(false, Ordering::SeqCst);
    spares.stop();
    // Runs still waiting learn that it is gone (their senders drop).
    waiters
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clear();
    if unexpected {
        tracing::warn!("the fork server stopped");
    } else {
        tracing::debug!("the fork server stopped, as asked");
    }
}

/// Log what the fork server prints, keeping the last few lines in `said`.
fn log_stderr(pipe: std::process::ChildStderr, said: &Mutex<String>) {
    use std::io::BufRead;
    for line in std::io::BufReader::new(pipe).lines() {
        let Ok(line) = line else { return };
        tracing::warn!(%line, "fork server");
        let mut said = said.lock().unwrap_or_else(PoisonError::into_inner);
        said.push_str(&line);
        said.push('\n');
        if said.len() > 8192 {
            let cut = said.len() - 4096;
            let cut = (cut..said.len())
                .find(|&i| said.is_char_boundary(i))
                .unwrap_or(0);
            said.drain(..cut);
        }
    }
}

fn tail(text: &str, max: usize) -> &str {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_a_live_pid_1_of_its_own_namespace_is_taken_as_a_runs_init() {
        // This test's own process is not pid 1 of its namespace.
        let own = super::pidfd_open(i32::try_from(std::process::id()).unwrap()).unwrap();
        assert_eq!(super::pid1_of(&own), None);
        // A child in a new pid namespace is its pid 1 there (needs a user namespace or root).
        let child = std::process::Command::new("unshare")
            .args([
                "--pid",
                "--fork",
                "--kill-child",
                "--map-root-user",
                "sleep",
                "30",
            ])
            .spawn();
        let Ok(mut child) = child else { return };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let inner = loop {
            let children = fs_err::read_to_string(format!(
                "/proc/{}/task/{}/children",
                child.id(),
                child.id()
            ))
            .unwrap_or_default();
            if let Some(pid) = children.split_whitespace().next() {
                break pid.parse::<i32>().unwrap();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "unshare made no child"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let pidfd = super::pidfd_open(inner).unwrap();
        assert_eq!(super::pid1_of(&pidfd), Some(inner));
        let _ = child.kill();
        let _ = child.wait();
        // Once it is gone, it is no run's init any more.
        super::pidfd_kill(&pidfd);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while super::pid1_of(&pidfd).is_some() {
            assert!(
                std::time::Instant::now() < deadline,
                "the child did not end"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    use super::{parse_ready, seqpacket_pair, setup_failure_said};

    #[test]
    fn a_childs_failed_set_up_is_read_from_its_socket() {
        let said = |message: Option<&[u8]>| {
            let (ours, theirs) = seqpacket_pair().unwrap();
            if let Some(message) = message {
                nix::sys::socket::send(
                    std::os::fd::AsRawFd::as_raw_fd(&theirs),
                    message,
                    nix::sys::socket::MsgFlags::empty(),
                )
                .unwrap();
            }
            drop(theirs);
            setup_failure_said(&ours)
        };
        assert_eq!(
            said(Some(b"fail mount /tmp: Permission denied")),
            Some("mount /tmp: Permission denied".to_owned())
        );
        // A run's end, or a child that said nothing (killed), is no failed set-up.
        assert_eq!(said(Some(b"exit 0")), None);
        assert_eq!(said(None), None);
    }

    #[test]
    fn ready_says_what_was_preloaded() {
        assert_eq!(parse_ready(b"ready"), Some(Vec::new()));
        assert_eq!(
            parse_ready(b"ready pandas,numpy"),
            Some(vec!["pandas".to_owned(), "numpy".to_owned()])
        );
        assert_eq!(parse_ready(b"ready "), Some(Vec::new()));
        assert_eq!(parse_ready(b"readyx"), None);
        assert_eq!(parse_ready(b"fail 1 no"), None);
    }
}
