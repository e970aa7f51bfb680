//! Errors of this crate, each stating the operation that failed with the value last in
//! backticks, and a [`EnvError::hint`] that tells the user what to do about it.
//!
//! Causes go in `#[source]` (never repeated in the message). uv's own diagnostics are carried as
//! an [`UvStderr`] source, so a caller printing the error chain shows what uv said.

use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong while finding uv or Python, or building an environment.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// No usable uv binary was found in any of the places searched.
    #[error("Failed to find a usable uv binary; looked in {}", backticked(looked))]
    UvNotFound {
        /// Every place that was searched, with the reason each was rejected when there was one.
        looked: Vec<String>,
    },

    /// The uv binary given explicitly (`--uv-path`) is not usable.
    #[error("Failed to use the uv binary given explicitly at `{}`", path.display())]
    UvUnusable {
        /// The path that was given.
        path: PathBuf,
        /// Why it cannot be used.
        #[source]
        source: std::io::Error,
    },

    /// A process (uv or Python) could not be started.
    #[error("Failed to start `{}`", program.display())]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The operating-system error.
        #[source]
        source: std::io::Error,
    },

    /// A Python version request could not be understood.
    #[error("Failed to parse the Python version request `{request}`")]
    InvalidPythonRequest {
        /// The request as given, e.g. `3.x`.
        request: String,
        /// The parser's complaint.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// No usable interpreter matches a version request.
    #[error("Failed to find a Python interpreter matching `{request}`")]
    NoMatchingInterpreter {
        /// The request as given.
        request: String,
        /// Full versions of the usable interpreters (highest first).
        available: Vec<String>,
    },

    /// `uv python install` failed (a version the download source does not offer, no access
    /// to it, no space).
    #[error("Failed to install Python `{request}` with uv")]
    PythonInstallFailed {
        /// The version asked for, e.g. `3.14`.
        request: String,
        /// What uv said (trimmed).
        #[source]
        source: UvStderr,
    },

    /// `uv venv` failed.
    #[error("Failed to create the virtual environment at `{}`", path.display())]
    VenvFailed {
        /// Where the environment was being built.
        path: PathBuf,
        /// What uv said.
        #[source]
        source: UvStderr,
    },

    /// `uv pip install` failed (unknown package, no matching version, network, build error...).
    #[error("Failed to install the requirements `{requirements}`")]
    InstallFailed {
        /// The requirement set, one string, comma-separated.
        requirements: String,
        /// What uv said (trimmed).
        #[source]
        source: UvStderr,
    },

    /// `uv` ran but its output could not be understood.
    #[error("Failed to read the output of `{command}`")]
    UvOutput {
        /// The command, e.g. `uv pip list`.
        command: String,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },

    /// A uv invocation ran longer than allowed and was killed.
    #[error("Failed to finish `{command}` within the time limit of `{}s`", timeout.as_secs())]
    Timeout {
        /// The command, e.g. `uv pip install`.
        command: String,
        /// The limit that was reached.
        timeout: Duration,
    },

    /// Package code (bytecode compilation, a build) was stopped by a run limit.
    #[error("Failed to finish `{command}`: it reached the {limit} limit")]
    LimitReached {
        /// The step, e.g. `compile the packages`.
        command: String,
        /// Which limit (`memory`, `CPU time`).
        limit: &'static str,
    },

    /// A requirement has no wheel for this Python, and builds from source are off.
    #[error(
        "Failed to install the requirements `{requirements}` from wheels only: {}",
        if packages.is_empty() {
            "a requirement has no wheel for this Python".to_owned()
        } else {
            format!("no wheel for this Python of {}", backticked(packages))
        }
    )]
    SdistBuildsDisabled {
        /// The requirement set, one string, comma-separated.
        requirements: String,
        /// The packages uv named as having no usable wheel.
        packages: Vec<String>,
        /// What uv said (it names the package without a usable wheel).
        #[source]
        source: UvStderr,
    },

    /// Building the requirements from source failed (or found nothing to build from).
    #[error("Failed to build the requirements `{requirements}` from source")]
    BuildFailed {
        /// The requirement set, one string, comma-separated.
        requirements: String,
        /// What uv said.
        #[source]
        source: UvStderr,
    },

    /// A requirement names a URL that the installer may not fetch.
    #[error("Failed to accept the requirement `{requirement}`: its URL points at {reason}")]
    ForbiddenUrl {
        /// The requirement as given.
        requirement: String,
        /// What the address is, e.g. `a loopback address (127.0.0.1)`.
        reason: String,
    },

    /// The sandbox refused or failed to run uv.
    #[error("Failed to run `{command}` in the install sandbox")]
    Sandbox {
        /// The command, e.g. `uv pip install`.
        command: String,
        /// The sandbox's own hint, when it has one.
        sandbox_hint: Option<String>,
        /// The sandbox's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A build ran out of disk space (or quota) on the file system of the data directory.
    #[error(
        "Failed to {step}: the file system of `{}` is out of space ({} left)",
        path.display(),
        available.map_or_else(|| "unknown".to_owned(), crate::space::human_bytes)
    )]
    NoSpace {
        /// The step that failed, e.g. `install the requirements \`six==1.16.0\``.
        step: String,
        /// The directory whose file system is full (the data directory, a session's venv).
        path: PathBuf,
        /// Bytes left there when the failure was seen.
        available: Option<u64>,
        /// What the failing step said.
        #[source]
        source: UvStderr,
    },

    /// A new environment failed its check (installed files against their `RECORD`, compiled
    /// files loadable) and was not published.
    #[error(
        "Failed to verify the new environment for `{requirements}`: {} damaged or missing \
         file(s), e.g. {}",
        problems.len(),
        backticked(&problems.iter().take(3).cloned().collect::<Vec<_>>())
    )]
    Incomplete {
        /// The requirement set, one string, comma-separated.
        requirements: String,
        /// What is wrong, one entry per file.
        problems: Vec<String>,
        /// The distributions whose installed files are damaged (empty when only compiled
        /// files are).
        packages: Vec<String>,
        /// Whether uv's cached copies of the damaged distributions were removed (a retry then
        /// downloads them again).
        cache_cleaned: bool,
    },

    /// A file-system operation on the cache failed.
    #[error("Failed to {action} `{}`", path.display())]
    Io {
        /// What was being done, e.g. `create the cache directory`.
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The operating-system error.
        #[source]
        source: std::io::Error,
    },
}

impl EnvError {
    /// What the user can do about this error, when there is something to say.
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::UvNotFound { .. } => Some(
                "install uv (`pipx install uv`, or `pip install uv` inside a virtual \
                 environment; snakebox's `scripts/install-deps --runtime` does either), or \
                 pass its path with `--uv-path`"
                    .to_owned(),
            ),
            Self::UvUnusable { .. } => Some(
                "check that the path points at the uv executable itself (not a shim script) \
                 and that it is executable"
                    .to_owned(),
            ),
            Self::Spawn { .. } => Some("check that the file exists and is executable".to_owned()),
            Self::InvalidPythonRequest { .. } => Some(
                "use a version such as `3.11` or `3.11.7`, or a specifier such as \
                 `>=3.10,<3.13`"
                    .to_owned(),
            ),
            Self::NoMatchingInterpreter { available, .. } => Some(if available.is_empty() {
                "no usable interpreter was found (CPython 3.8 or newer is required); install \
                 one with `pyenv install 3.12` or your system's package manager"
                    .to_owned()
            } else {
                format!(
                    "available Python versions: {}; ask for one of these \
                     (only CPython 3.8 or newer is used)",
                    available.join(", ")
                )
            }),
            Self::PythonInstallFailed { source, .. } => {
                Some(if source.0.contains("No download found") {
                    "the download source does not offer this version: ask for another, or point \
                 UV_PYTHON_INSTALL_MIRROR (or UV_PYTHON_DOWNLOADS_JSON_URL) at a source that has it"
                        .to_owned()
                } else {
                    "check that the download source is reachable from this host (set \
                 UV_PYTHON_INSTALL_MIRROR to a mirror, `file://` for a local directory) and \
                 that the disk has space"
                        .to_owned()
                })
            }
            Self::VenvFailed { .. } => Some(
                "check that the interpreter still exists and that the cache directory is \
                 writable"
                    .to_owned(),
            ),
            Self::InstallFailed { source, .. } => Some(install_hint(&source.0)),
            Self::UvOutput { .. } => Some(
                "this uv version may be unsupported; snakebox is tested with uv 0.13".to_owned(),
            ),
            Self::Timeout { command, .. } if command.contains("runs") => Some(
                "a package's own code (run while compiling or building it) ran until the \
                 install timeout (`--install-timeout`) and was stopped with everything it \
                 started"
                    .to_owned(),
            ),
            Self::Timeout { .. } => Some(
                "the package index may be slow or unreachable; retry, or raise the install \
                 timeout (`--install-timeout`)"
                    .to_owned(),
            ),
            Self::LimitReached { .. } => Some(
                "a package's own code (run while compiling or building it) used more than a \
                 run may; the run limits (--memory-limit, --max-processes, --cpu-limit) apply \
                 to it too"
                    .to_owned(),
            ),
            Self::SdistBuildsDisabled { .. } => Some(
                "building from source runs the package's own build code, so snakebox installs \
                 wheels only by default; pin a version that publishes a wheel for this Python, \
                 or have the operator start snakebox with `--allow-sdist-builds` (or \
                 `allow_sdist_builds = true` in the config file): builds then run sandboxed, \
                 with a run's limits and without network or credentials"
                    .to_owned(),
            ),
            Self::BuildFailed { .. } => Some(
                "builds run sandboxed without network: every sdist and build requirement \
                 (for example setuptools) must be in a local `UV_FIND_LINKS` directory; or \
                 pin a version that publishes a wheel for this Python"
                    .to_owned(),
            ),
            Self::ForbiddenUrl { reason, .. } if reason.contains("install_hosts") => {
                Some(INSTALL_HOSTS_HINT.to_owned())
            }
            Self::ForbiddenUrl { .. } => Some(
                "installs may fetch from the configured package indexes and from public \
                 addresses only (and only from `[network] install_hosts` when it is set); host \
                 loopback, private ranges and metadata addresses are refused unless `[network] \
                 exceptions` covers them. Publish the file on the configured index, or use a \
                 public URL"
                    .to_owned(),
            ),
            Self::Sandbox { sandbox_hint, .. } => Some(sandbox_hint.clone().unwrap_or_else(|| {
                "check the sandbox backend with `snakebox check`; installs need network access \
                 inside the sandbox"
                    .to_owned()
            })),
            Self::NoSpace { .. } => Some(format!(
                "{NO_SPACE_HINT}. Nothing of the failed build was kept: call again once there \
                 is room"
            )),
            Self::Incomplete { cache_cleaned, .. } => Some(if *cache_cleaned {
                "the environment was not kept, and uv's cached copies of the damaged packages \
                 were removed: call again to build it afresh (they are downloaded again)"
                    .to_owned()
            } else {
                "the environment was not kept; call again to build it afresh. If it keeps \
                 failing, check the data directory's disk for errors and free space"
                    .to_owned()
            }),
            Self::Io { source, .. } if crate::space::says_no_space(&source.to_string()) => {
                Some(NO_SPACE_HINT.to_owned())
            }
            Self::Io { .. } => Some(
                "check that the data directory exists, is writable, and is on a local file \
                 system"
                    .to_owned(),
            ),
        }
    }
}

/// What to do when a build or an install runs out of space.
pub const NO_SPACE_HINT: &str = "free space on that file system, or raise or move the data \
     directory (`--data-dir`, `data_dir` in `[server]`); unused environments are removed by \
     pruning, which runs at start and hourly: lower `--cache-max-size` or \
     `--cache-max-age-days` to keep fewer";

/// uv's standard error, trimmed, used as the cause of a failed uv step.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UvStderr(pub String);

impl UvStderr {
    /// Keep what uv said, without its progress lines and at most a few kilobytes of it.
    pub(crate) fn from_output(stderr: &[u8]) -> Self {
        const MAX: usize = 4000;
        let text = String::from_utf8_lossy(stderr);
        let kept: Vec<&str> = text
            .lines()
            .filter(|line| {
                let line = line.trim_start();
                !(line.starts_with("Using Python")
                    || line.starts_with("Using CPython")
                    || line.starts_with("Resolved ")
                    || line.starts_with("Prepared ")
                    || line.starts_with("Audited "))
            })
            .collect();
        let mut joined = kept.join("\n").trim().to_owned();
        if joined.len() > MAX {
            let mut cut = joined.len() - MAX;
            while !joined.is_char_boundary(cut) {
                cut += 1;
            }
            joined = format!("…{}", &joined[cut..]);
        }
        Self(joined)
    }
}

/// A hint for a failed install, from what uv said.
/// The hint of an install the install proxy refused.
pub const INSTALL_HOSTS_HINT: &str = "installs reach the configured package indexes and, when \
    `[network] install_hosts` (`--network-install-hosts`) is set, only the hosts it lists \
    (otherwise any host on ports 80 and 443 at a public address); add the host the proxy \
    refused to `install_hosts`, or publish the file on the configured index";

fn install_hint(stderr: &str) -> String {
    // uv's own warnings (e.g. a deprecated setting) are not the cause.
    let lower = stderr
        .lines()
        .filter(|line| !line.trim_start().starts_with("warning:"))
        .collect::<Vec<_>>()
        .join("\n")
        .to_lowercase();
    if lower.contains("snakebox's install proxy refused") {
        INSTALL_HOSTS_HINT.to_owned()
    } else if lower.contains("not found in the package registry")
        || lower.contains("was not found in the package registry")
    {
        "check the spelling of the package name (the index has no package of that name)".to_owned()
    } else if lower.contains("no solution found") || lower.contains("no version") {
        "no version satisfies the requirements for this Python; loosen the version \
         specifiers or pick another Python version"
            .to_owned()
    } else if crate::space::says_no_space(&lower) {
        NO_SPACE_HINT.to_owned()
    } else if is_tls_error(&lower) {
        "the package index's TLS certificate was rejected; set `SSL_CERT_FILE` (or \
         `UV_SYSTEM_CERTS=1`) in the server's environment"
            .to_owned()
    } else if lower.contains("dns")
        || lower.contains("connect")
        || lower.contains("network")
        || lower.contains("timed out")
    {
        "the package index is unreachable; check `HTTPS_PROXY`, `UV_INDEX_URL` and \
         `UV_FIND_LINKS` in the server's environment"
            .to_owned()
    } else {
        "uv's own words are in the message; fix the requirement, or pin a version that \
         publishes wheels for this Python"
            .to_owned()
    }
}

/// Whether uv's (lower-cased, warnings removed) message is about TLS itself: a certificate
/// or handshake failure, not a word that merely contains `tls` or `ssl`.
fn is_tls_error(lower: &str) -> bool {
    [
        "certificate",
        "unknownissuer",
        "tls handshake",
        "handshake failure",
        "ssl error",
        "ssl routines",
        "invalid peer",
    ]
    .iter()
    .any(|needle| lower.contains(needle))
}

fn backticked(items: &[String]) -> String {
    items
        .iter()
        .map(|item| format!("`{item}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// uv's deprecation warnings are in every error of a uv started with such a variable.
    const WARNING: &str = "warning: The `UV_NATIVE_TLS` environment variable is deprecated and \
        will be removed in a future release. Use `UV_SYSTEM_CERTS` instead.";

    // See: issue 12 (7): a build that failed for lack of space was told its TLS certificate
    // had been rejected.
    #[test]
    fn hints_follow_the_real_cause() {
        let space = format!(
            "{WARNING}\nerror: Failed to install: six-1.16.0-py2.py3-none-any.whl\n  Caused by: \
             failed to write to file `/d/six.py`: No space left on device (os error 28)"
        );
        assert_eq!(install_hint(&space), NO_SPACE_HINT);
        let tls = "error: Request failed after 3 retries\n  Caused by: invalid peer certificate: \
                   UnknownIssuer";
        assert!(
            install_hint(tls).contains("TLS certificate"),
            "{}",
            install_hint(tls)
        );
        let missing = format!(
            "{WARNING}\n  × No solution found when resolving dependencies:\n  ╰─▶ Because \
             nosuchpkg was not found in the package registry"
        );
        assert!(install_hint(&missing).contains("spelling"));
        // Words that only contain `tls` or `ssl` are not TLS errors.
        let other = "error: Failed to read `/opt/settls/sslpkg.whl`: corrupt deflate stream";
        assert!(
            !install_hint(other).contains("TLS"),
            "{}",
            install_hint(other)
        );
        // See: issue 13: a download the install proxy refused is explained by the policy, not
        // as an unreachable index (uv only saw a 403).
        let refused = "error: Failed to download `pkg`\n  Caused by: HTTP status client error \
                       (403 Forbidden)\nsnakebox's install proxy refused `files.test:80`: \
                       `files.test` is not in the install hosts (`[network] install_hosts`)";
        assert_eq!(install_hint(refused), INSTALL_HOSTS_HINT);
    }

    #[test]
    fn io_errors_from_a_full_disk_get_the_space_hint() {
        let err = EnvError::Io {
            action: "write the environment manifest",
            path: PathBuf::from("/d/m.json"),
            source: std::io::Error::from_raw_os_error(28),
        };
        assert_eq!(err.hint().as_deref(), Some(NO_SPACE_HINT));
    }
}
