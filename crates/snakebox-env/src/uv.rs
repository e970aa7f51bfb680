//! Finding the real uv binary, and running it.
//!
//! [`Uv::locate`] always ends at the real executable, never at a shim: a pyenv shim is a shell
//! script that re-enters pyenv, which cannot work inside a sandbox and adds tens of
//! milliseconds to every call. How uv (or anything else an install runs) is *run* is a
//! [`UvRunner`]: [`DirectUvRunner`] spawns it on the host with an allow-listed environment;
//! [`snakebox_sandbox::Sandbox`] itself is a runner that runs the same invocation under
//! [`UvInvocation::policy`], which follows the invocation's [`Role`]: the trusted downloader
//! (the installer's uid, write access to the build directory and uv's cache, the network
//! through the egress proxy) or package code (a run's uid and limits, no network). Every
//! invocation is described as data ([`UvInvocation`]) so both runners, and test doubles, see
//! exactly the same thing.

use std::ffi::OsString;
use std::fmt;
use std::future::Future;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use crate::env_vars::EnvVars;
use crate::error::EnvError;

/// The uv binary snakebox uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uv {
    /// The real binary (symlinks resolved, never a shim).
    pub path: PathBuf,
    /// Its version, e.g. `0.13.9`.
    pub version: String,
}

impl Uv {
    /// Find uv, in this order: the explicit path (`--uv-path`); `uv` on `PATH` (a pyenv shim is
    /// resolved to the real binary installed in a pyenv version); `~/.local/bin/uv`,
    /// `~/.cargo/bin/uv`; uv installed by pip into a pyenv version, `/usr/local/bin` or
    /// `/usr/bin`. Each candidate must answer `uv --version`.
    ///
    /// # Errors
    ///
    /// [`EnvError::UvUnusable`] when the explicit path does not work (no fallback: the
    /// operator asked for that one), [`EnvError::UvNotFound`] listing every place searched.
    pub fn locate(explicit: Option<&Path>) -> Result<Uv, EnvError> {
        let home = std::env::var_os(EnvVars::HOME).map(PathBuf::from);
        let pyenv_root = pyenv_root(home.as_deref());
        let mut looked = Vec::new();

        if let Some(path) = explicit {
            // A bare name (`--uv-path uv`, as mcp-python-exec-sandbox documents it) is looked
            // up on PATH, as a shell would; anything with a slash is a path.
            let on_path = bare_name(path).and_then(|name| {
                find_on_path(name, &std::env::var_os(EnvVars::PATH).unwrap_or_default())
            });
            if bare_name(path).is_some() && on_path.is_none() {
                return Err(EnvError::UvUnusable {
                    path: path.to_path_buf(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!(
                            "no `{}` on PATH (a name without a slash is looked up there)",
                            path.display()
                        ),
                    ),
                });
            }
            let path = on_path.as_deref().unwrap_or(path);
            let candidates = expand_candidate(path, pyenv_root.as_deref(), &mut looked);
            let mut last_error = None;
            for candidate in candidates {
                match probe(&candidate) {
                    Ok(uv) => return Ok(uv),
                    Err(err) => last_error = Some(err),
                }
            }
            return Err(EnvError::UvUnusable {
                path: path.to_path_buf(),
                source: last_error.unwrap_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("no uv binary found behind `{}`", path.display()),
                    )
                }),
            });
        }

        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Some(path_var) = std::env::var_os(EnvVars::PATH) {
            candidates.extend(std::env::split_paths(&path_var).map(|dir| dir.join("uv")));
        }
        if let Some(home) = &home {
            candidates.push(home.join(".local/bin/uv"));
            candidates.push(home.join(".cargo/bin/uv"));
        }
        if let Some(root) = &pyenv_root {
            candidates.extend(pyenv_version_bins(root, "uv"));
        }
        candidates.push(PathBuf::from("/usr/local/bin/uv"));
        candidates.push(PathBuf::from("/usr/bin/uv"));

        let mut tried = Vec::new();
        for candidate in candidates {
            if !candidate.exists() {
                continue;
            }
            for real in expand_candidate(&candidate, pyenv_root.as_deref(), &mut looked) {
                if tried.contains(&real) {
                    continue;
                }
                tried.push(real.clone());
                match probe(&real) {
                    Ok(uv) => return Ok(uv),
                    Err(err) => looked.push(format!("{} ({err})", real.display())),
                }
            }
        }
        if looked.is_empty() {
            looked.push("PATH".to_owned());
            looked.push("~/.local/bin".to_owned());
            looked.push("~/.cargo/bin".to_owned());
            looked.push("pyenv versions".to_owned());
            looked.push("/usr/local/bin".to_owned());
            looked.push("/usr/bin".to_owned());
        }
        Err(EnvError::UvNotFound { looked })
    }

    /// The directory holding the binary (mounted read-only in the install sandbox).
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("/"))
    }
}

/// `path` when it is a bare program name (no slash, not `.` or `..`).
fn bare_name(path: &Path) -> Option<&std::ffi::OsStr> {
    let text = path.as_os_str();
    let bare =
        !text.is_empty() && !text.as_encoded_bytes().contains(&b'/') && text != "." && text != "..";
    bare.then_some(text)
}

/// The first file called `name` in the directories of `path_var` (a `PATH` value), as a shell
/// finds a program.
fn find_on_path(name: &std::ffi::OsStr, path_var: &std::ffi::OsStr) -> Option<PathBuf> {
    std::env::split_paths(path_var)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// The real binaries a candidate path stands for: itself (symlinks resolved), or, for a pyenv
/// shim, `uv` in each pyenv version (highest first). Other scripts are rejected.
fn expand_candidate(
    path: &Path,
    pyenv_root: Option<&Path>,
    looked: &mut Vec<String>,
) -> Vec<PathBuf> {
    let Ok(real) = path.canonicalize() else {
        looked.push(format!("{} (not found)", path.display()));
        return Vec::new();
    };
    match script_text(&real) {
        None => vec![real],
        Some(text) if text.contains("pyenv") => {
            let root = shim_pyenv_root(&real, &text).or_else(|| pyenv_root.map(Path::to_path_buf));
            let found: Vec<PathBuf> = root
                .as_deref()
                .map(|root| pyenv_version_bins(root, "uv"))
                .unwrap_or_default()
                .into_iter()
                .filter_map(|p| p.canonicalize().ok())
                .collect();
            if found.is_empty() {
                looked.push(format!(
                    "{} (pyenv shim; no pyenv version has uv)",
                    path.display()
                ));
            }
            found
        }
        Some(_) => {
            looked.push(format!("{} (a script, not the uv binary)", path.display()));
            Vec::new()
        }
    }
}

/// The text of `path` when it is a script (`#!`), `None` for a binary.
pub(crate) fn script_text(path: &Path) -> Option<String> {
    let mut file = fs_err::File::open(path).ok()?;
    let mut head = [0_u8; 2];
    file.read_exact(&mut head).ok()?;
    if &head != b"#!" {
        return None;
    }
    let mut rest = Vec::new();
    file.take(16 * 1024).read_to_end(&mut rest).ok()?;
    Some(String::from_utf8_lossy(&rest).into_owned())
}

/// The pyenv root a shim belongs to: `<root>/shims/<name>`, or its `PYENV_ROOT=` line.
fn shim_pyenv_root(shim: &Path, text: &str) -> Option<PathBuf> {
    let dir = shim.parent()?;
    if dir.file_name().is_some_and(|name| name == "shims") {
        let root = dir.parent()?;
        if root.join("versions").is_dir() {
            return Some(root.to_path_buf());
        }
    }
    text.lines()
        .find_map(|line| line.trim().strip_prefix("export PYENV_ROOT="))
        .map(|value| PathBuf::from(value.trim_matches('"')))
}

/// The pyenv root: `$PYENV_ROOT`, else `~/.pyenv` when it exists.
pub(crate) fn pyenv_root(home: Option<&Path>) -> Option<PathBuf> {
    if let Some(root) = std::env::var_os(EnvVars::PYENV_ROOT) {
        return Some(PathBuf::from(root));
    }
    let root = home?.join(".pyenv");
    root.is_dir().then_some(root)
}

/// `<root>/versions/<v>/bin/<name>` for each pyenv version that has it, highest version first.
pub(crate) fn pyenv_version_bins(root: &Path, name: &str) -> Vec<PathBuf> {
    let Ok(entries) = fs_err::read_dir(root.join("versions")) else {
        return Vec::new();
    };
    let mut versions: Vec<(Vec<u64>, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let bin = entry.path().join("bin").join(name);
            let key = entry
                .file_name()
                .to_string_lossy()
                .split('.')
                .map(|part| part.parse::<u64>().unwrap_or(0))
                .collect();
            bin.exists().then_some((key, bin))
        })
        .collect();
    versions.sort_by(|a, b| b.0.cmp(&a.0));
    versions.into_iter().map(|(_, bin)| bin).collect()
}

/// Run `<path> --version` and check it is uv.
fn probe(path: &Path) -> Result<Uv, std::io::Error> {
    let output = std::process::Command::new(path)
        .arg("--version")
        .env_clear()
        .env(EnvVars::PATH, EnvVars::MINIMAL_PATH)
        .stdin(Stdio::null())
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let version = stdout
        .trim()
        .strip_prefix("uv ")
        .and_then(|rest| rest.split_whitespace().next())
        .filter(|_| output.status.success());
    match version {
        Some(version) => Ok(Uv {
            path: path.to_path_buf(),
            version: version.to_owned(),
        }),
        None => Err(std::io::Error::other(format!(
            "`{} --version` did not answer like uv",
            path.display()
        ))),
    }
}

// ---------------------------------------------------------------------------------------------
// Running uv
// ---------------------------------------------------------------------------------------------

/// One uv invocation, as data: what to run and what it needs to see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UvInvocation {
    /// The uv binary.
    pub program: PathBuf,
    /// Arguments (not including the program).
    pub args: Vec<OsString>,
    /// The complete environment (see [`crate::UvEnvironment::for_uv`]).
    pub env: Vec<(String, String)>,
    /// Working directory.
    pub cwd: PathBuf,
    /// Whether uv needs the network (installs do; listing does not).
    pub network: bool,
    /// Host paths uv must be able to read (each visible at the same path).
    pub read_only: Vec<PathBuf>,
    /// Host paths uv must be able to write (each visible at the same path).
    pub writable: Vec<PathBuf>,
    /// Wall-clock limit; the invocation is killed when it is reached.
    pub timeout: Duration,
    /// Short name for messages, e.g. `uv pip install`.
    pub label: String,
    /// Whose code runs: trusted uv only, or package code (see [`Role`]).
    pub role: Role,
    /// With `network`: reach it only through this egress proxy (the sandbox keeps its own
    /// network namespace). `None`: the host network.
    pub egress: Option<Egress>,
    /// The CPU share of whoever holds the slot the step runs in (its sandbox's
    /// [`snakebox_sandbox::Policy::cpu`]); `None`: the default weight.
    pub cpu: Option<snakebox_sandbox::CpuShare>,
}

/// How a sandboxed invocation reaches the network through an
/// [`snakebox_sandbox::EgressProxy`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Egress {
    /// The proxy's Unix socket on the host (mounted at [`snakebox_sandbox::SOCKET_INSIDE`]).
    pub socket: PathBuf,
    /// An interpreter visible inside, to run the bridge (isolated: `-I -S`).
    pub python: PathBuf,
}

/// When a download failed and its install proxy refused connections, append the refusals
/// (host, port, reason) to uv's stderr, so the error says what the policy decided (uv only
/// sees a `403`).
pub fn explain_refusals(proxy: &snakebox_sandbox::EgressProxy, output: &mut UvOutput) {
    if output.success() {
        return;
    }
    if let Some(text) = proxy.explain() {
        if !output.stderr.ends_with(b"\n") && !output.stderr.is_empty() {
            output.stderr.push(b'\n');
        }
        output.stderr.extend_from_slice(text.as_bytes());
        output.stderr.push(b'\n');
    }
}

/// What an invocation may execute, which decides the sandbox it gets.
///
/// The rule (DESIGN.md §3): a dependency's build and import-time code is as untrusted as the
/// user's script. Only [`Role::Downloader`] holds credentials, network and write access to
/// uv's cache, and it must never run package code; everything that does is
/// [`Role::PackageCode`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Role {
    /// Trusted uv resolving, downloading and unpacking wheels (no build, no bytecode
    /// compilation, no interpreter of an environment that has packages). The installer's uid.
    #[default]
    Downloader,
    /// Anything that runs package code (bytecode compilation, sdist builds): a run's identity
    /// and limits, no network, no credentials, uv's cache never mounted.
    PackageCode {
        /// The sandbox identity (a leased run uid under a root server).
        identity: snakebox_sandbox::Identity,
        /// The run limits (wall time = the install timeout).
        limits: snakebox_sandbox::Limits,
    },
}

/// What one uv invocation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UvOutput {
    /// Exit code (`None` when killed by a signal).
    pub exit_code: Option<i32>,
    /// Standard output.
    pub stdout: Vec<u8>,
    /// Standard error.
    pub stderr: Vec<u8>,
}

impl UvOutput {
    /// Whether uv exited with status 0.
    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
    }
}

/// The future returned by [`UvRunner::run`].
pub type UvRunFuture<'a> = Pin<Box<dyn Future<Output = Result<UvOutput, EnvError>> + Send + 'a>>;

/// How uv gets run. The engine picks one and hands it to [`crate::EnvCache::new`].
pub trait UvRunner: Send + Sync + fmt::Debug {
    /// Run one invocation to completion (or until its timeout, which is an
    /// [`EnvError::Timeout`]). A non-zero exit is not an error here: callers read the output.
    fn run<'a>(&'a self, invocation: &'a UvInvocation) -> UvRunFuture<'a>;

    /// Whether invocations are isolated (for `check_environment`).
    fn is_sandboxed(&self) -> bool;

    /// The host uid/gid invocations run as when it is not ours: the directories uv writes
    /// (its cache, the build directory) must belong to it.
    fn writer_ids(&self) -> Option<(u32, u32)> {
        None
    }

    /// An identity for one [`Role::PackageCode`] invocation: never the installer's uid (which
    /// owns uv's cache). Keep the returned value until the invocation's files are handed back.
    fn package_identity(&self) -> PackageIdentity {
        PackageIdentity::default()
    }
}

/// The identity package code runs under, with the lease that reserves its host uid.
#[derive(Debug)]
pub struct PackageIdentity {
    /// For [`Role::PackageCode`].
    pub identity: snakebox_sandbox::Identity,
    /// Its host uid/gid when it is not the server's (the directories it writes must be its).
    pub host_ids: Option<(u32, u32)>,
    _lease: Option<snakebox_sandbox::IdentityLease>,
}

impl Default for PackageIdentity {
    fn default() -> Self {
        Self {
            identity: snakebox_sandbox::Identity::Untrusted,
            host_ids: None,
            _lease: None,
        }
    }
}

/// Anything [`crate::EnvCache::new`] accepts as its installer: an `Arc` of a runner
/// (`Arc<Sandbox>`, `Arc<DirectUvRunner>`) or an `Arc<dyn UvRunner>`.
pub trait IntoUvRunner {
    /// The shared runner.
    fn into_uv_runner(self) -> Arc<dyn UvRunner>;
}

impl<R: UvRunner + 'static> IntoUvRunner for Arc<R> {
    fn into_uv_runner(self) -> Arc<dyn UvRunner> {
        self
    }
}

impl IntoUvRunner for Arc<dyn UvRunner> {
    fn into_uv_runner(self) -> Arc<dyn UvRunner> {
        self
    }
}

/// Runs uv directly on the host, with only the invocation's environment, stdin from
/// `/dev/null`, in its own process group (killed whole on timeout).
#[derive(Debug, Clone, Copy, Default)]
pub struct DirectUvRunner;

impl UvRunner for DirectUvRunner {
    fn run<'a>(&'a self, invocation: &'a UvInvocation) -> UvRunFuture<'a> {
        Box::pin(run_direct(invocation))
    }

    fn is_sandboxed(&self) -> bool {
        false
    }
}

async fn run_direct(invocation: &UvInvocation) -> Result<UvOutput, EnvError> {
    let mut command = tokio::process::Command::new(&invocation.program);
    command
        .args(&invocation.args)
        .env_clear()
        .envs(invocation.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&invocation.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let child = command.spawn().map_err(|source| EnvError::Spawn {
        program: invocation.program.clone(),
        source,
    })?;
    let pid = child.id();
    match tokio::time::timeout(invocation.timeout, child.wait_with_output()).await {
        Ok(Ok(output)) => Ok(UvOutput {
            exit_code: output.status.code(),
            stdout: output.stdout,
            stderr: output.stderr,
        }),
        Ok(Err(source)) => Err(EnvError::Spawn {
            program: invocation.program.clone(),
            source,
        }),
        Err(_elapsed) => {
            // The child itself is killed on drop; its descendants (build backends) share its
            // process group, which we created, so kill that too.
            if let Some(pid) = pid.and_then(|pid| i32::try_from(pid).ok()) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            Err(EnvError::Timeout {
                command: invocation.label.clone(),
                timeout: invocation.timeout,
            })
        }
    }
}

/// The read-only paths an install sandbox needs besides the system view: uv's directory, the
/// interpreter (its prefix, and its `bin` directory when that lies elsewhere), local
/// `UV_FIND_LINKS` directories and, with network,
/// certificate bundles configured outside `/etc/ssl` (the sandbox's view has `/etc/ssl/certs`
/// and, with network, the resolver files).
#[must_use]
pub fn install_read_only_paths(
    uv: &Uv,
    interpreter: &crate::Interpreter,
    uv_env: &crate::UvEnvironment,
    network: bool,
) -> Vec<PathBuf> {
    let mut read_only = vec![uv.dir().to_path_buf(), interpreter.prefix.clone()];
    // Local find-links directories (the operator's wheelhouse) are a package source too.
    read_only.extend(crate::install::local_find_links(&uv_env.index_urls()));
    if let Some(bin) = interpreter.executable.parent()
        && !bin.starts_with(&interpreter.prefix)
    {
        read_only.push(bin.to_path_buf());
    }
    if network {
        read_only.extend(
            ["SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE"]
                .iter()
                .filter_map(|name| uv_env.get(name))
                .map(PathBuf::from)
                .filter(|path| !path.starts_with("/etc/ssl") && path.exists()),
        );
    }
    read_only
}

impl UvInvocation {
    /// The command to run in the sandbox: the program, behind the bridge to the egress proxy
    /// when the invocation has one.
    pub fn command(&self) -> snakebox_sandbox::SandboxCommand {
        let command = snakebox_sandbox::SandboxCommand {
            program: self.program.clone(),
            args: self.args.clone(),
            control_channel: false,
            init: false,
        };
        match &self.egress {
            Some(egress) if self.network => snakebox_sandbox::bridged_command(
                &egress.python,
                Path::new(snakebox_sandbox::SOCKET_INSIDE),
                &command,
            ),
            _ => command,
        }
    }

    /// The sandbox policy of this invocation (pure, so it can be read and tested): every
    /// read-only and writable path mounted at its own path, the invocation's environment and
    /// nothing else, the timeout as the wall-time limit. A [`Role::Downloader`] runs trusted uv
    /// only (no package code), as the installer's uid, with network as asked and no memory or
    /// process limit (resolvers are sometimes large); a [`Role::PackageCode`] invocation gets
    /// its own identity, a run's limits and never the network.
    pub fn policy(&self) -> snakebox_sandbox::Policy {
        use snakebox_sandbox::{Limits, Mount, Policy};
        let mount = |path: &PathBuf, writable: bool| Mount {
            host: path.clone(),
            dest: path.clone(),
            writable,
        };
        let mut mounts: Vec<Mount> = self
            .read_only
            .iter()
            .map(|path| mount(path, false))
            .collect();
        mounts.extend(self.writable.iter().map(|path| mount(path, true)));
        if let Some(egress) = self.egress.as_ref().filter(|_| self.network) {
            mounts.push(Mount {
                host: egress.socket.clone(),
                dest: PathBuf::from(snakebox_sandbox::SOCKET_INSIDE),
                writable: false,
            });
        }
        let mut env = self.env.clone();
        if self.egress.is_some() {
            env.retain(|(name, _)| !name.to_ascii_lowercase().ends_with("_proxy"));
            env.extend(snakebox_sandbox::EgressProxy::proxy_env());
        }
        if let Role::PackageCode { identity, limits } = &self.role {
            return Policy {
                mounts,
                network: false,
                env: self.env.clone(),
                cwd: self.cwd.clone(),
                limits: Limits {
                    wall_time: self.timeout,
                    max_output_bytes: MAX_SANDBOXED_OUTPUT,
                    ..limits.clone()
                },
                identity: *identity,
                cpu: self.cpu.clone(),
            };
        }
        Policy {
            mounts,
            network: self.network && self.egress.is_none(),
            env,
            cwd: self.cwd.clone(),
            limits: Limits {
                wall_time: self.timeout,
                cpu_time: None,
                memory_bytes: None,
                max_processes: None,
                max_output_bytes: MAX_SANDBOXED_OUTPUT,
                scratch_bytes: None,
                file_size_bytes: None,
                open_files: None,
                cpu_millicores: None,
            },
            identity: snakebox_sandbox::Identity::Installer,
            cpu: self.cpu.clone(),
        }
    }
}

/// Output kept from one sandboxed uv invocation (stdout + stderr); `uv pip list` of a few
/// hundred packages is tens of kilobytes.
const MAX_SANDBOXED_OUTPUT: u64 = 4 * 1024 * 1024;

/// Installs through the sandbox (the default when serving): the engine hands its
/// `Arc<Sandbox>` to [`crate::EnvCache::new`] as is.
impl UvRunner for snakebox_sandbox::Sandbox {
    fn run<'a>(&'a self, invocation: &'a UvInvocation) -> UvRunFuture<'a> {
        Box::pin(run_sandboxed(self, invocation, None))
    }

    fn is_sandboxed(&self) -> bool {
        self.report().isolation_active
    }

    fn writer_ids(&self) -> Option<(u32, u32)> {
        self.host_ids(snakebox_sandbox::Identity::Installer)
    }

    fn package_identity(&self) -> PackageIdentity {
        let lease = self.lease_identity();
        PackageIdentity {
            identity: lease.identity(),
            host_ids: lease.host_ids(),
            _lease: Some(lease),
        }
    }
}

/// Run one invocation in `sandbox` to its end, uv's output streamed to `progress` while it
/// runs (what [`UvRunner::run`] does for a [`snakebox_sandbox::Sandbox`], without progress).
///
/// # Errors
/// When the sandbox cannot start ([`EnvError::Sandbox`]), the invocation reached its wall
/// time ([`EnvError::Timeout`]) or another limit ([`EnvError::LimitReached`]). A non-zero exit
/// is not an error here: callers read the output.
pub async fn run_sandboxed(
    sandbox: &snakebox_sandbox::Sandbox,
    invocation: &UvInvocation,
    progress: Option<tokio::sync::mpsc::UnboundedSender<snakebox_sandbox::OutputChunk>>,
) -> Result<UvOutput, EnvError> {
    let command = invocation.command();
    let outcome = sandbox
        .run(
            &invocation.policy(),
            &command,
            tokio_util::sync::CancellationToken::new(),
            progress,
        )
        .await
        .map_err(|source| EnvError::Sandbox {
            command: invocation.label.clone(),
            sandbox_hint: source.hint(),
            source: Box::new(source),
        })?;
    match outcome.termination {
        snakebox_sandbox::Termination::TimedOut => Err(EnvError::Timeout {
            command: invocation.label.clone(),
            timeout: invocation.timeout,
        }),
        snakebox_sandbox::Termination::MemoryLimit => Err(EnvError::LimitReached {
            command: invocation.label.clone(),
            limit: "memory",
        }),
        snakebox_sandbox::Termination::CpuLimit => Err(EnvError::LimitReached {
            command: invocation.label.clone(),
            limit: "CPU time",
        }),
        _ => Ok(UvOutput {
            exit_code: outcome.exit_code,
            stdout: outcome.stdout.text.into_bytes(),
            stderr: outcome.stderr.text.into_bytes(),
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::ffi::OsStr;
    use std::path::Path;

    use super::{bare_name, find_on_path};

    #[test]
    fn only_a_name_without_a_slash_is_looked_up_on_path() {
        assert_eq!(bare_name(Path::new("uv")), Some(OsStr::new("uv")));
        for path in ["./uv", "/usr/bin/uv", "bin/uv", ".", "..", ""] {
            assert_eq!(bare_name(Path::new(path)), None, "{path}");
        }
    }

    #[test]
    fn the_first_directory_of_path_holding_the_name_wins() {
        let dir = tempfile::tempdir().unwrap();
        let (first, second, empty) = (
            dir.path().join("a"),
            dir.path().join("b"),
            dir.path().join("c"),
        );
        for d in [&first, &second, &empty] {
            fs_err::create_dir(d).unwrap();
        }
        fs_err::write(second.join("uv"), "").unwrap();
        fs_err::create_dir(first.join("uv")).unwrap(); // a directory is not a program
        let path = std::env::join_paths([&empty, &first, &second]).unwrap();
        assert_eq!(
            find_on_path(OsStr::new("uv"), &path),
            Some(second.join("uv"))
        );
        assert_eq!(find_on_path(OsStr::new("uvx"), &path), None);
        assert_eq!(find_on_path(OsStr::new("uv"), OsStr::new("")), None);
    }
}
