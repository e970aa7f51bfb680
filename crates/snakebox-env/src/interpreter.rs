//! Which Python interpreters exist on this host, and which one a version request means.
//!
//! Candidates come from `uv python list --only-installed`, pyenv's `versions/` directory and
//! `/usr/bin/python3*`, `/usr/local/bin/python3*`. Each is resolved to its real binary (shims
//! are skipped: the pyenv directory scan finds what they point at), deduplicated by real path,
//! and asked once, by running it, for its version, implementation and `sys.base_prefix` (the
//! tree a sandbox must mount read-only). Only CPython 3.8 or newer is usable; the others are
//! kept in [`Interpreters::skipped`] with the reason, for `check_environment`.

use std::cmp::Reverse;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::str::FromStr;
use std::time::Duration;

use pep440_rs::{Version, VersionSpecifiers};
use serde::Deserialize;

use crate::env_vars::{EnvVars, UvEnvironment};
use crate::error::EnvError;
use crate::uv::{self, DirectUvRunner, Uv, UvInvocation, UvRunner as _};

/// The oldest Python snakebox runs code with.
const MINIMUM: [u64; 2] = [3, 8];

/// How long one interpreter may take to say what it is.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// One usable Python interpreter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter {
    /// Full version, e.g. `3.11.7`.
    pub version: Version,
    /// The real binary (symlinks resolved, never a shim).
    pub executable: PathBuf,
    /// `sys.base_prefix`: the installation tree a sandbox must mount read-only.
    pub prefix: PathBuf,
    /// `platform.python_implementation()`, e.g. `CPython`.
    pub implementation: String,
    /// Where it was found: `uv-managed`, `pyenv`, `system` or `path`.
    pub source: String,
}

/// An interpreter that was found but is not used, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedInterpreter {
    /// The path that was examined.
    pub path: PathBuf,
    /// Why it is not used, e.g. `CPython 2.7.18 is older than 3.8`.
    pub reason: String,
}

/// The interpreters found on this host, highest version first.
#[derive(Debug, Clone, Default)]
pub struct Interpreters {
    usable: Vec<Interpreter>,
    skipped: Vec<SkippedInterpreter>,
}

impl Interpreters {
    /// Find the interpreters on this host (see the module documentation). Never fails: what
    /// could not be used is listed in [`Interpreters::skipped`].
    pub async fn discover(uv: &Uv) -> Interpreters {
        let (listed, managed_dir) = tokio::join!(uv_python_list(uv), uv_python_dir(uv));
        discover_from(listed, managed_dir).await
    }

    /// Like [`Interpreters::discover`], without asking uv (when uv is missing).
    pub async fn discover_without_uv() -> Interpreters {
        discover_from(Vec::new(), None).await
    }

    /// A fixed set (for tests and for callers that know their interpreters).
    pub fn from_interpreters(mut usable: Vec<Interpreter>) -> Interpreters {
        sort(&mut usable);
        Interpreters {
            usable,
            skipped: Vec::new(),
        }
    }

    /// Every usable interpreter, highest version first.
    pub fn all(&self) -> &[Interpreter] {
        &self.usable
    }

    /// Interpreters that were found but are not used, with the reason.
    pub fn skipped(&self) -> &[SkippedInterpreter] {
        &self.skipped
    }

    /// The best (highest) interpreter matching a request: a version prefix (`3`, `3.11`,
    /// `3.11.7`, also written `python3.11` or `cpython-3.11`) or PEP 440 specifiers
    /// (`>=3.10,<3.13`).
    ///
    /// # Errors
    ///
    /// [`EnvError::InvalidPythonRequest`] when the request is neither;
    /// [`EnvError::NoMatchingInterpreter`] listing the available versions when nothing matches.
    pub fn find(&self, request: &str) -> Result<&Interpreter, EnvError> {
        let found = match PythonRequest::parse(request)? {
            PythonRequest::Any => self.usable.first(),
            PythonRequest::Prefix(prefix) => self
                .usable
                .iter()
                .find(|i| i.version.release().get(..prefix.len()) == Some(prefix.as_slice())),
            PythonRequest::Specifiers(spec) => self.satisfying(&spec).into_iter().next(),
        };
        found.ok_or_else(|| EnvError::NoMatchingInterpreter {
            request: request.to_owned(),
            available: self.usable.iter().map(|i| i.version.to_string()).collect(),
        })
    }

    /// Every usable interpreter whose version satisfies `spec`, highest first.
    pub fn satisfying(&self, spec: &VersionSpecifiers) -> Vec<&Interpreter> {
        self.usable
            .iter()
            .filter(|i| spec.contains(&i.version))
            .collect()
    }
}

/// A parsed Python version request.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PythonRequest {
    Any,
    Prefix(Vec<u64>),
    Specifiers(VersionSpecifiers),
}

impl PythonRequest {
    fn parse(request: &str) -> Result<Self, EnvError> {
        let invalid =
            |source: Box<dyn std::error::Error + Send + Sync>| EnvError::InvalidPythonRequest {
                request: request.to_owned(),
                source,
            };
        let trimmed = request.trim();
        let lower = trimmed.to_ascii_lowercase();
        let bare = lower
            .strip_prefix("cpython")
            .or_else(|| lower.strip_prefix("python"))
            .unwrap_or(&lower)
            .trim_start_matches(['-', '@', ' ']);
        if bare.is_empty() {
            return Ok(Self::Any);
        }
        if bare.starts_with(|c: char| c.is_ascii_digit())
            && bare.chars().all(|c| c.is_ascii_digit() || c == '.')
        {
            let parts: Result<Vec<u64>, _> = bare.split('.').map(u64::from_str).collect();
            return match parts {
                Ok(parts) if (1..=3).contains(&parts.len()) => Ok(Self::Prefix(parts)),
                Ok(_) => Err(invalid("expected at most three version components".into())),
                Err(err) => Err(invalid(Box::new(err))),
            };
        }
        VersionSpecifiers::from_str(trimmed)
            .map(Self::Specifiers)
            .map_err(|err| invalid(Box::new(err)))
    }
}

/// One candidate path and what we know of it before asking it.
struct Candidate {
    real: PathBuf,
}

async fn discover_from(listed: Vec<PathBuf>, managed_dir: Option<PathBuf>) -> Interpreters {
    let home = std::env::var_os(EnvVars::HOME).map(PathBuf::from);
    let pyenv_root = uv::pyenv_root(home.as_deref());

    let mut paths: Vec<PathBuf> = listed;
    if let Some(root) = &pyenv_root {
        paths.extend(uv::pyenv_version_bins(root, "python3"));
        // Python 2 versions only have `python`: found so that the report can say why not.
        paths.extend(uv::pyenv_version_bins(root, "python"));
    }
    for dir in ["/usr/bin", "/usr/local/bin"] {
        paths.extend(python3_names(Path::new(dir)));
    }

    let mut seen = HashSet::new();
    let mut skipped = Vec::new();
    let mut candidates = Vec::new();
    for path in paths {
        let Ok(real) = path.canonicalize() else {
            continue;
        };
        if !seen.insert(real.clone()) {
            continue;
        }
        if uv::script_text(&real).is_some() {
            // A shim (pyenv, asdf...): the real interpreters behind it are found directly.
            continue;
        }
        candidates.push(Candidate { real });
    }

    let mut queries = tokio::task::JoinSet::new();
    for candidate in candidates {
        queries.spawn(async move {
            let result = query(&candidate.real).await;
            (candidate.real, result)
        });
    }
    let mut usable = Vec::new();
    while let Some(joined) = queries.join_next().await {
        let Ok((real, result)) = joined else { continue };
        match result {
            Ok(info) => {
                match usable_interpreter(&real, info, managed_dir.as_deref(), pyenv_root.as_deref())
                {
                    Ok(interpreter) => usable.push(interpreter),
                    Err(reason) => skipped.push(SkippedInterpreter { path: real, reason }),
                }
            }
            Err(reason) => skipped.push(SkippedInterpreter { path: real, reason }),
        }
    }
    // Two paths can still be one installation (e.g. a hard link): keep one per prefix + version.
    sort(&mut usable);
    let mut installs = HashSet::new();
    usable.retain(|i| installs.insert((i.prefix.clone(), i.version.clone())));
    skipped.sort_by(|a, b| a.path.cmp(&b.path));
    Interpreters { usable, skipped }
}

fn sort(usable: &mut [Interpreter]) {
    usable.sort_by_key(|i| {
        (
            Reverse(i.version.clone()),
            source_rank(&i.source),
            i.executable.clone(),
        )
    });
}

fn source_rank(source: &str) -> u8 {
    match source {
        "uv-managed" => 0,
        "pyenv" => 1,
        "path" => 2,
        _ => 3,
    }
}

/// `python3` and `python3.N` in `dir` (not `python3-config`, `python3.11m`...).
fn python3_names(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs_err::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|entry| {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            name.strip_prefix("python3").is_some_and(|rest| {
                rest.is_empty()
                    || rest.strip_prefix('.').is_some_and(|minor| {
                        !minor.is_empty() && minor.chars().all(|c| c.is_ascii_digit())
                    })
            })
        })
        .map(|entry| entry.path())
        .collect();
    found.sort();
    found
}

/// What an interpreter says about itself.
#[derive(Debug, Deserialize)]
struct QueryInfo {
    version: String,
    implementation: String,
    base_prefix: PathBuf,
}

/// Works on Python 2.7 and 3.x alike, so that old interpreters can be reported, not just fail.
const QUERY_SCRIPT: &str = "import json, platform, sys\n\
print(json.dumps({'version': platform.python_version(), \
'implementation': platform.python_implementation(), \
'base_prefix': getattr(sys, 'base_prefix', sys.prefix)}))";

async fn query(executable: &Path) -> Result<QueryInfo, String> {
    let mut command = tokio::process::Command::new(executable);
    command
        .args(["-E", "-s", "-S", "-c", QUERY_SCRIPT])
        .env_clear()
        .envs(UvEnvironment::for_python())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = match tokio::time::timeout(QUERY_TIMEOUT, command.output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(err)) => return Err(format!("could not be started: {err}")),
        Err(_) => {
            return Err(format!(
                "did not answer within {} s",
                QUERY_TIMEOUT.as_secs()
            ));
        }
    };
    if !output.status.success() {
        return Err(format!(
            "exited with {} when asked for its version: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    serde_json::from_slice(&output.stdout)
        .map_err(|err| format!("gave an unreadable answer: {err}"))
}

fn usable_interpreter(
    real: &Path,
    info: QueryInfo,
    managed_dir: Option<&Path>,
    pyenv_root: Option<&Path>,
) -> Result<Interpreter, String> {
    let version = Version::from_str(&info.version)
        .map_err(|err| format!("reported an unreadable version `{}`: {err}", info.version))?;
    if info.implementation != "CPython" {
        return Err(format!(
            "{} {} is not CPython (only CPython is supported)",
            info.implementation, info.version
        ));
    }
    if version
        .release()
        .get(..2)
        .is_none_or(|release| release < MINIMUM.as_slice())
    {
        return Err(format!("CPython {} is older than 3.8", info.version));
    }
    let source = if managed_dir.is_some_and(|dir| real.starts_with(dir)) {
        "uv-managed"
    } else if pyenv_root.is_some_and(|root| real.starts_with(root.join("versions"))) {
        "pyenv"
    } else if real.starts_with("/usr/") {
        "system"
    } else {
        "path"
    };
    Ok(Interpreter {
        version,
        executable: real.to_path_buf(),
        prefix: info.base_prefix,
        implementation: info.implementation,
        source: source.to_owned(),
    })
}

/// One entry of `uv python list --output-format json` (only what we read).
#[derive(Debug, Deserialize)]
struct ListedPython {
    path: Option<PathBuf>,
}

fn listing_invocation(uv: &Uv, args: &[&str]) -> UvInvocation {
    let mut all: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
    all.push("--no-cache".into());
    UvInvocation {
        program: uv.path.clone(),
        args: all,
        // No cache directory of ours exists yet; `--no-cache` keeps uv from writing one.
        env: UvEnvironment::from_process()
            .for_uv(Path::new("/nonexistent"))
            .into_iter()
            .filter(|(name, _)| name != EnvVars::UV_CACHE_DIR)
            .collect(),
        cwd: PathBuf::from("/"),
        network: false,
        read_only: Vec::new(),
        writable: Vec::new(),
        timeout: Duration::from_secs(30),
        label: format!("uv {}", args.join(" ")),
        role: uv::Role::Downloader,
        egress: None,
        cpu: None,
    }
}

/// The longest `uv python install` may take (an interpreter is tens of megabytes).
pub const PYTHON_INSTALL_TIMEOUT: Duration = Duration::from_secs(600);

/// Install CPython `request` (`3.14`, `3.12.7`) with `uv python install` into uv's own
/// Python directory, where [`Interpreters::discover`] finds it (`uv python dir`, the same
/// environment). From python-build-standalone's releases, or what the operator configured
/// (`UV_PYTHON_INSTALL_MIRROR`, `UV_PYTHON_DOWNLOADS_JSON_URL`, passed through
/// [`UvEnvironment`]). Trusted uv on the host, as the listing calls above: it downloads and
/// unpacks an archive of the operator's source and runs nothing of it; the interpreter
/// first runs when discovery asks it its version. `--no-bin`: nothing is written to
/// `~/.local/bin`. Returns uv's report (its stderr).
///
/// # Errors
/// [`EnvError::InvalidPythonRequest`] for a request that is not a version;
/// [`EnvError::PythonInstallFailed`] with what uv said.
pub async fn install_python(uv: &Uv, request: &str) -> Result<String, EnvError> {
    // A version (prefix or specifiers) only: never an option or a path for uv.
    PythonRequest::parse(request)?;
    let request = request.trim();
    if request.starts_with('-') || request.contains(['/', '\\']) {
        return Err(EnvError::InvalidPythonRequest {
            request: request.to_owned(),
            source: "expected a Python version such as `3.14`".into(),
        });
    }
    let mut invocation = listing_invocation(uv, &["python", "install", "--no-bin", request]);
    invocation.timeout = PYTHON_INSTALL_TIMEOUT;
    invocation.network = true;
    for (name, value) in &mut invocation.env {
        if name == EnvVars::UV_PYTHON_DOWNLOADS {
            // `never` refuses even an explicit install; `manual` allows only those.
            "manual".clone_into(value);
        }
    }
    let output = DirectUvRunner.run(&invocation).await?;
    if output.success() {
        Ok(String::from_utf8_lossy(&output.stderr).trim().to_owned())
    } else {
        Err(EnvError::PythonInstallFailed {
            request: request.to_owned(),
            source: crate::error::UvStderr::from_output(&output.stderr),
        })
    }
}

/// Paths of the interpreters uv knows (installed ones only; uv never downloads one by itself).
async fn uv_python_list(uv: &Uv) -> Vec<PathBuf> {
    let invocation = listing_invocation(
        uv,
        &[
            "python",
            "list",
            "--only-installed",
            "--output-format",
            "json",
        ],
    );
    let output = match DirectUvRunner.run(&invocation).await {
        Ok(output) if output.success() => output,
        Ok(output) => {
            tracing::warn!(stderr = %String::from_utf8_lossy(&output.stderr), "`uv python list` failed");
            return Vec::new();
        }
        Err(err) => {
            tracing::warn!(error = %err, "`uv python list` failed");
            return Vec::new();
        }
    };
    match serde_json::from_slice::<Vec<ListedPython>>(&output.stdout) {
        Ok(listed) => listed.into_iter().filter_map(|p| p.path).collect(),
        Err(err) => {
            tracing::warn!(error = %err, "`uv python list` gave unreadable JSON");
            Vec::new()
        }
    }
}

/// Where uv keeps the interpreters it manages.
async fn uv_python_dir(uv: &Uv) -> Option<PathBuf> {
    let output = DirectUvRunner
        .run(&listing_invocation(uv, &["python", "dir"]))
        .await
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let dir = text.trim();
    (output.success() && !dir.is_empty()).then(|| PathBuf::from(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interpreter(version: &str, source: &str) -> Interpreter {
        Interpreter {
            version: Version::from_str(version).unwrap(),
            executable: PathBuf::from(format!("/opt/python/{version}/bin/python3")),
            prefix: PathBuf::from(format!("/opt/python/{version}")),
            implementation: "CPython".to_owned(),
            source: source.to_owned(),
        }
    }

    fn sample() -> Interpreters {
        Interpreters::from_interpreters(vec![
            interpreter("3.8.18", "pyenv"),
            interpreter("3.11.2", "system"),
            interpreter("3.11.7", "pyenv"),
            interpreter("3.13.0", "pyenv"),
        ])
    }

    #[test]
    fn requests_pick_the_highest_match() {
        let all = sample();
        let cases = [
            ("3.11", "3.11.7"),
            ("3.11.2", "3.11.2"),
            ("3", "3.13.0"),
            ("", "3.13.0"),
            ("python3.8", "3.8.18"),
            ("cpython-3.11", "3.11.7"),
            (">=3.10,<3.13", "3.11.7"),
            ("==3.11.*", "3.11.7"),
            ("<3.11", "3.8.18"),
        ];
        for (request, expected) in cases {
            let found = all.find(request).unwrap();
            assert_eq!(found.version.to_string(), expected, "request `{request}`");
        }
    }

    #[test]
    fn a_miss_lists_what_is_available() {
        let err = sample().find("3.9").unwrap_err();
        assert!(
            matches!(&err, EnvError::NoMatchingInterpreter { available, .. } if available.len() == 4)
        );
        assert_eq!(
            err.to_string(),
            "Failed to find a Python interpreter matching `3.9`"
        );
        assert!(
            err.hint()
                .unwrap()
                .contains("3.13.0, 3.11.7, 3.11.2, 3.8.18")
        );
    }

    #[test]
    fn nonsense_is_an_invalid_request() {
        for request in ["3.x", "banana", "3.11.7.1", ">=3.1O"] {
            assert!(
                matches!(
                    sample().find(request),
                    Err(EnvError::InvalidPythonRequest { .. })
                ),
                "request `{request}`"
            );
        }
    }

    #[test]
    fn python3_names_skip_config_scripts() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "python3",
            "python3.11",
            "python3-config",
            "python3.11-config",
            "python3.11m",
            "python2",
        ] {
            fs_err::write(dir.path().join(name), "").unwrap();
        }
        let names: Vec<String> = python3_names(dir.path())
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["python3", "python3.11"]);
    }
}
