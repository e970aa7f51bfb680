//! Planning a call: the checks every execution makes of its request before anything starts
//! (the script's size, the input files, the PEP 723 block merged with `dependencies`) and the
//! choice of interpreter.
//!
//! One-shot runs and session cells both start here, so a request is judged the same way on
//! either path. The call's policy (limits, timeout, network, imports) is decided apart, for
//! every kind of call at once, by the `policy` module (which reads the request: it is not
//! named from here).

use pep440_rs::VersionSpecifiers;
use snakebox_env::Interpreter;

use crate::files::DecodedFile;
use crate::{EngineConfig, EngineError, ErrorKind, Unavailable};

/// One request to run a script.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
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
    /// The operator's secrets the run may use (names): its code sees a placeholder in an
    /// environment variable of each name, which the network proxy replaces by the value in
    /// requests to the secret's hosts (see the `secrets` module).
    #[serde(default)]
    pub secrets: Vec<String>,
}

/// A request that passed the checks every execution makes.
pub(crate) struct Checked {
    /// The script's metadata merged with `dependencies` (the argument wins a name clash).
    pub(crate) requirements: Vec<pep508_rs::Requirement>,
    /// The script's `requires-python`, when it has one.
    pub(crate) requires_python: Option<VersionSpecifiers>,
    /// The input files, decoded and checked.
    pub(crate) inputs: Vec<DecodedFile>,
}

/// Planning as a service: what judging a request and choosing its interpreter need (the
/// settings, uv to download a Python, the interpreters found), shared by every path that runs
/// a script so each judges a request the same way.
pub(crate) struct Planner {
    config: std::sync::Arc<EngineConfig>,
    uv: Result<snakebox_env::Uv, Unavailable>,
    /// The interpreters found on this host; replaced when one is downloaded
    /// ([`Planner::provide_python`]). Read through [`Planner::interpreters`].
    interpreters: std::sync::RwLock<std::sync::Arc<snakebox_env::Interpreters>>,
    /// One `uv python install` at a time.
    python_installs: tokio::sync::Mutex<()>,
}

impl Planner {
    pub(crate) fn new(
        config: std::sync::Arc<EngineConfig>,
        uv: Result<snakebox_env::Uv, Unavailable>,
        interpreters: snakebox_env::Interpreters,
    ) -> Planner {
        Planner {
            config,
            uv,
            interpreters: std::sync::RwLock::new(std::sync::Arc::new(interpreters)),
            python_installs: tokio::sync::Mutex::new(()),
        }
    }

    /// Where uv is (or why it is not available).
    pub(crate) fn uv(&self) -> &Result<snakebox_env::Uv, Unavailable> {
        &self.uv
    }

    /// The checks every execution makes before anything starts, one-shot or in a session.
    ///
    /// # Errors
    /// `invalid` with a hint: a script too large or holding a NUL, a bad input file, a
    /// malformed PEP 723 block or requirement (the call's policy is decided apart, by the
    /// `policy` module).
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
        let block = snakebox_script::parse(&request.script)?;
        let metadata = block.as_ref().map(|b| &b.metadata);
        let requirements = snakebox_script::merge_dependencies(metadata, &request.dependencies)?;
        Ok(Checked {
            requirements,
            requires_python: metadata.and_then(|m| m.requires_python.clone()),
            inputs,
        })
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
    /// interpreters again, so that [`Planner::pick_interpreter`] takes the new one. Does
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
    /// [`Planner::check_default_python`] judges it.
    ///
    /// # Errors
    /// The download failed.
    pub(crate) async fn provide_default_python(&self) -> Result<(), EngineError> {
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
    pub(crate) fn check_default_python(&self) -> Result<(), EngineError> {
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
