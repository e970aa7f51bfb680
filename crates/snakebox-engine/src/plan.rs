//! Planning a call: the checks every execution makes before anything starts (the script's
//! size, the input files, the timeout, the network asked for, the PEP 723 block merged with
//! `dependencies`) and the choice of interpreter.
//!
//! One-shot runs and session cells both start here, so a request is judged the same way on
//! either path; what differs (a one-shot run picks an interpreter and a network, a session
//! has its own) is decided by the caller of [`Engine::check_request`].

use crate::profiles::MIB;
use std::time::Duration;

use pep440_rs::VersionSpecifiers;
use snakebox_env::Interpreter;

use crate::files::DecodedFile;
use crate::{Engine, EngineError, ErrorKind};

/// One request to run a script.
#[derive(Debug, Clone, Default)]
pub struct ExecuteRequest {
    /// Python source, possibly with a PEP 723 `# /// script` block.
    pub script: String,
    /// Extra requirements (PEP 508); they win over the script's on a name clash.
    pub dependencies: Vec<String>,
    /// The session to run in (`None`: a one-shot run in a fresh sandbox).
    pub session_id: Option<String>,
    /// Wall-time limit in seconds, as the caller gave it (a fraction is rounded up, and the
    /// result says so); `None` for the server's default.
    pub timeout_seconds: Option<f64>,
    /// Python version request for this call (`3.12`, `3.11.7`, `>=3.10`).
    pub python_version: Option<String>,
    /// Files to place in the working directory before the script runs.
    pub files: Vec<crate::files::InputFile>,
    /// Ask for (`true`) or decline (`false`) network access; `None` follows the server. Asking
    /// for it on a server that does not allow network is refused with an explanation.
    pub network: Option<bool>,
    /// Narrow the server's network policy to these names (`name` or `*.suffix`), each of
    /// which the server's policy must allow; empty: the server's whole policy.
    pub allowed_domains: Vec<String>,
    /// Module names the script's own code may import (a name covers its submodules);
    /// `None`: no import policy. Checked before the run (each import statement and literal
    /// dynamic import outside it is refused with its line) and while it runs (the runner
    /// refuses the import and reports it).
    pub allowed_imports: Option<Vec<String>>,
    /// The profile to hold the run to (`None`: the server's default); it must be one the
    /// operator allowed for the caller's tenant.
    pub profile: Option<String>,
    /// A memory limit in bytes below the profile's (a narrowing; above it is refused).
    pub memory_limit_bytes: Option<u64>,
}

/// A request that passed the checks every execution makes.
pub(crate) struct Checked {
    /// The script's metadata merged with `dependencies` (the argument wins a name clash).
    pub(crate) requirements: Vec<pep508_rs::Requirement>,
    /// The script's `requires-python`, when it has one.
    pub(crate) requires_python: Option<VersionSpecifiers>,
    /// The wall-time limit, clamped to the server's maximum.
    pub(crate) timeout: Duration,
    /// Adjustments made to the request, for the result's `notes`.
    pub(crate) notes: Vec<String>,
    /// The input files, decoded and checked.
    pub(crate) inputs: Vec<DecodedFile>,
}

impl Engine {
    /// The checks every execution makes before anything starts, one-shot or in a session.
    ///
    /// # Errors
    /// `invalid` with a hint: a script too large or holding a NUL, a bad input file, a bad
    /// timeout, a malformed PEP 723 block or requirement.
    pub(crate) fn check_request(&self, request: &ExecuteRequest) -> Result<Checked, EngineError> {
        if request.script.len() > self.config.max_script_bytes {
            return Err(EngineError::invalid(
                format!(
                    "The script is {} bytes, more than the limit of {} bytes",
                    request.script.len(),
                    self.config.max_script_bytes
                ),
                "send a shorter script; put large data in files the script reads or downloads",
            ));
        }
        if request.script.contains('\0') {
            return Err(EngineError::invalid(
                "The script contains a NUL character",
                "send the script as plain UTF-8 text",
            ));
        }
        let inputs = crate::files::decode(&request.files)?;
        for name in request.allowed_imports.iter().flatten() {
            let valid = !name.is_empty()
                && name.split('.').all(|part| {
                    part.chars()
                        .next()
                        .is_some_and(|c| c.is_alphabetic() || c == '_')
                        && part.chars().all(|c| c.is_alphanumeric() || c == '_')
                });
            if !valid {
                return Err(EngineError::new(
                    ErrorKind::Invalid,
                    format!("`{name}` in allowed_imports is not a module name"),
                )
                .with_hint(
                    "give module names as Python writes them: `numpy`, `os.path`, `matplotlib.pyplot`",
                ));
            }
        }
        let mut notes = Vec::new();
        let timeout = self.effective_timeout(request.timeout_seconds, &mut notes)?;
        let block = snakebox_script::parse(&request.script)?;
        let metadata = block.as_ref().map(|b| &b.metadata);
        let requirements = snakebox_script::merge_dependencies(metadata, &request.dependencies)?;
        Ok(Checked {
            requirements,
            requires_python: metadata.and_then(|m| m.requires_python.clone()),
            timeout,
            notes,
            inputs,
        })
    }

    pub(crate) fn effective_timeout(
        &self,
        requested: Option<f64>,
        notes: &mut Vec<String>,
    ) -> Result<Duration, EngineError> {
        let max = self.config.max_timeout.as_secs().max(1);
        let Some(requested) = requested else {
            return Ok(self.config.default_timeout.min(self.config.max_timeout));
        };
        let seconds = match whole_seconds(requested) {
            Some(seconds) if seconds > 0 => seconds,
            _ => {
                return Err(EngineError::invalid(
                    format!("timeout_seconds must be at least 1, got `{requested}`"),
                    format!("pass a whole number of seconds between 1 and {max}"),
                ));
            }
        };
        // Limits are whole seconds: a fraction is rounded up, and the result says so.
        if requested.fract() != 0.0 {
            notes.push(format!(
                "timeout_seconds {requested} was rounded up to {seconds} (limits are whole seconds)"
            ));
        }
        if seconds > max {
            notes.push(format!(
                "timeout_seconds {seconds} is above this server's maximum; {max} was used"
            ));
            return Ok(Duration::from_secs(max));
        }
        Ok(Duration::from_secs(seconds))
    }

    /// The interpreters found on this host (a snapshot: a download replaces the list).
    pub(crate) fn interpreters(&self) -> std::sync::Arc<snakebox_env::Interpreters> {
        self.interpreters.read().map_or_else(
            |poisoned| poisoned.into_inner().clone(),
            |list| list.clone(),
        )
    }

    /// A version request no interpreter here satisfies, said with the fix: the operator can
    /// add it (`snakebox python install`, or `python_downloads = "automatic"`).
    fn missing_python(&self, request: &str, what: &str) -> EngineError {
        EngineError::new(
            ErrorKind::Unavailable,
            format!(
                "Python {request} ({what}) is not on this host; available: {}",
                self.available_versions()
            ),
        )
        .with_hint(format!(
            "ask for one of the available versions; or the server's operator adds it: set \
             python_downloads = \"automatic\" (or --python-downloads automatic) or run \
             `snakebox python install {}`",
            install_argument(request)
        ))
    }

    /// Choose the interpreter: the call's request, else the script's `requires-python`
    /// (preferring the server default when it satisfies it), else the server default.
    pub(crate) fn pick_interpreter(
        &self,
        explicit: Option<&str>,
        requires_python: Option<&pep440_rs::VersionSpecifiers>,
    ) -> Result<Interpreter, EngineError> {
        let interpreters = self.interpreters();
        let default_request = self.config.python_version.as_deref().unwrap_or("3");
        if let Some(request) = explicit {
            let interpreter = interpreters.find(request).map_err(|err| match err {
                snakebox_env::EnvError::NoMatchingInterpreter { .. } => {
                    self.missing_python(request, "from python_version")
                }
                other => other.into(),
            })?;
            if let Some(spec) = requires_python
                && !spec.contains(&interpreter.version)
            {
                return Err(EngineError::invalid(
                    format!(
                        "Python {} (from python_version `{request}`) does not satisfy the script's requires-python `{spec}`",
                        interpreter.version
                    ),
                    "drop python_version to let the script's requires-python choose, or change one of them",
                ));
            }
            return Ok(interpreter.clone());
        }
        if let Some(spec) = requires_python {
            if let Ok(default) = interpreters.find(default_request)
                && spec.contains(&default.version)
            {
                return Ok(default.clone());
            }
            let candidates = interpreters.satisfying(spec);
            return candidates
                .into_iter()
                .max_by(|a, b| a.version.cmp(&b.version))
                .cloned()
                .ok_or_else(|| {
                    self.missing_python(&spec.to_string(), "the script's requires-python")
                });
        }
        Ok(interpreters.find(default_request)?.clone())
    }

    /// With `python_downloads = "automatic"`, download the Python a call asks for when no
    /// interpreter here has it: `uv python install` (one at a time), then find the
    /// interpreters again, so that [`Engine::pick_interpreter`] takes the new one. Does
    /// nothing when the version is here, when downloads are off (the pick then refuses with
    /// the fix), or for a request that is not a version (the pick says what is wrong).
    ///
    /// # Errors
    /// The download failed (uv's message, with a hint).
    pub(crate) async fn provide_python(
        &self,
        explicit: Option<&str>,
        requires_python: Option<&pep440_rs::VersionSpecifiers>,
    ) -> Result<(), EngineError> {
        if self.config.python_downloads != crate::PythonDownloads::Automatic {
            return Ok(());
        }
        let missing = |interpreters: &snakebox_env::Interpreters| -> Option<String> {
            match (explicit, requires_python) {
                (Some(request), _) => matches!(
                    interpreters.find(request),
                    Err(snakebox_env::EnvError::NoMatchingInterpreter { .. })
                )
                .then(|| request.to_owned()),
                (None, Some(spec)) => interpreters
                    .satisfying(spec)
                    .is_empty()
                    .then(|| spec.to_string()),
                (None, None) => None,
            }
        };
        if missing(&self.interpreters()).is_none() {
            return Ok(());
        }
        let Ok(uv) = &self.uv else {
            return Ok(()); // the pick reports the missing interpreter (and uv's absence)
        };
        let _one_at_a_time = self.python_installs.lock().await;
        // Another call may have installed it while this one waited.
        let Some(request) = missing(&self.interpreters()) else {
            return Ok(());
        };
        tracing::info!(%request, "downloading a Python version a call asked for (python_downloads = automatic)");
        snakebox_env::install_python(uv, &request).await?;
        let found = snakebox_env::Interpreters::discover(uv).await;
        if let Ok(mut interpreters) = self.interpreters.write() {
            *interpreters = std::sync::Arc::new(found);
        }
        Ok(())
    }

    /// At start, with `python_downloads = "automatic"`: download the server's default Python
    /// (`--python-version`) when no interpreter here has it, before
    /// [`Engine::check_default_python`] judges it.
    ///
    /// # Errors
    /// The download failed.
    pub async fn provide_default_python(&self) -> Result<(), EngineError> {
        match self.config.python_version.as_deref() {
            Some(request) => self.provide_python(Some(request), None).await,
            None => Ok(()),
        }
    }

    /// Whether the server's default Python (`--python-version`, `[python] version`) names an
    /// interpreter that is here: a settings mistake (`3.99`, `banana`) would otherwise fail
    /// every call that does not name its own version.
    ///
    /// # Errors
    /// The request does not parse, or no usable interpreter matches it.
    pub fn check_default_python(&self) -> Result<(), EngineError> {
        let Some(request) = self.config.python_version.as_deref() else {
            return Ok(());
        };
        self.interpreters().find(request).map(|_| ()).map_err(|err| {
            let err = EngineError::from(err);
            let fixed = EngineError::new(
                err.kind,
                format!(
                    "the server's default Python (--python-version or [python] version) is not usable: {}",
                    err.message
                ),
            );
            match err.hint {
                Some(hint) => fixed.with_hint(hint),
                None => fixed,
            }
        })
    }

    pub(crate) fn available_versions(&self) -> String {
        let versions: Vec<String> = self
            .interpreters()
            .all()
            .iter()
            .map(|i| i.version.to_string())
            .collect();
        if versions.is_empty() {
            "none".into()
        } else {
            versions.join(", ")
        }
    }
}

/// What a profile (and the call's narrowing of it) decides for one run.
pub(crate) struct Decided {
    pub(crate) shape: crate::run::RunShape,
    pub(crate) network: Option<snakebox_sandbox::Names>,
    pub(crate) imports: Option<Vec<String>>,
}

/// The smaller of two bounds (`None`: unbounded).
fn tighter(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// The time a call gets under `profile`, for every way code runs (one-shot, cell, command):
/// `timeout` (the call's, already held to the server's maximum), or the profile's limit when
/// that is shorter.
///
/// # Errors
/// `invalid` with a hint when the caller asked (`asked`) for more than the profile allows: a
/// call may narrow its profile's limits, never widen them.
pub(crate) fn profile_timeout(
    profile: &crate::Profile,
    asked: Option<f64>,
    timeout: std::time::Duration,
) -> Result<std::time::Duration, EngineError> {
    let Some(max) = profile.limits.timeout_seconds else {
        return Ok(timeout);
    };
    if let Some(asked) = asked
        && whole_seconds(asked).is_some_and(|asked| asked > max)
    {
        return Err(EngineError::invalid(
            format!(
                "timeout_seconds {asked} is above the profile `{}`'s limit of {max} s",
                profile.name
            ),
            format!(
                "ask for at most {max} seconds (a call may narrow its profile's limits, never widen them)"
            ),
        ));
    }
    Ok(timeout.min(std::time::Duration::from_secs(max)))
}

/// `seconds` rounded up to whole seconds (`None` when it is not a number, or negative).
fn whole_seconds(seconds: f64) -> Option<u64> {
    if !seconds.is_finite() || seconds < 0.0 {
        return None;
    }
    let whole = seconds.ceil();
    // Anything past u64's range is "too long" all the same.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Some(if whole >= u64::MAX as f64 {
        u64::MAX
    } else {
        whole as u64
    })
}

/// Smallest `memory_limit` a call may ask for.
pub(crate) const MIN_MEMORY_LIMIT: u64 = 16 * MIB;

impl Engine {
    /// Hold a checked request to `profile`: its limits (narrowed by the call, never widened),
    /// network, subprocesses, writable paths, packages and imports.
    ///
    /// # Errors
    /// `invalid` with a hint: the call asks for more than the profile allows.
    pub(crate) fn held_to(
        &self,
        profile: &crate::Profile,
        request: &ExecuteRequest,
        checked: &Checked,
    ) -> Result<Decided, EngineError> {
        let name = &profile.name;
        let refused = profile.refused_packages(&checked.requirements);
        if !refused.is_empty() {
            return Err(profile.packages_refused(&refused));
        }
        let imports = profile.imports_for(request.allowed_imports.as_deref())?;

        let timeout = profile_timeout(profile, request.timeout_seconds, checked.timeout)?;
        let mut limits = self.profile_limits(profile, timeout);
        if let Some(asked) = request.memory_limit_bytes {
            if asked < MIN_MEMORY_LIMIT {
                return Err(EngineError::invalid(
                    format!(
                        "memory_limit {} MiB is too small to start Python",
                        asked / MIB
                    ),
                    format!("ask for at least {} MiB", MIN_MEMORY_LIMIT / MIB),
                ));
            }
            if let Some(max) = limits.memory_bytes
                && asked > max
            {
                return Err(EngineError::invalid(
                    format!(
                        "memory_limit {} MiB is above the profile `{name}`'s limit of {} MiB",
                        asked / MIB,
                        max / MIB
                    ),
                    format!(
                        "ask for at most {} MiB (e.g. \"{}m\"), or leave memory_limit out for the profile's; a call may narrow its profile's limits, never widen them",
                        max / MIB,
                        max / MIB
                    ),
                ));
            }
            limits.memory_bytes = Some(asked);
        }

        let network =
            self.profile_network(profile, request.network, &request.allowed_domains, "call")?;
        Ok(Decided {
            shape: crate::run::RunShape {
                limits,
                deny_exec: !profile.subprocesses,
                writable_work: profile.writable_work,
            },
            network,
            imports,
        })
    }

    /// The server's limits for a run of `timeout`, narrowed by `profile`'s bounds (never
    /// widened): one-shot runs and session interpreters alike.
    pub(crate) fn profile_limits(
        &self,
        profile: &crate::Profile,
        timeout: std::time::Duration,
    ) -> snakebox_sandbox::Limits {
        let mut limits = self.limits(timeout);
        let bounds = &profile.limits;
        if let Some(max) = bounds.timeout_seconds {
            limits.wall_time = limits.wall_time.min(std::time::Duration::from_secs(max));
        }
        limits.memory_bytes = tighter(limits.memory_bytes, bounds.memory_bytes);
        limits.cpu_time = tighter(limits.cpu_time.map(|t| t.as_secs()), bounds.cpu_seconds)
            .map(std::time::Duration::from_secs);
        limits.max_processes = tighter(limits.max_processes, bounds.processes);
        if let Some(max) = bounds.output_bytes {
            limits.max_output_bytes = limits.max_output_bytes.min(max);
        }
        limits
    }

    /// Where a run (`what`: `call` or `session`) under `profile` may connect: the profile's
    /// network, narrowed by the call's `network` and `allowed_domains`, never widened.
    ///
    /// # Errors
    /// `invalid` with a hint: the call asks for more than the profile (or the server) allows.
    pub(crate) fn profile_network(
        &self,
        profile: &crate::Profile,
        asked: Option<bool>,
        allowed_domains: &[String],
        what: &str,
    ) -> Result<Option<snakebox_sandbox::Names>, EngineError> {
        let name = &profile.name;
        let decided = match &profile.network {
            crate::ProfileNetwork::Server => self.network_for(asked, allowed_domains, what)?,
            crate::ProfileNetwork::Off => {
                if asked == Some(true) || !allowed_domains.is_empty() {
                    return Err(EngineError::invalid(
                        format!(
                            "This {what} asked for network access, but the profile `{name}` allows no network"
                        ),
                        "run without network (omit `network` and `allowed_domains`), or name a profile with network (check_environment lists the profiles)",
                    ));
                }
                None
            }
            crate::ProfileNetwork::Allow(names) => {
                let only = snakebox_sandbox::Names::Only(names.clone());
                for domain in allowed_domains {
                    let asked = domain.trim().trim_end_matches('.').to_ascii_lowercase();
                    if !crate::network::covers(&only, &asked) {
                        return Err(EngineError::invalid(
                            format!(
                                "allowed_domains asks for `{asked}`, which the profile `{name}` does not allow"
                            ),
                            format!(
                                "ask only for names among {} (a call may narrow its profile's network, never widen it)",
                                names.join(", ")
                            ),
                        ));
                    }
                }
                if asked == Some(false) {
                    self.network_for(Some(false), allowed_domains, what)?
                } else if allowed_domains.is_empty() {
                    self.network_for(Some(true), names, "profile")?
                } else {
                    self.network_for(Some(true), allowed_domains, what)?
                }
            }
        };
        Ok(decided)
    }
}

/// What `snakebox python install` takes for a request: the request itself when it is a
/// version (`3.12`, `3.12.7`); it takes no specifier (`>=3.12`), so then a placeholder and
/// the specifier the version must satisfy.
fn install_argument(request: &str) -> String {
    let version = request.trim();
    if !version.is_empty() && version.chars().all(|c| c.is_ascii_digit() || c == '.') {
        version.to_owned()
    } else {
        format!("X.Y` with a version that satisfies `{version}")
    }
}
