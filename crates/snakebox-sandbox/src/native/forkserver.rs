//! The fork server: one-shot runs forked from a pre-initialised interpreter, each in a fresh
//! sandbox of its own.
//!
//! Starting bubblewrap and an interpreter for every run costs 25-40 ms of CPU, which caps two
//! cores at well under 100 runs a second. The fork server pays that once: an interpreter of one
//! environment, with the run module imported, waits inside a sandbox of its own (the same
//! system view, environment, variables and `/dev` as a run's, no network, no host processes).
//! For each run it forks a child that enters new mount, pid, network, ipc, uts, cgroup and user
//! namespaces, binds the run's own directories, mounts a fresh `/proc`, `/tmp` and `/dev/shm`,
//! takes the run's own host uid, drops every capability, sets no_new_privs and installs our
//! seccomp programs before any user code runs (`forkserver.py` has the steps). The server
//! supervises the run as it does any other: it owns the run's pipes and cgroup, so output caps,
//! limits, time-outs and the kill path are the same.
//!
//! **Its privileges.** The fork server runs as root, like the server, with only the
//! capabilities it needs to set runs up ([`policy::ZYGOTE_CAPS`]), in a sandbox of its own
//! (read-only root, its own mount, pid, network, ipc, uts and cgroup namespaces). It never runs
//! user code and takes no input but the server's requests. Each run, before any of its code
//! runs, switches to its leased host uid and makes a user namespace of its own as that uid (in
//! which it is 65534, as in a cold run): the same user-namespace ancestry as a run bubblewrap
//! starts as that uid, so its per-uid kernel counters (inotify instances, RLIMIT_NPROC, ...)
//! are its own. A fork server in a user namespace of its own would make every run's
//! namespace a descendant of it, and the kernel charges those counters to each ancestor's
//! owner: all runs would then share one.
//!
//! **The run directories** (`<data>/runs/<server pid>`) are bound into its sandbox, hidden from
//! every run (each child detaches them before user code runs). The server mounts a tmpfs there,
//! shared, and the fork server's sandbox is a slave of it, so that each run's size-capped
//! scratch mount, made after the fork server started, shows up there.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::{NativeBackend, NativeTeardown, join_file, pidfd_kill, pidfd_open, policy};
use crate::cgroup::CgroupSet;
use crate::child::{pipe, rlimits_for};
use crate::error::{SandboxError, SpawnError};
use crate::supervise::{DirectChild, outcome, supervise};
use crate::{Identity, LEASED_UID_BASE, LEASED_UIDS, Limits, Mount, Outcome, OutputChunk, Policy};

/// The tmpfs of the run directories: scripts and the runner only (input files and the run's
/// own files are in each run's capped scratch mount below it).
const RUNS_ROOT_OPTIONS: &str = "mode=0755,size=1g,nr_inodes=1048576";
/// Where the run directories appear inside the fork server's sandbox (each run detaches it).
const RUNS_INSIDE: &str = "/run/snakebox/runs";
/// An empty mount point each run builds its fresh `/tmp` on (see `forkserver.py`).
const SPARE_INSIDE: &str = "/run/snakebox/spare";
/// The fork server program.
const SOURCE: &str = include_str!("forkserver.py");
/// How long the fork server may take to start (import its modules) before we give up on it.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How a failed setup is reported (no user code ran).
const SETUP_FAILED: &str = "the run's sandbox could not be set up";
/// How long a killed run's end may take to be reported.
const KILLED_REPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest message from the fork server.
const MESSAGE_MAX: usize = 64 * 1024;

/// Descriptors the fork server's bwrap command needs (see `NativeBackend::prepare`).
pub(crate) struct ZygoteSetup {
    /// Its end of the request socket (fd 3 inside).
    pub(crate) socket: OwnedFd,
    /// Mount points each run binds its directories on.
    pub(crate) mount_points: Vec<PathBuf>,
}

/// How a forked run ended, as the fork server reported it.
#[derive(Debug)]
enum Report {
    /// Its wait status.
    Exit(i32),
    /// Its setup failed before user code ran.
    Fail(String),
}

type Waiters = Arc<Mutex<HashMap<u64, oneshot::Sender<Report>>>>;

/// What the fork server is started with.
#[derive(Debug, Clone)]
pub struct ForkServerSpec {
    /// The sandbox of the fork server: the environment's mounts, variables and limits on
    /// `/tmp`, as for a run of that environment (its `identity` is ignored). No network.
    pub policy: Policy,
    /// The interpreter, as seen inside.
    pub python: PathBuf,
    /// Source of the module each run executes: the fork server imports it once, and each run
    /// calls its `main()` with `sys.argv` set to the run's `argv`.
    pub module_source: String,
    /// Where the server keeps run directories (`<data>/runs/<server pid>`): every mount of a
    /// run must be below it.
    pub runs_root: PathBuf,
    /// Where runs mount their directories inside (created empty in the fork server's view).
    pub mount_points: Vec<PathBuf>,
}

/// One run for the fork server.
#[derive(Debug, Clone)]
pub struct ForkRun {
    /// The run's own directories (host paths below the spec's `runs_root`).
    pub mounts: Vec<Mount>,
    /// Whose run: must be a leased identity.
    pub identity: Identity,
    /// Its limits (`wall_time` counts from the request).
    pub limits: Limits,
    /// `sys.argv` of the module's `main()`; `argv[0]`'s directory is `sys.path[0]`.
    pub argv: Vec<String>,
    /// Working directory inside.
    pub cwd: PathBuf,
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
    runs_root: PathBuf,
    cgroups: Arc<CgroupSet>,
    files: PathBuf,
    next: AtomicU64,
}

impl NativeBackend {
    /// Start a fork server (see the module documentation). Blocks until it is ready (it has
    /// imported its modules), at most [`READY_TIMEOUT`].
    pub(crate) fn start_fork_server(
        &self,
        spec: &ForkServerSpec,
    ) -> Result<ForkServer, SandboxError> {
        let fail = |message: String| fork_server_error(message, true);
        if !self.drop_privileges {
            return Err(fail(
                "it needs a server running as root (to map the runs' uids)".into(),
            ));
        }
        let Some(cgroups) = self.cgroups.clone() else {
            return Err(fail(
                "it needs cgroups (runs are killed and limited through them)".into(),
            ));
        };
        mount_runs_root(&spec.runs_root).map_err(|err| {
            fail(format!(
                "could not mount the run directories at `{}`: {err}",
                spec.runs_root.display()
            ))
        })?;
        let files = write_files(&spec.runs_root, &spec.module_source)
            .map_err(|err| fail(format!("could not write its program: {err}")))?;
        let inside = Path::new(RUNS_INSIDE).join(files.file_name().unwrap_or_default());
        let (ours, theirs) =
            seqpacket_pair().map_err(|err| fail(format!("could not make its socket: {err}")))?;

        let mut policy = spec.policy.clone();
        policy.network = false;
        policy.mounts.push(Mount {
            host: spec.runs_root.clone(),
            dest: RUNS_INSIDE.into(),
            writable: true,
        });
        let command = crate::SandboxCommand {
            program: spec.python.clone(),
            args: vec![
                "-s".into(),
                inside.join("forkserver.py").into_os_string(),
                policy::CONTROL_FD.to_string().into(),
                inside.join("module.py").into_os_string(),
                format!("/proc/self/fd/{}", policy::SECCOMP_EPERM_FD).into(),
                format!("/proc/self/fd/{}", policy::SECCOMP_ENOSYS_FD).into(),
            ],
            control_channel: false,
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
        let mut prepared = self.prepare(&policy, &command, None, Some(setup))?;
        prepared
            .command
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let (pidfd, stderr) = spawn_kept(prepared.command).map_err(|source| SpawnError::Start {
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

        let server = ForkServer {
            process: pidfd,
            _info: prepared.info_read,
            socket: ours,
            waiters: Arc::new(Mutex::new(HashMap::new())),
            alive: Arc::new(AtomicBool::new(false)),
            runs_root: spec.runs_root.clone(),
            cgroups,
            files,
            next: AtomicU64::new(1),
        };
        let reader = server
            .socket
            .try_clone()
            .map_err(|err| fail(format!("could not share its socket: {err}")))?;
        match wait_ready(&reader) {
            Ok(()) => {}
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
        let waiters = Arc::clone(&server.waiters);
        let alive = Arc::clone(&server.alive);
        std::thread::Builder::new()
            .name("snakebox-forkserver".into())
            .spawn(move || read_reports(&reader, &waiters, &alive))
            .map_err(|err| fail(format!("could not start its reader: {err}")))?;
        Ok(server)
    }
}

impl ForkServer {
    /// Whether it is still serving.
    #[must_use]
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
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
        let Identity::Leased(uid) = run.identity else {
            return Err(fail("a forked run needs a leased uid".into()));
        };
        if !(LEASED_UID_BASE..LEASED_UID_BASE + LEASED_UIDS).contains(&uid) {
            return Err(fail(format!("uid `{uid}` is not a leased one")));
        }
        let mut binds = Vec::with_capacity(run.mounts.len());
        for mount in &run.mounts {
            let relative = mount
                .host
                .strip_prefix(&self.runs_root)
                .map_err(|_| fail(format!("`{}` is not a run directory", mount.host.display())))?;
            binds.push(serde_json::json!([
                relative.to_string_lossy(),
                mount.dest.to_string_lossy(),
                mount.writable
            ]));
        }
        let started = Instant::now();
        let cgroup = self.cgroups.create_run(&run.limits)?;
        let mut fds: Vec<OwnedFd> = Vec::new();
        let (stdout_read, stdout_write) = pipe().map_err(desc("stdout"))?;
        let (stderr_read, stderr_write) = pipe().map_err(desc("stderr"))?;
        let (control_read, control_write) = pipe().map_err(desc("control channel"))?;
        fds.extend([stdout_write, stderr_write, control_write]);
        let procs = cgroup.procs_files();
        for file in &procs {
            let path = join_file(file);
            let opened = fs_err::OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|source| SpawnError::Path {
                    path: path.clone(),
                    source,
                })?;
            fds.push(OwnedFd::from(opened.into_parts().0));
        }
        let rlimits: Vec<serde_json::Value> =
            rlimits_for(&run.limits, !cgroup.limits_memory(), !cgroup.limits_pids())
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
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let request = serde_json::json!({
            "id": id,
            "uid": uid,
            "argv": run.argv,
            "cwd": run.cwd.to_string_lossy(),
            "binds": binds,
            "tmpfs": [["/tmp", scratch], ["/dev/shm", scratch]],
            "rlimits": rlimits,
            "cgroups": procs.len(),
        });
        let (report_tx, report_rx) = oneshot::channel();
        self.lock_waiters().insert(id, report_tx);
        let teardown = Arc::new(NativeTeardown {
            sandbox_pidfd: Mutex::new(None),
            sandbox_pid: AtomicI32::new(0),
            cgroup: Some(cgroup),
        });
        if let Err(err) = send_with_fds(&self.socket, request.to_string().as_bytes(), &fds) {
            self.lock_waiters().remove(&id);
            return Err(fail(format!("could not send the request: {err}")));
        }
        drop(fds);
        let receiver = |fd: OwnedFd, what: &'static str| {
            tokio::net::unix::pipe::Receiver::from_owned_fd(fd).map_err(desc(what))
        };
        let stdout = receiver(stdout_read, "stdout")?;
        let stderr = receiver(stderr_read, "stderr")?;
        let child = Forked {
            report: Some(report_rx),
            killed: false,
        };
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
        let memory_hit = crate::supervise::Teardown::memory_exceeded(teardown.as_ref());
        let raw = raw.map_err(|err| match err {
            SpawnError::Wait { source, .. } if source.kind() == std::io::ErrorKind::Other => {
                let message = source.to_string();
                let before_user_code = message.starts_with(SETUP_FAILED);
                fork_server_error(message, before_user_code)
            }
            other => other.into(),
        })?;
        tokio::task::spawn_blocking(move || crate::supervise::Teardown::release(teardown.as_ref()));
        // The run's pid 1 reports a death by signal N as exit status 128 + N, as bwrap does.
        Ok(outcome(raw, &run.limits, true, memory_hit))
    }

    fn lock_waiters(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<Report>>> {
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for ForkServer {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::SeqCst);
        // Its keeper thread reaps it.
        pidfd_kill(&self.process);
        let _ = fs_err::remove_dir_all(&self.files);
    }
}

/// A forked run as its supervisor sees it: it ends when the fork server reports its end.
struct Forked {
    report: Option<oneshot::Receiver<Report>>,
    /// Set once the run was killed: from then on the report is awaited for a bounded time
    /// only, so a fork server that stopped answering cannot hold the call.
    killed: bool,
}

impl DirectChild for Forked {
    fn pid(&self) -> u32 {
        0
    }

    async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        use std::os::unix::process::ExitStatusExt;
        // Waited for through a reference: a wait given up (on timeout) can be resumed.
        let Some(report) = self.report.as_mut() else {
            return Err(std::io::Error::other("the run was already waited for"));
        };
        let report = if self.killed {
            match tokio::time::timeout(KILLED_REPORT_TIMEOUT, report).await {
                Ok(report) => report,
                // Killed through its cgroup; the fork server did not say so in time.
                Err(_) => Ok(Report::Exit(libc::SIGKILL)),
            }
        } else {
            report.await
        };
        self.report = None;
        match report {
            Ok(Report::Exit(status)) => Ok(std::process::ExitStatus::from_raw(status)),
            Ok(Report::Fail(reason)) => {
                Err(std::io::Error::other(format!("{SETUP_FAILED}: {reason}")))
            }
            Err(_) => Err(std::io::Error::other(
                "the fork server stopped during the run",
            )),
        }
    }

    fn start_kill(&mut self) {
        // The teardown kills everything in the run's cgroup; the fork server reports the end.
        self.killed = true;
    }
}

/// Mount a fresh tmpfs on `dir`, the server's run directories, and make it a shared mount:
/// mounts made below it later (each run's scratch) then reach the fork server's sandbox, a
/// slave of it. In memory, like the runs' scratch: making and removing a run directory costs
/// no disk inode allocation (a measurable share of a run's CPU on ext4). Call it before any
/// run directory exists (what is there already is covered). Done once per directory;
/// [`unmount_runs_root`] undoes it (the engine's clean-up calls it).
///
/// # Errors
/// When the directory cannot be created or mounted (the server is not root).
pub fn mount_runs_root(dir: &Path) -> std::io::Result<()> {
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
    if let Err(err) = mount(
        None::<&str>,
        dir,
        None::<&str>,
        MsFlags::MS_SHARED,
        None::<&str>,
    ) {
        let _ = nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH);
        return Err(err.into());
    }
    mounted.push(dir.to_path_buf());
    Ok(())
}

/// Unmount what [`mount_runs_root`] mounted on `dir` (best effort; lazy).
pub fn unmount_runs_root(dir: &Path) {
    let _ = nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH);
}

/// Write the fork server's program and the run module into a fresh directory below
/// `runs_root` (readable by the fork server's uid).
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
/// of the process and its stderr.
fn spawn_kept(
    mut command: std::process::Command,
) -> std::io::Result<(OwnedFd, Option<std::process::ChildStderr>)> {
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
            let opened = i32::try_from(child.id())
                .map_err(std::io::Error::other)
                .and_then(pidfd_open);
            let failed = opened.is_err();
            let _ = sent.send(opened.map(|pidfd| (pidfd, child.stderr.take())));
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

fn wait_ready(socket: &OwnedFd) -> Result<(), String> {
    match receive(socket, Some(READY_TIMEOUT)) {
        Some(message) if message == b"ready" => Ok(()),
        Some(message) => Err(format!(
            "it sent `{}` instead of `ready`",
            String::from_utf8_lossy(&message)
        )),
        None => Err(format!(
            "it did not become ready within {} s",
            READY_TIMEOUT.as_secs()
        )),
    }
}

/// Dispatch the fork server's reports to the runs waiting for them, until it goes away.
fn read_reports(socket: &OwnedFd, waiters: &Waiters, alive: &AtomicBool) {
    while let Some(message) = receive(socket, None) {
        let text = String::from_utf8_lossy(&message);
        let mut parts = text.splitn(3, ' ');
        let kind = parts.next().unwrap_or_default();
        let Some(id) = parts.next().and_then(|id| id.parse::<u64>().ok()) else {
            continue;
        };
        let rest = parts.next().unwrap_or_default();
        let report = match kind {
            "exit" => match rest.trim().parse::<i32>() {
                Ok(status) => Report::Exit(status),
                Err(_) => continue,
            },
            "fail" => Report::Fail(rest.to_string()),
            _ => continue,
        };
        let waiter = waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
        if let Some(waiter) = waiter {
            let _ = waiter.send(report);
        }
    }
    alive.store(false, Ordering::SeqCst);
    // Runs still waiting learn that it is gone (their senders drop).
    waiters
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clear();
    tracing::warn!("the fork server stopped");
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
