//! The sandbox as one ordered list of decisions: `Policy` → `Vec<SetupOp>` → bwrap argv.
//!
//! Pure functions only: what the host looks like comes in as [`SystemView`] data, and which
//! host path backs each policy mount comes in as a list, so the whole layout can be read top
//! to bottom and snapshot-tested. Order matters in bubblewrap (later mounts cover earlier ones,
//! `--remount-ro /` must follow everything that creates paths in the root, the seccomp program
//! is installed last); each such step says why.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use crate::error::NamespaceError;
use crate::{Policy, SandboxCommand};

/// The uid and gid the command has inside the sandbox (and, when the server is root, on the
/// host too): the conventional `nobody`.
pub(crate) const SANDBOX_UID: u32 = 65534;
/// See [`SANDBOX_UID`].
pub(crate) const SANDBOX_GID: u32 = 65534;
/// Hostname inside (UTS namespace): nothing of the host's name leaks.
pub(crate) const HOSTNAME: &str = "sandbox";

/// Descriptor numbers in bwrap's table. 3 is the command's control channel (bwrap passes it
/// through); the others are consumed and closed by bwrap before the command starts.
pub(crate) const CONTROL_FD: i32 = 3;
/// `--args`: every option (with environment values) travels here, not in argv, so that
/// neither host `ps` nor the sandbox's `/proc/1/cmdline` shows them (catalogue I-03).
pub(crate) const ARGS_FD: i32 = 4;
/// `--json-status-fd` (runs) or `--info-fd` (the fork server): bwrap reports the sandbox's
/// pid 1 (its host pid) here; with `--json-status-fd` also the command's exit code, written
/// only when its setup finished and the command was executed (so a run whose sandbox never
/// started is told from a command that exited 1).
pub(crate) const INFO_FD: i32 = 5;
/// `--add-seccomp-fd`: guard + EPERM program.
pub(crate) const SECCOMP_EPERM_FD: i32 = 6;
/// `--add-seccomp-fd`: ENOSYS program.
pub(crate) const SECCOMP_ENOSYS_FD: i32 = 7;
/// `--ro-bind-data` for the synthetic `/etc/passwd`.
pub(crate) const PASSWD_FD: i32 = 8;
/// `--ro-bind-data` for the synthetic `/etc/group`.
pub(crate) const GROUP_FD: i32 = 9;
/// `--ro-bind-data` for the synthetic `/etc/hosts`.
pub(crate) const HOSTS_FD: i32 = 10;

/// Where a fork server gets a run's seccomp programs, which it installs in each run it forks
/// (its own programs are at [`SECCOMP_EPERM_FD`] and [`SECCOMP_ENOSYS_FD`], as a run's are):
/// the EPERM and ENOSYS programs installed before the run's directories are attached, then
/// the EPERM and ENOSYS programs that seal the attaching calls (see
/// `seccomp::ForkedRunPrograms`). `forkserver.py` takes them in this order.
pub(crate) const FORKED_RUN_PROGRAM_FDS: [i32; 4] = [11, 12, 13, 14];

/// Synthetic `/etc/passwd`: the sandbox user only (and root, which some tools look up).
/// Never the host's file: its user names are not the sandbox's business.
pub(crate) const PASSWD: &str = "root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:65534:65534:sandbox:/tmp:/usr/sbin/nologin\n";
/// Synthetic `/etc/group`.
pub(crate) const GROUP: &str = "root:x:0:\nsandbox:x:65534:\n";
/// Synthetic `/etc/hosts`.
pub(crate) const HOSTS: &str = "127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost\n";

/// What the host's root looks like, probed once (see `probe_system_view`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SystemView {
    /// Top-level entries that are symlinks into `/usr` (merged-/usr): (link, target).
    pub(crate) symlinks: Vec<(PathBuf, PathBuf)>,
    /// Top-level directories that are real directories and are needed (`/lib64` on a
    /// non-merged system).
    pub(crate) dirs: Vec<PathBuf>,
    /// `/etc` files present on the host, always bound read-only.
    pub(crate) etc: Vec<PathBuf>,
    /// `/etc` files bound only when the run has network (name resolution for installs).
    pub(crate) etc_network: Vec<PathBuf>,
}

/// `/etc` entries Python, TLS and font rendering need (fontconfig's configuration: without
/// it every matplotlib run printed `Fontconfig error: Cannot load default config file`).
pub(crate) const ETC_ALWAYS: &[&str] = &[
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/etc/ssl/certs",
    "/etc/ssl/openssl.cnf",
    "/etc/mime.types",
    "/etc/fonts",
];
/// `/etc` entries for name resolution, only with network.
pub(crate) const ETC_NETWORK: &[&str] = &[
    "/etc/resolv.conf",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/gai.conf",
];
/// Top-level library and binary directories.
pub(crate) const TOP_DIRS: &[&str] = &["/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"];

/// Look at the host once (the only impure function here).
pub(crate) fn probe_system_view() -> SystemView {
    let mut symlinks = Vec::new();
    let mut dirs = Vec::new();
    for top in TOP_DIRS {
        let path = Path::new(top);
        match fs_err::read_link(path) {
            Ok(target) => symlinks.push((path.to_path_buf(), target)),
            Err(_) if path.is_dir() => dirs.push(path.to_path_buf()),
            Err(_) => {}
        }
    }
    let present = |list: &[&str]| -> Vec<PathBuf> {
        list.iter()
            .map(PathBuf::from)
            .filter(|p| p.exists())
            .collect()
    };
    SystemView {
        symlinks,
        dirs,
        etc: present(ETC_ALWAYS),
        etc_network: present(ETC_NETWORK),
    }
}

/// One bubblewrap setup step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SetupOp {
    /// `--unshare-all`: new user, ipc, pid, net, uts and cgroup namespaces.
    UnshareAll,
    /// `--unshare-user`: explicit, because `--disable-userns` requires it.
    UnshareUser,
    /// `--unshare-cgroup`: explicit, so it fails instead of being skipped (`--unshare-all` only tries).
    UnshareCgroup,
    /// `--dir DEST`: an empty directory (a mount point for later mounts).
    Dir(PathBuf),
    /// `--share-net`: keep the host network (only when the policy allows network).
    ShareNet,
    /// `--disable-userns`: no nested user namespaces (K-02).
    DisableUserns,
    /// `--uid`.
    Uid(u32),
    /// `--gid`.
    Gid(u32),
    /// `--hostname`.
    Hostname(String),
    /// `--die-with-parent`.
    DieWithParent,
    /// `--new-session`.
    NewSession,
    /// `--as-pid-1`: the program is the PID namespace's init, not a child of bwrap's.
    AsPid1,
    /// `--cap-drop ALL`.
    CapDropAll,
    /// `--clearenv`.
    ClearEnv,
    /// `--setenv`.
    SetEnv(String, String),
    /// `--ro-bind SRC DEST`.
    RoBind(PathBuf, PathBuf),
    /// `--bind SRC DEST`.
    Bind(PathBuf, PathBuf),
    /// `--symlink TARGET LINK`.
    Symlink(PathBuf, PathBuf),
    /// `--proc DEST`.
    Proc(PathBuf),
    /// `--dev DEST`.
    Dev(PathBuf),
    /// `[--size N] --tmpfs DEST`.
    Tmpfs(PathBuf, Option<u64>),
    /// `--perms 0444 --ro-bind-data FD DEST`.
    RoData(i32, PathBuf),
    /// `--remount-ro DEST`.
    RemountRo(PathBuf),
    /// `--chdir DIR`.
    Chdir(PathBuf),
    /// `--info-fd FD`.
    InfoFd(i32),
    /// `--json-status-fd FD`.
    StatusFd(i32),
    /// `--add-seccomp-fd FD`.
    SeccompFd(i32),
}

fn check_sandbox_path(path: &Path) -> Result<(), NamespaceError> {
    let normal = path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if normal {
        Ok(())
    } else {
        Err(NamespaceError::BadPath {
            path: path.to_path_buf(),
        })
    }
}

/// The ordered setup of one run. `mount_sources[i]` is the host path bwrap binds for
/// `policy.mounts[i]` (the staged copy when bwrap runs unprivileged); `as_init` makes the
/// command the PID namespace's init (see [`crate::SandboxCommand::init`]).
pub(crate) fn setup_ops(
    policy: &Policy,
    view: &SystemView,
    mount_sources: &[PathBuf],
    as_init: bool,
) -> Result<Vec<SetupOp>, NamespaceError> {
    use SetupOp::*;
    check_sandbox_path(&policy.cwd)?;
    for m in &policy.mounts {
        check_sandbox_path(&m.dest)?;
    }
    let mut ops = vec![
        // 1. Namespaces. All new; the network one is given back only if the policy says so.
        UnshareAll,
        UnshareUser,
        UnshareCgroup,
    ];
    if policy.network {
        ops.push(ShareNet);
    }
    ops.extend([
        DisableUserns,
        Uid(SANDBOX_UID),
        Gid(SANDBOX_GID),
        Hostname(HOSTNAME.into()),
        // 2. Process: the tree dies with bwrap's parent, no controlling terminal (TIOCSTI),
        //    no capabilities even inside the user namespace.
        DieWithParent,
        NewSession,
    ]);
    if as_init {
        // A command that reaps (the runner: its reaper half stays pid 1) is the namespace's
        // init: the kernel drops every signal the run sends it, `kill(-1)` and SIGKILL
        // included, so the run cannot end its reaper before it reports. Under
        // bwrap's init, the reaper was a child the run could kill.
        ops.push(AsPid1);
    }
    ops.extend([
        CapDropAll,
        // 3. Environment: nothing from the host, only the policy's variables.
        ClearEnv,
    ]);
    ops.extend(policy.env.iter().map(|(k, v)| SetEnv(k.clone(), v.clone())));

    // 4. A minimal read-only system view on bwrap's empty tmpfs root.
    ops.push(RoBind("/usr".into(), "/usr".into()));
    ops.extend(
        view.symlinks
            .iter()
            .map(|(link, target)| Symlink(target.clone(), link.clone())),
    );
    ops.extend(view.dirs.iter().map(|d| RoBind(d.clone(), d.clone())));
    ops.extend(view.etc.iter().map(|p| RoBind(p.clone(), p.clone())));
    if policy.network {
        ops.extend(
            view.etc_network
                .iter()
                .map(|p| RoBind(p.clone(), p.clone())),
        );
    }
    ops.extend([
        RoData(PASSWD_FD, "/etc/passwd".into()),
        RoData(GROUP_FD, "/etc/group".into()),
        RoData(HOSTS_FD, "/etc/hosts".into()),
        // Fresh procfs of the new PID namespace: no host processes (F-10, I-05).
        Proc("/proc".into()),
        // Minimal fresh /dev (null, zero, full, random, urandom, tty; no host devices).
        Dev("/dev".into()),
        // Scratch space in memory, capped; /dev/shm too, or it is an uncapped tmpfs.
        // These come after --dev, which would otherwise cover /dev/shm.
        Tmpfs("/tmp".into(), policy.limits.scratch_bytes),
        Tmpfs("/dev/shm".into(), policy.limits.scratch_bytes),
        // /dev itself read-only once /dev/shm is on it (device nodes stay usable: a read-only
        // mount does not stop writes to a device). bwrap's /dev is an uncapped tmpfs the
        // sandbox user may write to, and a fork server's /dev is every forked run's: a file
        // one run left there was seen by its concurrent and later siblings (issue 32, item 7),
        // and its size counted against no scratch cap.
        RemountRo("/dev".into()),
    ]);
    // 5. The policy's mounts come after the system view and /tmp, so a destination under /tmp
    //    is not covered by the tmpfs.
    for (mount, source) in policy.mounts.iter().zip(mount_sources) {
        ops.push(if mount.writable {
            Bind(source.clone(), mount.dest.clone())
        } else {
            RoBind(source.clone(), mount.dest.clone())
        });
    }
    // 6. The root tmpfs itself read-only, after every step that created a path in it; otherwise
    //    the sandbox user (who owns it) could fill memory outside the capped /tmp.
    ops.push(RemountRo("/".into()));
    ops.push(Chdir(policy.cwd.clone()));
    ops.push(StatusFd(INFO_FD));
    // 7. Seccomp last: bwrap installs it right before exec, after all setup syscalls (mount,
    //    pivot_root, ...) that the program forbids.
    ops.push(SeccompFd(SECCOMP_EPERM_FD));
    ops.push(SeccompFd(SECCOMP_ENOSYS_FD));
    Ok(ops)
}

/// The setup of the fork server's sandbox: exactly a run's (the same user namespace as an
/// unprivileged host uid of its own, uid 65534 inside, no capabilities, the same system view,
/// environment, variables, /proc, /dev and limits on /tmp, no-new-privs, seccomp) with three
/// differences. Its seccomp programs are the fork server's ([`super::seccomp::Holder`]), which
/// the server puts at the same descriptors; user namespaces stay possible (each run it forks
/// makes one, nested in the fork server's, and the run's own programs forbid any further);
/// and `mount_points` are created for the directories each run attaches. Never the network.
pub(crate) fn zygote_ops(
    policy: &Policy,
    view: &SystemView,
    mount_sources: &[PathBuf],
    mount_points: &[PathBuf],
) -> Result<Vec<SetupOp>, NamespaceError> {
    use SetupOp::*;
    for point in mount_points {
        check_sandbox_path(point)?;
    }
    let offline = Policy {
        network: false,
        ..policy.clone()
    };
    let mut ops = Vec::new();
    // The fork server stays a child of bwrap's init, which reaps the runs' inits it leaves.
    for op in setup_ops(&offline, view, mount_sources, false)? {
        match op {
            DisableUserns => {}
            // The fork server's bwrap is watched through its pidfd; it needs the pid only.
            StatusFd(fd) => ops.push(InfoFd(fd)),
            RemountRo(root) if root == Path::new("/") => {
                ops.extend(mount_points.iter().cloned().map(Dir));
                ops.push(RemountRo(root));
            }
            other => ops.push(other),
        }
    }
    Ok(ops)
}

/// Options for bwrap's `--args` descriptor (NUL-separated).
pub(crate) fn option_args(ops: &[SetupOp]) -> Vec<OsString> {
    use SetupOp::*;
    let mut out: Vec<OsString> = Vec::new();
    let mut push = |parts: &[&dyn AsRefOs]| out.extend(parts.iter().map(|p| p.os()));
    for op in ops {
        match op {
            UnshareAll => push(&[&"--unshare-all"]),
            UnshareUser => push(&[&"--unshare-user"]),
            UnshareCgroup => push(&[&"--unshare-cgroup"]),
            Dir(d) => push(&[&"--dir", d]),
            ShareNet => push(&[&"--share-net"]),
            DisableUserns => push(&[&"--disable-userns"]),
            Uid(u) => push(&[&"--uid", &u.to_string()]),
            Gid(g) => push(&[&"--gid", &g.to_string()]),
            Hostname(h) => push(&[&"--hostname", h]),
            DieWithParent => push(&[&"--die-with-parent"]),
            NewSession => push(&[&"--new-session"]),
            AsPid1 => push(&[&"--as-pid-1"]),
            CapDropAll => push(&[&"--cap-drop", &"ALL"]),
            ClearEnv => push(&[&"--clearenv"]),
            SetEnv(k, v) => push(&[&"--setenv", k, v]),
            RoBind(s, d) => push(&[&"--ro-bind", s, d]),
            Bind(s, d) => push(&[&"--bind", s, d]),
            Symlink(t, l) => push(&[&"--symlink", t, l]),
            Proc(d) => push(&[&"--proc", d]),
            Dev(d) => push(&[&"--dev", d]),
            Tmpfs(d, Some(size)) => push(&[&"--size", &size.to_string(), &"--tmpfs", d]),
            Tmpfs(d, None) => push(&[&"--tmpfs", d]),
            RoData(fd, d) => push(&[&"--perms", &"0444", &"--ro-bind-data", &fd.to_string(), d]),
            RemountRo(d) => push(&[&"--remount-ro", d]),
            Chdir(d) => push(&[&"--chdir", d]),
            InfoFd(fd) => push(&[&"--info-fd", &fd.to_string()]),
            StatusFd(fd) => push(&[&"--json-status-fd", &fd.to_string()]),
            SeccompFd(fd) => push(&[&"--add-seccomp-fd", &fd.to_string()]),
        }
    }
    out
}

/// The `--args` payload: options separated and terminated by NUL. Fails on a NUL inside a value.
pub(crate) fn args_payload(options: &[OsString]) -> Result<Vec<u8>, crate::SpawnError> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = Vec::new();
    for opt in options {
        let bytes = opt.as_bytes();
        if bytes.contains(&0) {
            return Err(crate::SpawnError::NulByte {
                value: opt.to_string_lossy().into_owned(),
            });
        }
        out.extend_from_slice(bytes);
        out.push(0);
    }
    Ok(out)
}

/// bwrap's real argv: only the descriptor of the options, then the command.
pub(crate) fn bwrap_argv(command: &SandboxCommand) -> Vec<OsString> {
    let mut argv: Vec<OsString> = vec!["--args".into(), ARGS_FD.to_string().into(), "--".into()];
    argv.push(command.program.clone().into_os_string());
    argv.extend(command.args.iter().cloned());
    argv
}

trait AsRefOs {
    fn os(&self) -> OsString;
}
impl AsRefOs for &str {
    fn os(&self) -> OsString {
        (*self).into()
    }
}
impl AsRefOs for String {
    fn os(&self) -> OsString {
        self.into()
    }
}
impl AsRefOs for PathBuf {
    fn os(&self) -> OsString {
        self.clone().into_os_string()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Limits, Mount};

    fn view() -> SystemView {
        SystemView {
            symlinks: vec![
                ("/bin".into(), "usr/bin".into()),
                ("/lib".into(), "usr/lib".into()),
                ("/lib64".into(), "usr/lib64".into()),
                ("/sbin".into(), "usr/sbin".into()),
            ],
            dirs: vec![],
            etc: ETC_ALWAYS.iter().map(PathBuf::from).collect(),
            etc_network: ETC_NETWORK.iter().map(PathBuf::from).collect(),
        }
    }

    fn policy(network: bool) -> Policy {
        Policy {
            mounts: vec![
                Mount {
                    host: "/root/.pyenv/versions/3.11.7".into(),
                    dest: "/opt/python".into(),
                    writable: false,
                },
                Mount {
                    host: "/srv/work/run-1".into(),
                    dest: "/tmp/work".into(),
                    writable: true,
                },
            ],
            network,
            env: vec![
                ("PATH".into(), "/opt/python/bin:/usr/bin".into()),
                ("SECRET_TOKEN".into(), "s3cr3t".into()),
            ],
            cwd: "/tmp/work".into(),
            limits: Limits {
                wall_time: Duration::from_secs(30),
                cpu_time: None,
                memory_bytes: None,
                max_processes: None,
                max_output_bytes: 1000,
                scratch_bytes: Some(64 << 20),
                file_size_bytes: None,
                open_files: None,
                cpu_millicores: None,
            },
            identity: crate::Identity::Untrusted,
            cpu: None,
        }
    }

    fn render(policy: &Policy) -> String {
        let sources = vec![
            PathBuf::from("/run/snakebox-stage/0"),
            PathBuf::from("/run/snakebox-stage/1"),
        ];
        let ops = setup_ops(policy, &view(), &sources, true).unwrap();
        let args = option_args(&ops);
        // One option per line, its values after it.
        let mut text = String::new();
        for a in args {
            let a = a.to_string_lossy().into_owned();
            if a.starts_with("--") && !text.is_empty() {
                text.push('\n');
            } else if !text.is_empty() {
                text.push(' ');
            }
            text.push_str(&a);
        }
        text
    }

    #[test]
    fn offline_policy_snapshot() {
        insta::assert_snapshot!(render(&policy(false)));
    }

    #[test]
    fn network_policy_snapshot() {
        insta::assert_snapshot!(render(&policy(true)));
    }

    #[test]
    fn secrets_stay_out_of_argv_and_the_command_follows_a_double_dash() {
        let cmd = SandboxCommand {
            program: "/opt/python/bin/python3".into(),
            args: vec!["--version".into()],
            control_channel: false,
            init: false,
        };
        let argv = bwrap_argv(&cmd);
        assert_eq!(
            argv,
            ["--args", "4", "--", "/opt/python/bin/python3", "--version"].map(OsString::from)
        );
        assert!(!argv.iter().any(|a| a.to_string_lossy().contains("s3cr3t")));
        let payload = args_payload(&option_args(
            &setup_ops(&policy(false), &view(), &[], true).unwrap(),
        ))
        .unwrap();
        assert!(payload.ends_with(b"--add-seccomp-fd\x007\x00"));
    }

    #[test]
    fn order_sensitive_steps() {
        let ops = setup_ops(&policy(false), &view(), &["/a".into(), "/b".into()], true).unwrap();
        let pos = |op: &SetupOp| ops.iter().position(|o| o == op).unwrap();
        // Seccomp last, remount-ro after every mount, /tmp before mounts under it.
        assert_eq!(ops.last(), Some(&SetupOp::SeccompFd(SECCOMP_ENOSYS_FD)));
        assert!(
            pos(&SetupOp::RemountRo("/".into()))
                > pos(&SetupOp::Bind("/b".into(), "/tmp/work".into()))
        );
        assert!(
            pos(&SetupOp::Tmpfs("/tmp".into(), Some(64 << 20)))
                < pos(&SetupOp::Bind("/b".into(), "/tmp/work".into()))
        );
        assert!(
            pos(&SetupOp::Dev("/dev".into()))
                < pos(&SetupOp::Tmpfs("/dev/shm".into(), Some(64 << 20)))
        );
        // /dev read-only after everything mounted on it, before the policy's own mounts.
        assert!(
            pos(&SetupOp::RemountRo("/dev".into()))
                > pos(&SetupOp::Tmpfs("/dev/shm".into(), Some(64 << 20)))
        );
        assert!(!ops.contains(&SetupOp::ShareNet));
        // The command that reaps is the namespace's init; one that does not stays under bwrap's.
        assert_eq!(pos(&SetupOp::AsPid1), pos(&SetupOp::NewSession) + 1);
        let plain = setup_ops(&policy(false), &view(), &[], false).unwrap();
        assert!(!plain.contains(&SetupOp::AsPid1));
        assert!(!ops.iter().any(|o| matches!(o, SetupOp::RoBind(p, _) if p.starts_with("/etc/shadow") || p == Path::new("/etc/passwd"))));
    }

    #[test]
    fn the_fork_servers_sandbox_is_a_runs_with_nested_user_namespaces_allowed() {
        use SetupOp::*;
        let p = policy(true);
        let sources: Vec<PathBuf> = p.mounts.iter().map(|m| m.host.clone()).collect();
        let points = [PathBuf::from("/snakebox"), PathBuf::from("/work")];
        let ops = zygote_ops(&p, &view(), &sources, &points).unwrap();
        let run = setup_ops(&policy(false), &view(), &sources, true).unwrap();
        // A run's isolation: every namespace new (user included), its uid, no capabilities,
        // seccomp (the fork server's programs sit at the same descriptors).
        for kept in [
            UnshareAll,
            UnshareUser,
            UnshareCgroup,
            Uid(SANDBOX_UID),
            Gid(SANDBOX_GID),
            CapDropAll,
            NewSession,
            DieWithParent,
            ClearEnv,
            SeccompFd(SECCOMP_EPERM_FD),
            SeccompFd(SECCOMP_ENOSYS_FD),
        ] {
            assert!(ops.contains(&kept), "{kept:?}");
        }
        // Never the network, even when the policy allows it; nested user namespaces allowed.
        assert!(!ops.contains(&ShareNet));
        assert!(!ops.contains(&DisableUserns));
        // Otherwise the same steps as a run, plus the mount points, made before the root
        // turns read-only.
        let ro = ops
            .iter()
            .position(|op| op == &RemountRo("/".into()))
            .unwrap();
        for point in &points {
            assert!(ops[..ro].contains(&Dir(point.clone())));
        }
        // A run's runner is its namespace's init; the fork server stays under bwrap's, which
        // reaps the inits of the runs it leaves behind.
        assert!(run.contains(&AsPid1) && !ops.contains(&AsPid1));
        // Its status is bwrap's `--info-fd` (the pid only), a run's `--json-status-fd`.
        assert!(ops.contains(&InfoFd(INFO_FD)) && run.contains(&StatusFd(INFO_FD)));
        let extra: Vec<&SetupOp> = ops.iter().filter(|op| !run.contains(op)).collect();
        assert!(
            extra.iter().all(|op| matches!(op, Dir(_) | InfoFd(_))),
            "{extra:?}"
        );
    }

    #[test]
    fn relative_or_dotdot_paths_are_refused() {
        let mut p = policy(false);
        p.cwd = "work".into();
        assert!(matches!(
            setup_ops(&p, &view(), &[], true),
            Err(NamespaceError::BadPath { .. })
        ));
        let mut p = policy(false);
        p.mounts[0].dest = "/opt/../etc".into();
        assert!(matches!(
            setup_ops(&p, &view(), &[], true),
            Err(NamespaceError::BadPath { .. })
        ));
    }

    #[test]
    fn nul_in_a_value_is_refused() {
        assert!(args_payload(&["a\0b".into()]).is_err());
    }
}
