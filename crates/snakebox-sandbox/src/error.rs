//! Errors, one enum per mechanism, each with a `hint()` that tells the operator how to fix it.
//!
//! Messages state the failed operation with the offending value last, in backticks; the cause
//! is kept in `#[source]` and never repeated in the message, so a caller printing the chain
//! sees every fact exactly once.

use std::io;
use std::path::PathBuf;

/// Starting, supervising or killing the sandboxed process failed.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The program could not be started.
    #[error("Failed to start `{}`", program.display())]
    Start {
        /// Host path of the program we tried to start (bwrap, or the command itself for `none`).
        program: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A pipe or memfd for the run could not be created or written.
    #[error("Failed to prepare the descriptor for `{what}`")]
    Descriptor {
        /// What the descriptor was for (`stdout`, `control channel`, `bwrap arguments`, ...).
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Waiting for the process failed.
    #[error("Failed to wait for the sandboxed process `{pid}`")]
    Wait {
        /// Host pid of the direct child.
        pid: u32,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A path given to the sandbox is unusable.
    #[error("Failed to use the path `{}`", path.display())]
    Path {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The fork server could not start, or could not set up one run's sandbox.
    #[error("The fork server failed: {message}")]
    ForkServer {
        /// What went wrong, as the fork server or the server saw it.
        message: String,
        /// Whether it failed before any user code ran (the run can be started another way).
        before_user_code: bool,
    },
    /// A value cannot be passed to the process (for example a NUL byte in an argument).
    #[error("Failed to pass a value containing a NUL byte to the sandbox: `{value}`")]
    NulByte {
        /// The offending value (lossy).
        value: String,
    },
}

impl SpawnError {
    /// How to fix it, when there is something the operator can do.
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::Start { program, source } if source.kind() == io::ErrorKind::NotFound => {
                Some(format!(
                    "check that `{}` exists inside the sandbox view",
                    program.display()
                ))
            }
            Self::Descriptor { .. } => {
                Some("the server may have run out of file descriptors: raise `ulimit -n`".into())
            }
            Self::Path { .. } => Some("create the path or fix its permissions".into()),
            Self::NulByte { .. } => Some("remove NUL bytes from arguments and environment".into()),
            Self::ForkServer { .. } => Some(
                "retry: the next run starts a fresh sandbox the usual way; `--fork-server off` turns the fork server off".into(),
            ),
            _ => None,
        }
    }
}

/// Building or loading the seccomp program failed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The filter rules could not be compiled to BPF.
    #[error("Failed to compile the seccomp filter for architecture `{arch}`")]
    Compile {
        /// Target architecture.
        arch: &'static str,
        /// The compiler's error.
        #[source]
        source: seccompiler::BackendError,
    },
    /// No filter exists for this CPU architecture.
    #[error("Failed to find a seccomp filter for architecture `{arch}`")]
    UnsupportedArch {
        /// `std::env::consts::ARCH`.
        arch: &'static str,
    },
    /// The kernel refuses seccomp filters.
    #[error("Failed to confirm kernel seccomp filter support with `prctl(PR_GET_SECCOMP)`")]
    Unavailable {
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl SeccompError {
    /// How to fix it, when there is something the operator can do.
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::Compile { .. } => None,
            Self::UnsupportedArch { .. } => Some(
                "run on x86_64 or aarch64, or pass `--sandbox-backend none` to run WITHOUT isolation"
                    .into(),
            ),
            Self::Unavailable { .. } => Some(
                "use a kernel built with CONFIG_SECCOMP_FILTER (and a container runtime that allows it), or pass `--sandbox-backend none` to run WITHOUT isolation"
                    .into(),
            ),
        }
    }
}

/// Creating, configuring, joining or removing a cgroup failed.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A cgroup file could not be read.
    #[error("Failed to read the cgroup file `{}`", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A value could not be written to a cgroup file.
    #[error("Failed to write `{value}` to the cgroup file `{}`", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The value.
        value: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The per-run cgroup directory could not be created.
    #[error("Failed to create the run cgroup `{}`", path.display())]
    Create {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The per-run cgroup directory could not be removed (processes still in it).
    #[error("Failed to remove the run cgroup `{}`", path.display())]
    Remove {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `/proc/self/cgroup` has no line for the controller.
    #[error("Failed to find our own cgroup for the controller `{controller}`")]
    NotFound {
        /// `memory`, `pids`, or `` (empty) for the v2 unified hierarchy.
        controller: String,
    },
    /// The server's own cgroup v2 cannot be divided into run cgroups.
    #[error("The server's cgroup v2 `{}` is not delegated to it: {why}", path.display())]
    NotDelegated {
        /// The server's own cgroup.
        path: PathBuf,
        /// Whether the server runs as root (the fix differs).
        root: bool,
        /// Why not.
        why: crate::cgroup::Undelegated,
    },
}

impl CgroupError {
    /// How to fix it, when there is something the operator can do.
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::Write { .. } | Self::Create { .. } => Some(
                "delegate a writable cgroup to the server (systemd: `Delegate=yes`, for a normal user `systemd-run --user --scope -p Delegate=yes snakebox serve`; docker: `--cgroupns=private` with a writable /sys/fs/cgroup); meanwhile memory is limited by the supervisor's watchdog and processes by RLIMIT_NPROC"
                    .into(),
            ),
            Self::Remove { .. } => {
                Some("a process of a previous run may still be alive; it is killed on retry".into())
            }
            Self::NotDelegated { path, root, why } => Some(format!(
                "{}; meanwhile memory is limited by the supervisor's watchdog and processes by RLIMIT_NPROC, and there is no CPU bandwidth limit{}",
                delegation_fix(path, *root, why),
                if *root { " and no fork server" } else { "" }
            )),
            Self::Read { .. } | Self::NotFound { .. } => None,
        }
    }
}

/// What gives the server a cgroup v2 subtree of its own, for the situation it is in.
fn delegation_fix(path: &std::path::Path, root: bool, why: &crate::cgroup::Undelegated) -> String {
    use crate::cgroup::Undelegated;
    const USER_SCOPE: &str = "`systemd-run --user --scope -p Delegate=yes snakebox serve` (as an MCP client's command: `systemd-run` with those arguments, then `snakebox serve ...`)";
    if root {
        return match why {
            Undelegated::ControllerMissing { .. } | Undelegated::NotMarked => "run the server in a systemd unit with `Delegate=yes` (systemd 251 or later marks such a unit's cgroup): `systemd-run --scope -p Delegate=yes snakebox serve`, or `Delegate=yes` in its service file".into(),
            Undelegated::Shared { .. } | Undelegated::Refused { .. } => "run the server as the only process of a unit with `Delegate=yes`: `systemd-run --scope -p Delegate=yes snakebox serve`, or a service of its own".into(),
            Undelegated::NotOwned => "run the server in a systemd unit with `Delegate=yes`".into(),
        };
    }
    let session = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("session-") && n.ends_with(".scope"));
    match why {
        Undelegated::Shared { .. } if !session => format!(
            "the server shares its cgroup with other programs (a terminal's, a desktop's or an IDE's scope): start it in a scope of its own, {USER_SCOPE}"
        ),
        Undelegated::ControllerMissing { controller } if !session => format!(
            "the unit is not offered `{controller}`: start the server with {USER_SCOPE}; if that does not offer it either, the user manager delegates too little (`systemctl edit user@.service`: `[Service]` `Delegate=memory pids cpu`)"
        ),
        _ if session => format!(
            "a login session's cgroup is not delegated to its user: start the server with {USER_SCOPE}"
        ),
        _ => format!("start the server with {USER_SCOPE}"),
    }
}

/// Setting up namespaces (bubblewrap, user namespaces, mount staging) failed.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    /// bubblewrap is not installed or not executable.
    #[error("Failed to find bubblewrap at `{}`", path.display())]
    BwrapMissing {
        /// Where we looked.
        path: PathBuf,
        /// Whether the operator named that path (`--bwrap-path`) rather than `PATH` was searched.
        given: bool,
    },
    /// bubblewrap could not be executed for the probe.
    #[error("Failed to run the bubblewrap probe `{}`", path.display())]
    Probe {
        /// bwrap path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The probe sandbox did not start; bwrap said why.
    #[error(
        "Failed to create a sandbox with bubblewrap (user namespaces may be disabled): `{stderr}`"
    )]
    SandboxRefused {
        /// bwrap's stderr, trimmed.
        stderr: String,
    },
    /// A run's sandbox stopped before its command ran; bwrap said why.
    #[error("Failed to start the sandbox: bubblewrap stopped before the command ran: `{stderr}`")]
    SetupFailed {
        /// bwrap's stderr (its end), trimmed.
        stderr: String,
    },
    /// The probe sandbox started but a property did not hold.
    #[error("Failed to verify the isolation property `{property}`")]
    NotIsolated {
        /// The property that did not hold (e.g. `uid 65534 inside`).
        property: String,
    },
    /// The staging area for bind-mount sources could not be prepared.
    #[error("Failed to prepare the mount staging directory `{}`", path.display())]
    Staging {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A sandbox path must be absolute and free of `..`.
    #[error("Failed to accept a sandbox path that is not absolute and normal: `{}`", path.display())]
    BadPath {
        /// The path.
        path: PathBuf,
    },
    /// The backend was asked for something it does not implement yet.
    #[error("Failed to select the sandbox backend `{backend}`")]
    Unsupported {
        /// The backend name.
        backend: String,
    },
}

impl NamespaceError {
    /// How to fix it, when there is something the operator can do.
    pub fn hint(&self) -> Option<String> {
        const NONE: &str = "or pass `--sandbox-backend none` to run WITHOUT isolation";
        match self {
            Self::BwrapMissing { given: true, .. } => Some(format!(
                "nothing executable is at that path: fix `--bwrap-path` (`[sandbox] bwrap_path`), \
                 or leave it out to find bwrap on PATH; {NONE}"
            )),
            Self::BwrapMissing { .. } | Self::Probe { .. } => Some(format!(
                "install bubblewrap (`apt-get install bubblewrap`), {NONE}"
            )),
            Self::SandboxRefused { stderr } => Some(
                // bubblewrap 0.8 says "No permissions to create new namespace", older ones
                // "No permissions to creating new namespace".
                if stderr.contains("setting up uid map")
                    || stderr.contains("No permissions to creat")
                    || stderr.contains("Operation not permitted")
                {
                    format!(
                        "enable unprivileged user namespaces (`sysctl kernel.unprivileged_userns_clone=1`, `sysctl user.max_user_namespaces=15000`, on Ubuntu also `sysctl kernel.apparmor_restrict_unprivileged_userns=0`); inside a Docker container run it with `--security-opt seccomp=unconfined --security-opt systempaths=unconfined`, plus `--security-opt apparmor=unconfined` where AppArmor confines containers (docs/src/install.md, \"With Docker\"), or use the host; {NONE}"
                    )
                } else if stderr.contains("Unknown option") {
                    format!(
                        "this bubblewrap is too old: snakebox needs 0.8 or newer (`--disable-userns`; Debian 12 and Ubuntu 24.04 ship one, Debian 11 has 0.4); install a newer one and pass `--bwrap-path`, {NONE}"
                    )
                } else {
                    format!("check bubblewrap's message above; {NONE}")
                },
            ),
            Self::SetupFailed { stderr } if stderr.contains("Resource temporarily unavailable") || stderr.contains("No space left on device") => Some(
                "the server's user ran out of processes or user namespaces: check `ulimit -u` and `sysctl user.max_user_namespaces` for the user running snakebox, and what else that user runs; `snakebox check` shows how the process limit is enforced here".into(),
            ),
            Self::SetupFailed { stderr } => Self::SandboxRefused {
                stderr: stderr.clone(),
            }
            .hint(),
            Self::NotIsolated { .. } => Some(format!("report this as a bug, {NONE}")),
            Self::Staging { .. } => {
                Some("run the server as root, or as a user that can read every mounted path".into())
            }
            Self::BadPath { .. } => Some("use absolute paths without `..`".into()),
            Self::Unsupported { .. } => Some(format!("use `--sandbox-backend native`, {NONE}")),
        }
    }
}

/// The Docker engine, the run image, or one container of the docker backend.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    /// The engine did not answer on its socket (or answered an older API than we need).
    #[error("Failed to reach the Docker engine at `{socket}`")]
    Unreachable {
        /// The socket we tried.
        socket: String,
        /// What the client saw.
        #[source]
        source: bollard::errors::Error,
    },
    /// The run image is not in the engine.
    #[error("The docker backend's run image is missing: `{tag}`")]
    ImageMissing {
        /// The tag this host's image has (it is named by its content).
        tag: String,
    },
    /// The configured runtime is not registered with the engine.
    #[error("The Docker engine has no runtime `{runtime}`")]
    RuntimeMissing {
        /// The runtime asked for (`runsc`).
        runtime: String,
    },
    /// A request to the engine failed.
    #[error("Failed to {what} through the Docker engine")]
    Request {
        /// The operation (`create the container`, `import the run image`, ...).
        what: &'static str,
        /// What the engine answered.
        #[source]
        source: bollard::errors::Error,
    },
    /// A created container is not hardened as asked: the engine ignored or changed a field.
    #[error(
        "The Docker engine did not apply the hardening of the container: {field} is `{found}`, expected `{expected}`"
    )]
    Hardening {
        /// The field (`HostConfig.ReadonlyRootfs`, ...).
        field: String,
        /// What inspecting the container showed.
        found: String,
        /// What we asked for.
        expected: String,
    },
    /// The policy asks for something this backend does not give runs.
    #[error("The docker backend does not support this: {reason}")]
    Unsupported {
        /// What is not supported.
        reason: String,
    },
}

impl DockerError {
    /// How to fix it, when there is something the operator can do.
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::Unreachable { .. } => Some(
                "start the engine (`scripts/dockerd` starts Debian's dockerd), check that the server may use its socket (root or the `docker` group), and that it speaks Engine API 1.41 or newer (Docker 20.10+); or use `--sandbox-backend native`".into(),
            ),
            Self::ImageMissing { .. } => {
                Some("build it with `snakebox image build` (local, no registry needed)".into())
            }
            Self::RuntimeMissing { runtime } => Some(format!(
                "register it with the engine (`dockerd --add-runtime {runtime}=/usr/bin/{runtime}`, or `runtimes` in daemon.json) and restart it"
            )),
            Self::Hardening { .. } => Some(
                "use an engine that supports every field (Docker 20.10 or newer, API 1.41); the container was removed and nothing ran".into(),
            ),
            Self::Unsupported { reason } if reason.contains("as root") => Some(
                "run the server as root, or use `--sandbox-backend native` (bubblewrap works unprivileged)".into(),
            ),
            Self::Request { .. } | Self::Unsupported { .. } => None,
        }
    }
}

/// Serving a file-system image over FUSE (a normal user's sessions' disk) failed, or cannot
/// be done here.
#[derive(Debug, thiserror::Error)]
pub enum FuseError {
    /// The server has no user and mount namespace of its own to mount in.
    #[error("The server is not root and has no user and mount namespace of its own to mount in")]
    NoNamespace,
    /// This program cannot act as `fuse2fs`'s mount helper.
    #[error("This program cannot hand `fuse2fs` its mount (only the snakebox binary can)")]
    NoHelper,
    /// `/dev/fuse` cannot be opened.
    #[error("Failed to open `/dev/fuse`")]
    Device {
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `fuse2fs` is not installed.
    #[error("`fuse2fs` is not installed")]
    Fuse2fsMissing,
    /// bubblewrap, which confines `fuse2fs`, is not installed.
    #[error("bubblewrap (`bwrap`), which confines `fuse2fs`, is not installed")]
    BwrapMissing,
    /// Something `fuse2fs`'s sandbox needs could not be prepared or started.
    #[error("Failed to start `fuse2fs` in its sandbox: {what}")]
    Start {
        /// What failed (`bwrap`, `seccomp`, `descriptors`, ...).
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The image cannot be opened for writing.
    #[error("Failed to open the image `{}`", image.display())]
    Image {
        /// The image.
        image: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Another `fuse2fs` still holds the image.
    #[error("The image `{}` is still held by another `fuse2fs`", image.display())]
    Held {
        /// The image.
        image: PathBuf,
    },
    /// The FUSE file system could not be mounted.
    #[error("Failed to mount a FUSE file system at `{}`", dir.display())]
    Mount {
        /// The mount point.
        dir: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `fuse2fs` started but does not serve the mount.
    #[error("`fuse2fs` does not serve the image: {said}")]
    NotServing {
        /// What it said, or why it is taken as not serving.
        said: String,
    },
}

impl FuseError {
    /// How to fix it, when there is something the operator can do.
    #[must_use]
    pub fn hint(&self) -> Option<String> {
        Some(match self {
            Self::NoNamespace => "enable unprivileged user namespaces (`sysctl kernel.unprivileged_userns_clone=1`, or on Ubuntu an AppArmor profile allowing them), or run the server as root".into(),
            Self::NoHelper => "run the `snakebox` binary itself".into(),
            Self::Device { .. } => "load the fuse module (`modprobe fuse`); in a container, pass the device (`--device /dev/fuse`)".into(),
            Self::Fuse2fsMissing => "install fuse2fs (Debian and Ubuntu: `apt-get install fuse2fs`)".into(),
            Self::BwrapMissing => "install bubblewrap (`apt-get install bubblewrap`)".into(),
            Self::Held { .. } => "another live server of this data directory serves it (a normal user's servers cannot share a data directory's sessions: give each its own --data-dir), or an earlier server's fuse2fs is still writing it out (it ends once that server's last process is gone)".into(),
            Self::Image { .. } => "the image must be the server's user's, and writable (an image a root server made is root's: start the server as root, or give this one a --data-dir of its own)".into(),
            Self::Start { .. } | Self::Mount { .. } | Self::NotServing { .. } => return None,
        })
    }
}

/// Any failure of the sandbox, by mechanism.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// Spawning or supervising.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// The seccomp program.
    #[error(transparent)]
    Seccomp(#[from] SeccompError),
    /// cgroups.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// Namespaces and bubblewrap.
    #[error(transparent)]
    Namespace(#[from] NamespaceError),
    /// The Docker engine (the docker backend).
    #[error(transparent)]
    Docker(#[from] DockerError),
}

impl SandboxError {
    /// Whether the run failed before any of its code ran for a reason that another way of
    /// starting it (a cold sandbox) does not share.
    #[must_use]
    pub fn retry_elsewhere(&self) -> bool {
        matches!(
            self,
            Self::Spawn(SpawnError::ForkServer {
                before_user_code: true,
                ..
            })
        )
    }

    /// How to fix it, when there is something the operator can do.
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::Spawn(e) => e.hint(),
            Self::Seccomp(e) => e.hint(),
            Self::Cgroup(e) => e.hint(),
            Self::Namespace(e) => e.hint(),
            Self::Docker(e) => e.hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::NamespaceError;

    fn hint_for(stderr: &str) -> String {
        NamespaceError::SandboxRefused {
            stderr: stderr.to_owned(),
        }
        .hint()
        .unwrap_or_default()
    }

    #[test]
    fn a_refused_namespace_in_a_container_gets_the_docker_flags() {
        // What bubblewrap 0.8 prints in a container with Docker's default seccomp profile,
        // then with it off but /proc masked.
        for stderr in [
            "bwrap: No permissions to create new namespace, likely because the kernel does not allow non-privileged user namespaces.",
            "bwrap: No permissions to creating new namespace, likely because the kernel does not allow non-privileged user namespaces.",
            "bwrap: Can't mount proc on /newroot/proc: Operation not permitted",
        ] {
            let hint = hint_for(stderr);
            assert!(hint.contains("seccomp=unconfined"), "{stderr}: {hint}");
            assert!(hint.contains("systempaths=unconfined"), "{stderr}: {hint}");
        }
        assert!(
            !hint_for("bwrap: execvp python3: No such file or directory").contains("unconfined")
        );
    }

    #[test]
    fn an_old_bubblewrap_is_named_as_the_cause() {
        // What Debian 11's bubblewrap 0.4.1 prints.
        let hint = hint_for("bwrap: Unknown option --disable-userns");
        assert!(hint.contains("0.8 or newer"), "{hint}");
    }
}
