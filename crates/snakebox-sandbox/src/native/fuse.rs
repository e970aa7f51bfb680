//! A normal user's file-system images, mounted over FUSE and served by `fuse2fs` in a sandbox.
//!
//! A root server loop-mounts an ext4 image to bound a share of the disk while calls run. A
//! normal user's server cannot: ext4 is not mountable in a user namespace. FUSE is, and the
//! server already lives in a user and mount namespace of its own ([`crate::own_mounts`]), so
//! there it mounts a FUSE file system and e2fsprogs' `fuse2fs` serves the same image from user
//! space: a write past the image's end fails with `ENOSPC`, as with the kernel's ext4.
//!
//! `fuse2fs` reads and writes what sandboxed code sends it (names, data, attributes): it runs
//! confined, holding only what serving one image takes. The decisions, in order:
//!
//! 1. **The image is locked** (`flock`) for exactly as long as its `fuse2fs` lives (the lock's
//!    descriptor is handed to it and the server closes its own): two `fuse2fs` on one image
//!    would corrupt it, and one still writing out what it held when its server ended makes
//!    the next start wait for it ([`lock_image`]).
//! 2. **The server mounts, `fuse2fs` does not**: the server holds `CAP_SYS_ADMIN` over its
//!    own namespaces (until it execs), opens `/dev/fuse` and mounts `fuse.ext4` with
//!    `allow_other` (the sandboxes, in user namespaces nested in the server's, reach it; the
//!    kernel lets no process outside the server's namespace in), `default_permissions` (the
//!    kernel checks modes), `nosuid` and `nodev`.
//! 3. **`fuse2fs` gets the mounted descriptor through libfuse's own hand-over**: told
//!    `auto_unmount`, libfuse 2 never mounts itself; it runs `fusermount` and receives the
//!    descriptor over `_FUSE_COMMFD`. Our `fusermount` is this program ([`run_helper`]),
//!    which sends the one it inherited and nothing else.
//! 4. **The sandbox** ([`sandbox_ops`]): every namespace new (no network, its own pids), no
//!    capabilities, nested user namespaces disabled, a new session, a clean environment, a
//!    run's seccomp programs; visible: `/usr` read-only, a minimal `/dev`, the image at
//!    `/image`, the helpers. No `/proc`, no home, no data directory, no other share.
//! 5. **It dies with the server, cleanly**: bwrap gets SIGKILL when the server's thread that
//!    keeps it ends (`PR_SET_PDEATHSIG`), and `fuse2fs`, the sandbox's init, gets SIGTERM when
//!    bwrap ends (our guard sets that before it execs `fuse2fs`), on which it writes out what
//!    it holds and exits. Its connection also ends when the server's mount namespace goes.
//! 6. **Release**: the server unmounts; `fuse2fs` sees its connection end, writes everything
//!    and exits (waited for, up to a bound, then ended as in 5).
//!
//! `fuse2fs` keeps no journal: an image whose `fuse2fs` was killed is checked (`e2fsck -p`) by
//! the caller before it is served again.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::policy::{SetupOp, SystemView, args_payload, option_args, probe_system_view};
use super::seccomp::{self, Holder, SeccompPrograms};
use crate::child::{memfd_with, raise_fd};
use crate::error::FuseError;

/// libfuse 2 runs its mount helper by this name, found on `PATH`.
const FUSERMOUNT: &str = "fusermount";
/// The guard that gives `fuse2fs` its parent-death signal, then execs it.
const GUARD: &str = "snakebox-fuse-guard";
/// In the sandbox's environment: a process started under either name is a helper only with it.
const HELPER_ENV: &str = "SNAKEBOX_FUSE_HELPER";
/// Where the helpers are inside the sandbox (the only entry of its `PATH`).
const HELPER_DIR: &str = "/snakebox";
/// Where the image is inside the sandbox.
const IMAGE_INSIDE: &str = "/image";
/// The mount point `fuse2fs` is told (it must exist; nothing is mounted there).
const MOUNT_INSIDE: &str = "/mnt";

/// The mounted FUSE connection, inherited by `fuse2fs` and handed to libfuse by `fusermount`.
const FUSE_FD: RawFd = 3;
/// The image's lock, held by `fuse2fs` for its life.
const LOCK_FD: RawFd = 4;
/// bwrap's options (`--args`), so that no host `ps` shows them.
const ARGS_FD: RawFd = 5;
/// A run's seccomp programs (`--add-seccomp-fd`).
const SECCOMP_FDS: [RawFd; 2] = [6, 7];

/// How long a start waits for an earlier `fuse2fs` to let go of an image.
pub const LOCK_WAIT: Duration = Duration::from_secs(30);
/// How long `fuse2fs` has to answer its first request.
const READY_WAIT: Duration = Duration::from_secs(20);

/// Options of `fuse2fs` (libfuse's): the descriptor comes from `fusermount` (`auto_unmount`);
/// the kernel keeps pages, names and absent names between opens (only this mount changes
/// the image);
/// writes in large pieces.
const FUSE2FS_OPTIONS: &str =
    "auto_unmount,kernel_cache,entry_timeout=60,attr_timeout=60,negative_timeout=60,big_writes";

static HELPER_READY: AtomicBool = AtomicBool::new(false);

/// For the program's `main`, first thing: when this process was started as one of
/// `fuse2fs`'s helpers (`fusermount` or the guard, by `argv[0]`, inside its sandbox), act as
/// it and return the exit code. Either way, record that this executable can act as them:
/// FUSE images are served only by a program that calls this.
#[must_use]
pub fn run_helper() -> Option<i32> {
    HELPER_READY.store(true, Ordering::Relaxed);
    std::env::var_os(HELPER_ENV)?;
    let mut args = std::env::args_os();
    let argv0 = args.next()?;
    let name = Path::new(&argv0).file_name()?.to_str()?.to_owned();
    let rest: Vec<OsString> = args.collect();
    match name.as_str() {
        FUSERMOUNT => Some(fusermount(&rest)),
        GUARD => Some(guard(&rest)),
        _ => None,
    }
}

/// Tell the sandbox's stderr (the server's log) what went wrong.
fn say(message: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "snakebox {FUSERMOUNT}: {message}");
}

/// libfuse's `fusermount`, reduced to what `fuse2fs` needs here: send the FUSE descriptor this
/// process inherited (the server mounted it) over `_FUSE_COMMFD`. Unmounting (`-u`) is the
/// server's, so it succeeds doing nothing.
fn fusermount(args: &[OsString]) -> i32 {
    if args.iter().any(|arg| arg == "-u") {
        return 0;
    }
    let Some(comm) = std::env::var("_FUSE_COMMFD")
        .ok()
        .and_then(|fd| fd.parse::<RawFd>().ok())
    else {
        say("_FUSE_COMMFD is not set: run by libfuse only");
        return 1;
    };
    let byte = [0u8];
    let iov = [std::io::IoSlice::new(&byte)];
    let fds = [FUSE_FD];
    let cmsgs = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
    match nix::sys::socket::sendmsg::<()>(
        comm,
        &iov,
        &cmsgs,
        nix::sys::socket::MsgFlags::empty(),
        None,
    ) {
        Ok(_) => 0,
        Err(err) => {
            say(&format!("could not hand over the FUSE descriptor: {err}"));
            1
        }
    }
}

/// Give this process SIGTERM when its parent (bwrap) ends, then exec the command: `fuse2fs`
/// then writes out what it holds and exits, rather than being killed mid-write.
fn guard(args: &[OsString]) -> i32 {
    // SAFETY: prctl with integer arguments only.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0);
    }
    let Some((program, rest)) = args.split_first() else {
        say("the guard needs a command");
        return 2;
    };
    let err = std::process::Command::new(program).args(rest).exec();
    say(&format!(
        "could not start `{}`: {err}",
        program.to_string_lossy()
    ));
    127
}

/// What serving an image over FUSE takes on this host, found once.
#[derive(Debug, Clone)]
pub struct FuseServers {
    bwrap: PathBuf,
    fuse2fs: PathBuf,
    /// This program (the helpers).
    helper: PathBuf,
    view: SystemView,
    seccomp: [Vec<u8>; 2],
}

impl FuseServers {
    /// Whether this server can serve images over FUSE, and with what.
    ///
    /// # Errors
    /// What is missing, with a hint: the server's own user and mount namespace, `/dev/fuse`,
    /// `fuse2fs`, bubblewrap (which confines it), or a program that can act as its helpers.
    pub fn probe(bwrap: Option<&Path>) -> Result<FuseServers, FuseError> {
        if !crate::own_mounts::entered() {
            return Err(FuseError::NoNamespace);
        }
        if !HELPER_READY.load(Ordering::Relaxed) {
            return Err(FuseError::NoHelper);
        }
        if let Err(source) = fs_err::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
        {
            return Err(FuseError::Device { source });
        }
        let fuse2fs = find_program("fuse2fs", None).ok_or(FuseError::Fuse2fsMissing)?;
        let bwrap = find_program("bwrap", bwrap).ok_or(FuseError::BwrapMissing)?;
        let helper = std::env::current_exe().map_err(|source| FuseError::Start {
            what: "this program's path",
            source,
        })?;
        let SeccompPrograms { eperm, enosys } =
            seccomp::programs(Holder::Run).map_err(|err| FuseError::Start {
                what: "seccomp programs",
                source: std::io::Error::other(err.to_string()),
            })?;
        Ok(FuseServers {
            bwrap,
            fuse2fs,
            helper,
            view: probe_system_view(),
            seccomp: [
                SeccompPrograms::to_bytes(&eperm),
                SeccompPrograms::to_bytes(&enosys),
            ],
        })
    }

    /// `fuse2fs`'s path, for reports.
    #[must_use]
    pub fn fuse2fs(&self) -> &Path {
        &self.fuse2fs
    }

    /// Mount a FUSE file system at `dir` and serve the image `lock` holds on it with a
    /// confined `fuse2fs`; returns once it answers.
    ///
    /// # Errors
    /// The mount, the sandbox or `fuse2fs` failed (with what `fuse2fs` said).
    pub fn serve(&self, lock: ImageLock, dir: &Path) -> Result<FuseMount, FuseError> {
        let device = fs_err::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .map_err(|source| FuseError::Device { source })?;
        let device: OwnedFd = device.into_parts().0.into();
        let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
        let data = format!(
            "fd={},rootmode=40000,user_id={uid},group_id={gid},allow_other,default_permissions",
            device.as_raw_fd()
        );
        let source = lock
            .image
            .file_name()
            .map_or_else(|| "snakebox-share".into(), |name| name.to_os_string());
        nix::mount::mount(
            Some(source.as_os_str()),
            dir,
            Some("fuse.ext4"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some(data.as_str()),
        )
        .map_err(|errno| FuseError::Mount {
            dir: dir.to_path_buf(),
            source: errno.into(),
        })?;
        let mut mounted = FuseMount {
            dir: dir.to_path_buf(),
            pidfd: None,
            exited: None,
            stderr: std::sync::Arc::default(),
        };
        let started = self.start(&lock, device, &mounted.stderr);
        drop(lock);
        match started {
            Ok((pidfd, exited)) => {
                mounted.pidfd = Some(pidfd);
                mounted.exited = Some(exited);
            }
            Err(err) => {
                mounted.release(Duration::ZERO);
                return Err(err);
            }
        }
        match mounted.wait_ready() {
            Ok(()) => Ok(mounted),
            Err(err) => {
                mounted.release(Duration::from_secs(2));
                Err(err)
            }
        }
    }

    /// Start bwrap with `fuse2fs` in it, from a thread that then waits for it (its
    /// parent-death signal fires when that thread ends, so it must live as long as bwrap).
    fn start(
        &self,
        lock: &ImageLock,
        device: OwnedFd,
        stderr: &std::sync::Arc<std::sync::Mutex<String>>,
    ) -> Result<(OwnedFd, mpsc::Receiver<()>), FuseError> {
        let desc = |what: &'static str| move |source| FuseError::Start { what, source };
        let ops = sandbox_ops(&self.view, &lock.image, &self.helper);
        let payload = args_payload(&option_args(&ops)).map_err(|err| FuseError::Start {
            what: "bwrap arguments",
            source: std::io::Error::other(err.to_string()),
        })?;
        // Every descriptor the child gets, raised above the numbers it is moved to.
        let lock_fd = lock
            .file
            .try_clone()
            .map(OwnedFd::from)
            .map_err(desc("the image's lock"))?;
        let sources: Vec<(OwnedFd, RawFd)> = vec![
            (device, FUSE_FD),
            (lock_fd, LOCK_FD),
            (
                memfd_with(c"fuse2fs-args", &payload).map_err(desc("bwrap arguments"))?,
                ARGS_FD,
            ),
            (
                memfd_with(c"seccomp-eperm", &self.seccomp[0]).map_err(desc("seccomp"))?,
                SECCOMP_FDS[0],
            ),
            (
                memfd_with(c"seccomp-enosys", &self.seccomp[1]).map_err(desc("seccomp"))?,
                SECCOMP_FDS[1],
            ),
        ];
        let sources: Vec<(OwnedFd, RawFd)> = sources
            .into_iter()
            .map(|(fd, target)| raise_fd(fd, 16).map(|fd| (fd, target)))
            .collect::<std::io::Result<_>>()
            .map_err(desc("descriptors"))?;
        let plan: Vec<(RawFd, RawFd)> = sources
            .iter()
            .map(|(fd, target)| (fd.as_raw_fd(), *target))
            .collect();
        let mut command = std::process::Command::new(&self.bwrap);
        command
            .args(bwrap_argv(&self.fuse2fs))
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        // SAFETY: only async-signal-safe calls (dup2, close_range, prctl) between fork and exec.
        unsafe {
            command.pre_exec(move || {
                for (from, to) in &plan {
                    if libc::dup2(*from, *to) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                // Nothing else of the server's reaches the sandbox (close-on-exec: the
                // descriptor that reports a failed exec must live until the exec).
                libc::syscall(
                    libc::SYS_close_range,
                    8u32,
                    u32::MAX,
                    libc::CLOSE_RANGE_CLOEXEC,
                );
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let (sent, received) = mpsc::channel();
        let (exit_tx, exit_rx) = mpsc::channel();
        let log = std::sync::Arc::clone(stderr);
        std::thread::Builder::new()
            .name("snakebox-fuse2fs-keeper".into())
            .spawn(move || {
                let spawned = command.spawn();
                drop(sources);
                let mut child = match spawned {
                    Ok(child) => child,
                    Err(err) => {
                        let _ = sent.send(Err(err));
                        return;
                    }
                };
                // Our own child, not reaped before the `wait` below: the pid is still its.
                let pidfd = i32::try_from(child.id())
                    .map_err(std::io::Error::other)
                    .and_then(pidfd_open);
                let failed = pidfd.is_err();
                let _ = sent.send(pidfd);
                if failed {
                    let _ = child.kill();
                }
                if let Some(mut out) = child.stderr.take() {
                    keep_tail(&mut out, &log);
                }
                let _ = child.wait();
                let _ = exit_tx.send(());
            })
            .map_err(desc("its keeper thread"))?;
        let pidfd = received
            .recv()
            .map_err(|_| FuseError::Start {
                what: "bwrap",
                source: std::io::Error::other("its keeper thread ended"),
            })?
            .map_err(|source| FuseError::Start {
                what: "bwrap",
                source,
            })?;
        Ok((pidfd, exit_rx))
    }
}

/// A descriptor of process `pid` (a child of ours, not yet reaped), to signal it without
/// the risk of a reused pid.
fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open returns a fresh descriptor that we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = RawFd::try_from(fd).map_err(std::io::Error::other)?;
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is fresh and owned only here.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Keep the last few KiB of what `fuse2fs` says (for an error), and put each line in the
/// server's log.
fn keep_tail(out: &mut impl std::io::Read, log: &std::sync::Mutex<String>) {
    use std::io::BufRead;
    for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
        // fuse2fs 1.47 says this at every mount: it writes without the journal (the image
        // is checked before it is served again after an unclean end).
        if line.contains("Writing to the journal is not supported") {
            continue;
        }
        tracing::warn!(target: "snakebox_sandbox::fuse2fs", "{line}");
        let mut tail = log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        tail.push_str(&line);
        tail.push('\n');
        if tail.len() > 4096 {
            let cut = tail.len() - 4096;
            let cut = (cut..tail.len())
                .find(|i| tail.is_char_boundary(*i))
                .unwrap_or(tail.len());
            tail.drain(..cut);
        }
    }
}

/// bwrap's argv: its options come from [`ARGS_FD`]; then the guard, `fuse2fs` and its
/// arguments (`-f`: it stays in the foreground, bwrap's child).
fn bwrap_argv(fuse2fs: &Path) -> Vec<OsString> {
    let guard = Path::new(HELPER_DIR).join(GUARD);
    vec![
        "--args".into(),
        ARGS_FD.to_string().into(),
        "--".into(),
        guard.into(),
        fuse2fs.into(),
        IMAGE_INSIDE.into(),
        MOUNT_INSIDE.into(),
        "-f".into(),
        "-o".into(),
        FUSE2FS_OPTIONS.into(),
    ]
}

/// The sandbox of one `fuse2fs`, in order (see the module's list, item 4).
fn sandbox_ops(view: &SystemView, image: &Path, helper: &Path) -> Vec<SetupOp> {
    use SetupOp::*;
    let mut ops = vec![
        // Every namespace new: its own pids (it is their init), no network.
        UnshareAll,
        UnshareUser,
        DisableUserns,
        NewSession,
        AsPid1,
        CapDropAll,
        ClearEnv,
        SetEnv("PATH".into(), HELPER_DIR.into()),
        SetEnv(HELPER_ENV.into(), "1".into()),
        // The system's programs and libraries, read-only.
        RoBind("/usr".into(), "/usr".into()),
    ];
    ops.extend(
        view.symlinks
            .iter()
            .map(|(link, target)| Symlink(target.clone(), link.clone())),
    );
    ops.extend(view.dirs.iter().map(|dir| RoBind(dir.clone(), dir.clone())));
    if Path::new("/etc/ld.so.cache").exists() {
        ops.push(RoBind("/etc/ld.so.cache".into(), "/etc/ld.so.cache".into()));
    }
    ops.extend([
        // /dev/null, /dev/urandom and the like; not /dev/fuse (the mount is the server's).
        Dev("/dev".into()),
        // The one thing it serves, and the helpers (this program, read-only).
        Bind(image.to_path_buf(), IMAGE_INSIDE.into()),
        Dir(MOUNT_INSIDE.into()),
        RoBind(helper.to_path_buf(), Path::new(HELPER_DIR).join(FUSERMOUNT)),
        RoBind(helper.to_path_buf(), Path::new(HELPER_DIR).join(GUARD)),
        Chdir("/".into()),
        // Last: the programs apply from the command on (bwrap itself still mounts).
        SeccompFd(SECCOMP_FDS[0]),
        SeccompFd(SECCOMP_FDS[1]),
    ]);
    ops
}

/// An image file opened and locked for the one `fuse2fs` that will serve it.
#[derive(Debug)]
pub struct ImageLock {
    file: std::fs::File,
    image: PathBuf,
}

/// Lock `image` for serving, waiting up to `wait` for an earlier `fuse2fs` (of a server
/// that ended) to write out what it held and let go of it.
///
/// # Errors
/// It cannot be opened for writing, or it is still held after `wait`.
pub fn lock_image(image: &Path, wait: Duration) -> Result<ImageLock, FuseError> {
    let file = fs_err::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .map_err(|source| FuseError::Image {
            image: image.to_path_buf(),
            source,
        })?
        .into_parts()
        .0;
    let deadline = Instant::now() + wait;
    loop {
        // Never unlocked by us: the lock ends when the last holder of this open file (the
        // fuse2fs it is handed to) closes it. (`nix::fcntl::Flock` would unlock on drop.)
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(ImageLock {
                file,
                image: image.to_path_buf(),
            });
        }
        if Instant::now() >= deadline {
            return Err(FuseError::Held {
                image: image.to_path_buf(),
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An image mounted over FUSE, its `fuse2fs` running. Dropped, it is unmounted and its
/// `fuse2fs` ended (cleanly: see the module's list, item 5).
#[derive(Debug)]
pub struct FuseMount {
    dir: PathBuf,
    /// bwrap's process.
    pidfd: Option<OwnedFd>,
    /// Told when bwrap (and so `fuse2fs`) has ended.
    exited: Option<mpsc::Receiver<()>>,
    /// The end of what `fuse2fs` said.
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl FuseMount {
    /// Whether `fuse2fs` still serves the mount.
    pub fn is_alive(&self) -> bool {
        self.exited
            .as_ref()
            .is_some_and(|exited| matches!(exited.try_recv(), Err(mpsc::TryRecvError::Empty)))
    }

    /// What `fuse2fs` said last (for an error).
    #[must_use]
    pub fn said(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .trim()
            .to_owned()
    }

    /// Wait until `fuse2fs` answers a first request (the kernel holds requests until it
    /// does), or ended, or the bound passed.
    fn wait_ready(&self) -> Result<(), FuseError> {
        let (answer, answered) = mpsc::channel();
        let dir = self.dir.clone();
        // A request to a server that never answers blocks its thread until the connection
        // ends (fuse2fs ended or the mount went): a thread of its own, not waited for.
        let _ = std::thread::Builder::new()
            .name("snakebox-fuse2fs-ready".into())
            .spawn(move || {
                let _ = answer.send(nix::sys::statvfs::statvfs(&dir).map(|_| ()));
            });
        let deadline = Instant::now() + READY_WAIT;
        loop {
            match answered.recv_timeout(Duration::from_millis(50)) {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(errno)) => {
                    return Err(FuseError::NotServing {
                        said: format!("{errno}; {}", self.said()),
                    });
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(FuseError::NotServing { said: self.said() });
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            if !self.is_alive() {
                std::thread::sleep(Duration::from_millis(50));
                return Err(FuseError::NotServing { said: self.said() });
            }
            if Instant::now() >= deadline {
                return Err(FuseError::NotServing {
                    said: format!("no answer within {} s", READY_WAIT.as_secs()),
                });
            }
        }
    }

    /// Unmount and let `fuse2fs` write out what it holds and exit, waiting up to `wait`;
    /// then end it (SIGTERM through bwrap's end, as in the module's list, item 5). Returns
    /// whether it had ended by itself.
    pub fn release(&mut self, wait: Duration) -> bool {
        self.detach();
        self.finish(Instant::now() + wait)
    }

    /// Unmount lazily: `fuse2fs`'s connection ends once nothing uses the mount any more.
    pub fn detach(&self) {
        // An error means it is not mounted (any more): nothing to unmount.
        let _ = nix::mount::umount2(&self.dir, nix::mount::MntFlags::MNT_DETACH);
    }

    /// After [`FuseMount::detach`]: wait until `deadline` for `fuse2fs` to end, then end it.
    /// Returns whether it had ended by itself.
    pub fn finish(&mut self, deadline: Instant) -> bool {
        let Some(exited) = self.exited.take() else {
            return true;
        };
        let wait = deadline.saturating_duration_since(Instant::now());
        if !matches!(
            exited.recv_timeout(wait),
            Err(mpsc::RecvTimeoutError::Timeout)
        ) {
            return true;
        }
        if let Some(pidfd) = &self.pidfd {
            // SAFETY: pidfd_send_signal on a descriptor we own; no siginfo.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    pidfd.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0u32,
                );
            }
        }
        let _ = exited.recv_timeout(Duration::from_secs(5));
        false
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if self.exited.is_some() {
            self.release(Duration::ZERO);
        }
    }
}

/// `name` in the system's directories (or `given`, when the operator named it).
fn find_program(name: &str, given: Option<&Path>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |path: &Path| {
        fs_err::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if let Some(given) = given {
        return executable(given).then(|| given.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/bin", "/usr/sbin", "/bin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| executable(candidate))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuse2fs_holds_only_its_image_and_the_helpers() {
        let view = SystemView {
            symlinks: vec![("/lib".into(), "usr/lib".into())],
            dirs: vec![],
            etc: vec![],
            etc_network: vec![],
        };
        let ops = sandbox_ops(
            &view,
            Path::new("/data/sessions-v1/shares/7.img"),
            Path::new("/usr/local/bin/snakebox"),
        );
        let args: Vec<String> = option_args(&ops)
            .iter()
            .map(|arg| arg.to_string_lossy().into_owned())
            .collect();
        let text = args.join(" ");
        for wanted in [
            "--unshare-all --unshare-user --disable-userns --new-session --as-pid-1 --cap-drop ALL --clearenv",
            "--ro-bind /usr /usr --symlink usr/lib /lib",
            "--dev /dev --bind /data/sessions-v1/shares/7.img /image --dir /mnt",
            "--ro-bind /usr/local/bin/snakebox /snakebox/fusermount --ro-bind /usr/local/bin/snakebox /snakebox/snakebox-fuse-guard",
            "--add-seccomp-fd 6 --add-seccomp-fd 7",
        ] {
            assert!(text.contains(wanted), "missing `{wanted}` in {text}");
        }
        // Nothing else of the host: no /proc, no share-net, no other bind of the data.
        assert!(
            !text.contains("--proc") && !text.contains("--share-net"),
            "{text}"
        );
        assert_eq!(text.matches("/data/").count(), 1, "{text}");
        assert!(text.ends_with("--add-seccomp-fd 7"), "seccomp last: {text}");
        let argv: Vec<String> = bwrap_argv(Path::new("/usr/bin/fuse2fs"))
            .iter()
            .map(|arg| arg.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            argv.join(" "),
            "--args 5 -- /snakebox/snakebox-fuse-guard /usr/bin/fuse2fs /image /mnt -f -o auto_unmount,kernel_cache,entry_timeout=60,attr_timeout=60,negative_timeout=60,big_writes"
        );
    }

    #[test]
    fn an_image_is_served_by_one_fuse2fs_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("1.img");
        fs_err::write(&image, b"").unwrap();
        let first = lock_image(&image, Duration::ZERO).unwrap();
        let second = lock_image(&image, Duration::from_millis(200)).unwrap_err();
        assert!(matches!(second, FuseError::Held { .. }), "{second}");
        assert!(second.hint().unwrap().contains("earlier server"));
        drop(first);
        lock_image(&image, Duration::ZERO).unwrap();
    }
}
