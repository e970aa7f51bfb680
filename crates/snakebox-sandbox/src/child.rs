//! What the forked child does between `fork` and `exec`, as a plan built beforehand.
//!
//! Code running after `fork` in a multi-threaded process may only make async-signal-safe calls:
//! no allocation, no locks. So every string and number is prepared in [`ChildPlan`] by the
//! parent, and [`ChildPlan::apply`] only issues raw system calls, in an order that matters (each
//! step says why). The plan itself is plain data and is unit-tested without forking.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::Limits;

/// A resource limit applied with `setrlimit` (soft and hard).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rlimit {
    /// Which resource.
    pub(crate) kind: RlimitKind,
    /// Soft limit.
    pub(crate) soft: u64,
    /// Hard limit (the process cannot raise it back).
    pub(crate) hard: u64,
}

/// The rlimit resources we use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RlimitKind {
    /// `RLIMIT_CPU`: SIGXCPU at soft, SIGKILL at hard.
    Cpu,
    /// `RLIMIT_FSIZE`: largest file.
    Fsize,
    /// `RLIMIT_NOFILE`: open descriptors.
    Nofile,
    /// `RLIMIT_AS`: address space (memory fallback when no memory cgroup).
    As,
    /// `RLIMIT_NPROC`: processes of the real uid (fallback when no pids cgroup).
    Nproc,
    /// `RLIMIT_CORE`: always 0, no core dumps for the host's crash handler (P-06).
    Core,
    /// `RLIMIT_MSGQUEUE`: POSIX message-queue bytes of the uid (fork servers; see there).
    Msgqueue,
    /// `RLIMIT_SIGPENDING`: queued signals of the uid (fork servers; see there).
    Sigpending,
}

impl RlimitKind {
    pub(crate) fn resource(self) -> libc::__rlimit_resource_t {
        match self {
            Self::Cpu => libc::RLIMIT_CPU,
            Self::Fsize => libc::RLIMIT_FSIZE,
            Self::Nofile => libc::RLIMIT_NOFILE,
            Self::As => libc::RLIMIT_AS,
            Self::Nproc => libc::RLIMIT_NPROC,
            Self::Core => libc::RLIMIT_CORE,
            Self::Msgqueue => libc::RLIMIT_MSGQUEUE,
            Self::Sigpending => libc::RLIMIT_SIGPENDING,
        }
    }

    /// Name as in `getrlimit(2)`.
    #[allow(dead_code)] // used by the native backend report
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Cpu => "RLIMIT_CPU",
            Self::Fsize => "RLIMIT_FSIZE",
            Self::Nofile => "RLIMIT_NOFILE",
            Self::As => "RLIMIT_AS",
            Self::Nproc => "RLIMIT_NPROC",
            Self::Core => "RLIMIT_CORE",
            Self::Msgqueue => "RLIMIT_MSGQUEUE",
            Self::Sigpending => "RLIMIT_SIGPENDING",
        }
    }
}

/// The rlimits for `limits`. `memory` and `processes` say whether RLIMIT_AS and RLIMIT_NPROC
/// must stand in for a cgroup.
pub(crate) fn rlimits_for(limits: &Limits, memory: bool, processes: bool) -> Vec<Rlimit> {
    let mut out = vec![Rlimit {
        kind: RlimitKind::Core,
        soft: 0,
        hard: 0,
    }];
    if let Some(cpu) = limits.cpu_time {
        // Soft limit → SIGXCPU (reported as CpuLimit); the hard limit one second later → SIGKILL
        // even if the program ignores SIGXCPU.
        let secs = cpu.as_secs() + u64::from(cpu.subsec_nanos() > 0);
        let secs = secs.max(1);
        out.push(Rlimit {
            kind: RlimitKind::Cpu,
            soft: secs,
            hard: secs + 1,
        });
    }
    if let Some(size) = limits.file_size_bytes {
        out.push(Rlimit {
            kind: RlimitKind::Fsize,
            soft: size,
            hard: size,
        });
    }
    if let Some(n) = limits.open_files {
        out.push(Rlimit {
            kind: RlimitKind::Nofile,
            soft: n,
            hard: n,
        });
    }
    if let Some(bytes) = limits.memory_bytes.filter(|_| memory) {
        out.push(Rlimit {
            kind: RlimitKind::As,
            soft: bytes,
            hard: bytes,
        });
    }
    if let Some(n) = limits.max_processes.filter(|_| processes) {
        out.push(Rlimit {
            kind: RlimitKind::Nproc,
            soft: n,
            hard: n,
        });
    }
    out
}

/// One source bind-mounted into the staging area (see `native` module docs for why).
#[derive(Debug)]
pub(crate) struct StagedMount {
    /// Host path of the source, resolved in the child's private mount namespace.
    pub(crate) source: CString,
    /// Path of the mount point inside the staging tmpfs.
    pub(crate) target: CString,
    /// Whether the source is a directory (mount point is a directory, else an empty file).
    pub(crate) is_dir: bool,
}

/// A private mount namespace with a tmpfs at `root` holding bind mounts of paths that the
/// unprivileged bwrap could not reach itself.
#[derive(Debug)]
pub(crate) struct Staging {
    /// Where the tmpfs is mounted (a directory that exists on the host).
    pub(crate) root: CString,
    /// What to bind into it.
    pub(crate) mounts: Vec<StagedMount>,
}

/// Everything the child does before `exec`, prepared by the parent.
#[derive(Debug, Default)]
pub(crate) struct ChildPlan {
    /// `cgroup.procs` files to write `0` into (join the run's cgroups).
    pub(crate) cgroup_procs: Vec<CString>,
    /// Mount staging (root server running bwrap as an unprivileged uid).
    pub(crate) staging: Option<Staging>,
    /// Descriptors to place at fixed numbers: (source, target). Sources are above every target.
    pub(crate) fd_map: Vec<(RawFd, RawFd)>,
    /// Resource limits.
    pub(crate) rlimits: Vec<Rlimit>,
    /// Host uid and gid to switch to.
    pub(crate) drop_to: Option<(u32, u32)>,
    /// Make the child a child subreaper (kept across exec): orphaned grandchildren, such as a
    /// double-forked daemon, are re-parented to it instead of host init, so the tree scan still
    /// finds them while the child lives. Used where no PID namespace holds the tree.
    pub(crate) subreaper: bool,
    /// A niceness to take (see [`RUN_NICE`]); inherited by everything the sandbox starts.
    pub(crate) nice: Option<libc::c_int>,
}

/// The niceness of sandboxes that no CPU cgroup holds (a normal user's server without
/// delegation, a root server on an undelegated cgroup v2 unit): the server's own threads (the
/// timer that ends a run at its timeout, the kill, the reply) and the host's other programs
/// then go before any number of a run's busy processes. With nothing bounding a run's CPU, a
/// fork bomb's 126 spinning processes took both cores of a cgroup v2 guest, and a 10 s timeout
/// was answered after 40-110 s. Runs compete with each other as before (all have it); where a
/// CPU cgroup holds runs, their weight and bandwidth do this, and the niceness stays 0.
pub(crate) const RUN_NICE: libc::c_int = 15;

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl ChildPlan {
    /// The first descriptor number that is neither stdio nor a mapped target.
    pub(crate) fn first_free_fd(&self) -> RawFd {
        self.fd_map
            .iter()
            .map(|&(_, t)| t + 1)
            .max()
            .unwrap_or(3)
            .max(3)
    }

    /// Run the plan. Called between fork and exec: async-signal-safe calls only.
    ///
    /// # Safety
    /// Must only be called in the child after `fork`, before `exec`.
    pub(crate) unsafe fn apply(&self) -> io::Result<()> {
        // SAFETY: each call below is a plain system call on data prepared by the parent; none
        // allocates or takes a lock, so they are safe between fork and exec.
        unsafe {
            // 1. Own session and process group, so killpg() reaches everything that does not
            //    call setsid() itself, and the child has no controlling terminal (TIOCSTI, U-01).
            check(libc::setsid())?;
            // 2. Join the run's cgroups BEFORE exec and BEFORE dropping the uid: the cgroup files
            //    belong to root, and everything forked after exec must be charged to the run
            //    (catalogue §5: "move the child in before exec").
            for path in &self.cgroup_procs {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let ret = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = io::Error::last_os_error();
                libc::close(fd);
                if ret != 1 {
                    return Err(err);
                }
            }
            // 3. Staging mounts need root and must exist before bwrap starts; they live in a
            //    private mount namespace so the host never sees them (MS_PRIVATE before any mount).
            if let Some(staging) = &self.staging {
                stage(staging)?;
            }
            // 4. Fixed descriptors, then everything else close-on-exec. dup2 clears CLOEXEC on
            //    the new number; sources are above every target, so no mapping clobbers another.
            for &(src, dst) in &self.fd_map {
                check(libc::dup2(src, dst))?;
            }
            close_range_cloexec(self.first_free_fd());
            // 4b. First in line for the kernel's OOM killer (P-07): a global OOM must take a
            //     sandbox, not the server. Raising the score needs no privilege and is inherited;
            //     lowering it again needs CAP_SYS_RESOURCE, which the sandbox never has.
            let fd = libc::open(
                c"/proc/self/oom_score_adj".as_ptr(),
                libc::O_WRONLY | libc::O_CLOEXEC,
            );
            if fd >= 0 {
                libc::write(fd, b"1000".as_ptr().cast(), 4);
                libc::close(fd);
            }
            // 4c. Behind the server and the host's programs where no CPU cgroup holds the run
            //     (raising the niceness needs no privilege; lowering it again needs
            //     CAP_SYS_NICE, which the sandbox never has outside its own namespaces).
            if let Some(nice) = self.nice {
                check(libc::setpriority(libc::PRIO_PROCESS, 0, nice))?;
            }
            // 5. Limits (as root it is still allowed to set any hard value; lowering is always
            //    allowed). RLIMIT_NPROC is enforced on the uid switched to below.
            for limit in &self.rlimits {
                let rl = libc::rlimit {
                    rlim_cur: limit.soft,
                    rlim_max: limit.hard,
                };
                check(libc::setrlimit(limit.kind.resource(), &rl))?;
            }
            // 6. Drop to the unprivileged host uid LAST: every step above needs root.
            if let Some((uid, gid)) = self.drop_to {
                check(libc::setgroups(0, std::ptr::null()))?;
                check(libc::setresgid(gid, gid, gid))?;
                check(libc::setresuid(uid, uid, uid))?;
            }
            // 7. No setuid gains, and die with the server. PDEATHSIG is reset by a credential
            //    change, so it comes after step 6.
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
            check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0))?;
            if self.subreaper {
                check(libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0))?;
            }
        }
        Ok(())
    }
}

/// Mark every descriptor from `first` upwards close-on-exec.
unsafe fn close_range_cloexec(first: RawFd) {
    // SAFETY: raw system calls on descriptor numbers; async-signal-safe.
    unsafe {
        let ret = libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
        if ret == 0 {
            return;
        }
        // Kernels before 5.11: walk the table up to the soft RLIMIT_NOFILE.
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) == 0 {
            rl.rlim_cur.min(1 << 20) as RawFd
        } else {
            65536
        };
        for fd in first..max {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
}

unsafe fn stage(staging: &Staging) -> io::Result<()> {
    // SAFETY: raw system calls on NUL-terminated strings prepared by the parent.
    unsafe {
        check(libc::unshare(libc::CLONE_NEWNS))?;
        check(libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ))?;
        check(libc::mount(
            c"snakebox-stage".as_ptr(),
            staging.root.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            c"mode=0755,size=1m".as_ptr().cast(),
        ))?;
        for m in &staging.mounts {
            if m.is_dir {
                check(libc::mkdir(m.target.as_ptr(), 0o755))?;
            } else {
                let fd = libc::open(
                    m.target.as_ptr(),
                    libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                    0o644,
                );
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                libc::close(fd);
            }
            check(libc::mount(
                m.source.as_ptr(),
                m.target.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            ))?;
        }
    }
    Ok(())
}

/// Move `fd` to a number of at least `min`, close-on-exec, so that it can be `dup2`ed onto a
/// low fixed number in the child without clobbering another source.
pub(crate) fn raise_fd(fd: OwnedFd, min: RawFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() >= min {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor that we own.
    let new = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, min) };
    if new < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `new` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// A close-on-exec pipe: (read end, write end).
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two fresh descriptors that we then own.
    let ret = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and owned only here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A sealed-size-free memfd holding `data`, positioned at offset 0 (for `--args`, `--seccomp`).
#[allow(dead_code)] // used by the native backend
pub(crate) fn memfd_with(name: &std::ffi::CStr, data: &[u8]) -> io::Result<OwnedFd> {
    use std::io::{Seek, Write};
    // SAFETY: memfd_create returns a fresh descriptor that we own.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is fresh and owned only here.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.write_all(data)?;
    file.seek(io::SeekFrom::Start(0))?;
    Ok(file.into())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn limits() -> Limits {
        Limits {
            wall_time: Duration::from_secs(5),
            cpu_time: Some(Duration::from_millis(2500)),
            memory_bytes: Some(1 << 28),
            max_processes: Some(64),
            max_output_bytes: 1000,
            scratch_bytes: None,
            file_size_bytes: Some(1 << 20),
            open_files: Some(256),
            cpu_millicores: None,
        }
    }

    #[test]
    fn rlimits_always_forbid_core_dumps_and_round_cpu_up() {
        let r = rlimits_for(&limits(), false, false);
        assert_eq!(
            r[0],
            Rlimit {
                kind: RlimitKind::Core,
                soft: 0,
                hard: 0
            }
        );
        assert!(r.contains(&Rlimit {
            kind: RlimitKind::Cpu,
            soft: 3,
            hard: 4
        }));
        assert!(
            r.iter()
                .all(|l| l.kind != RlimitKind::As && l.kind != RlimitKind::Nproc)
        );
    }

    #[test]
    fn rlimits_stand_in_for_cgroups_when_asked() {
        let r = rlimits_for(&limits(), true, true);
        assert!(r.contains(&Rlimit {
            kind: RlimitKind::As,
            soft: 1 << 28,
            hard: 1 << 28
        }));
        assert!(r.contains(&Rlimit {
            kind: RlimitKind::Nproc,
            soft: 64,
            hard: 64
        }));
    }

    #[test]
    fn first_free_fd_is_above_every_target() {
        let mut plan = ChildPlan::default();
        assert_eq!(plan.first_free_fd(), 3);
        plan.fd_map = vec![(40, 3), (41, 5), (42, 4)];
        assert_eq!(plan.first_free_fd(), 6);
    }

    #[test]
    fn memfd_reads_back_from_the_start() {
        use std::io::Read;
        let fd = memfd_with(c"t", b"abc\0def").unwrap();
        let mut s = Vec::new();
        std::fs::File::from(fd).read_to_end(&mut s).unwrap();
        assert_eq!(s, b"abc\0def");
    }

    #[test]
    fn raise_fd_moves_above_min() {
        let (r, _w) = pipe().unwrap();
        let raised = raise_fd(r, 100).unwrap();
        assert!(raised.as_raw_fd() >= 100);
    }
}
