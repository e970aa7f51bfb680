//! A call's policy, decided in one place for every way code runs or a sandbox is occupied:
//! a one-shot run, a session's cell, a session's command, a session's interpreter, a
//! session's start, validation's compile, and installs (a session's uv steps, an environment
//! build's package code).
//!
//! [`CallPolicy::decide`] is plain data in, data out: the server's settings, the kind of call
//! (with the facts of its session, when it has one), the tenant and what the call asked for
//! go in; the profile it runs under, its limits (the timeout among them), its network, its
//! exec policy, whether `/work` is writable, its import policy and the notes on what was
//! adjusted come out, or a [`Refusal`] with its message and hint. Nothing here touches the
//! host, so every rule is a row of the table tests below.
//!
//! The rules, for every kind alike: a call may narrow what its profile allows, never widen
//! it; a profile only ever narrows the server. A timeout is whole seconds (a fraction is
//! rounded up, with a note), held to the server's maximum (clamped, with a note) and refused
//! above its profile's limit. What differs between kinds is said where it is decided, with
//! the reason (see [`CallKind`]).

use std::time::Duration;

use snakebox_sandbox::{Limits, Names};

use crate::profiles::MIB;
use crate::{EngineConfig, EngineError, ErrorKind, Profile, ProfileNetwork, Tenant};

/// Smallest `memory_limit` a call may ask for.
pub(crate) const MIN_MEMORY_LIMIT: u64 = 16 * MIB;

/// Wall time of validation's compile check (the parser of the target interpreter, no user
/// code).
pub(crate) const COMPILE_TIMEOUT: Duration = Duration::from_secs(15);

/// What a call's policy changes in its sandbox: its limits, whether it may start programs,
/// whether its working directory is writable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunShape {
    pub(crate) limits: Limits,
    /// `execve` denied once the interpreter runs (see `runner.py`'s `_deny_exec`).
    pub(crate) deny_exec: bool,
    pub(crate) writable_work: bool,
}

/// What a session brings to a call made in it: decided when it was created, fixed for its
/// life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SessionFacts {
    /// The session's id, for messages.
    pub(crate) id: String,
    /// The profile it was created under.
    pub(crate) profile: String,
    /// Whether it was created with network.
    pub(crate) network: bool,
    /// The names it was narrowed to at creation (empty: the server's whole policy).
    pub(crate) network_names: Vec<String>,
    /// The Python its interpreter runs.
    pub(crate) python_version: String,
    /// The packages installed in it (names), which a cell's imports need not add.
    pub(crate) packages: Vec<String>,
}

/// The kind of call whose policy is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallKind<'a> {
    /// A one-shot run in a fresh sandbox: the whole request applies.
    Run,
    /// A cell in a session's live interpreter. The interpreter lives across calls under the
    /// profile, limits, network and imports its session was created with, so a cell asking
    /// to change them is refused (not ignored); its time is its own; its dependencies are
    /// held to its profile's package allowlist before they are installed, as a one-shot
    /// run's are.
    Cell(&'a SessionFacts),
    /// A shell command in a short-lived sandbox over a session: the same view and limits as
    /// the session's interpreter (so no CPU-time limit either), its time its own; refused
    /// under a profile that denies subprocesses (a shell is one).
    Command(&'a SessionFacts),
    /// A session's interpreter, started for a call: it lives across calls, so RLIMIT_CPU
    /// (which counts a process's whole life) is not set, each call's wall time bounds it;
    /// its own wall time is the server's maximum.
    Interpreter(&'a SessionFacts),
    /// `create_session`: the profile, its package allowlist and the network, fixed for the
    /// session's life (the one-shot rule: the profile's unless the call declines or narrows
    /// it).
    SessionStart,
    /// Validation's compile: the target interpreter's parser on the script (no user code
    /// runs), under the server's limits for [`COMPILE_TIMEOUT`], never with network; the
    /// import policy is the one a run of the same call would get, for the report.
    Compile,
    /// A session's install (`install_packages`, a cell's dependencies): the session's
    /// profile's package allowlist; package code (compilation) under the server's limits for
    /// the operator's `install_timeout` per step, as an environment build's steps.
    SessionInstall(&'a SessionFacts),
    /// An environment build of the cache (shared by every profile and tenant: none applies):
    /// package code under the server's limits for `install_timeout` per step.
    Build,
}

impl CallKind<'_> {
    /// The session of a call made in one.
    fn session(&self) -> Option<&SessionFacts> {
        match self {
            CallKind::Cell(session)
            | CallKind::Command(session)
            | CallKind::Interpreter(session)
            | CallKind::SessionInstall(session) => Some(session),
            _ => None,
        }
    }
}

/// What a call asked for that bears on its policy (everything else in a request is checked
/// elsewhere: the script, its files, its metadata).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Asked<'a> {
    /// Wall time in seconds, as the caller gave it.
    pub(crate) timeout_seconds: Option<f64>,
    /// A memory limit below the profile's.
    pub(crate) memory_limit_bytes: Option<u64>,
    /// The profile named (`None`: the tenant's default).
    pub(crate) profile: Option<&'a str>,
    /// Ask for or decline network.
    pub(crate) network: Option<bool>,
    /// Narrow the network to these names.
    pub(crate) allowed_domains: &'a [String],
    /// Narrow the import policy to these modules.
    pub(crate) allowed_imports: Option<&'a [String]>,
    /// The Python version asked for.
    pub(crate) python_version: Option<&'a str>,
    /// The requirements to install (PEP 508, parsed), for the package allowlist.
    pub(crate) requirements: &'a [pep508_rs::Requirement],
    /// The script, whose imports name the dependencies inferred for it (when the server
    /// infers them; empty for calls that run none).
    pub(crate) script: &'a str,
    /// The operator's secrets asked for (names).
    pub(crate) secrets: &'a [String],
}

impl<'a> Asked<'a> {
    /// What an `execute_python` request asks for, with its merged `requirements`.
    pub(crate) fn of(
        request: &'a crate::ExecuteRequest,
        requirements: &'a [pep508_rs::Requirement],
    ) -> Asked<'a> {
        Asked {
            timeout_seconds: request.timeout_seconds,
            memory_limit_bytes: request.memory_limit_bytes,
            profile: request.profile.as_deref(),
            network: request.network,
            allowed_domains: &request.allowed_domains,
            allowed_imports: request.allowed_imports.as_deref(),
            python_version: request.python_version.as_deref(),
            requirements,
            script: &request.script,
            secrets: &request.secrets,
        }
    }
}

/// What ran without network, for the note a call that tried to reach a host gets.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Offline<'a> {
    /// A one-shot run, and what its call asked for.
    Run {
        /// The call's `network`.
        asked: Option<bool>,
    },
    /// A cell or command of a session, whose network was fixed when it was created.
    Session {
        /// The session's id.
        id: &'a str,
        /// Whether it was created with network.
        created_with_network: bool,
    },
}

/// A call's policy, as decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CallPolicy {
    /// The profile it runs under (empty for [`CallKind::Build`], which none holds).
    pub(crate) profile: String,
    /// What its sandbox is held to: limits (the timeout is their wall time), exec, `/work`.
    pub(crate) shape: RunShape,
    /// The names it may reach (`None`: no network).
    pub(crate) network: Option<Names>,
    /// The modules its code may import (`None`: no import policy).
    pub(crate) imports: Option<Vec<String>>,
    /// Adjustments made to the request, for the result's `notes`.
    pub(crate) notes: Vec<String>,
    /// Packages added for the script's imports (`--infer-dependencies`; each has its note).
    pub(crate) inferred: Vec<pep508_rs::Requirement>,
    /// The operator's secrets granted (names; see the `secrets` module).
    pub(crate) secrets: Vec<String>,
}

/// A call refused by its policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The refusal, with its hint.
    pub(crate) error: EngineError,
    /// The profile whose policy refused it (its result carries a `policy_refused` event);
    /// `None` for a request the server refuses whatever the profile (a timeout below one
    /// second, a malformed module name, a session's fixed network).
    pub(crate) profile: Option<String>,
}

impl Refusal {
    fn server(error: EngineError) -> Refusal {
        Refusal {
            error,
            profile: None,
        }
    }

    fn profile(profile: &str) -> impl Fn(EngineError) -> Refusal + '_ {
        move |error| Refusal {
            error,
            profile: Some(profile.to_owned()),
        }
    }
}

impl CallPolicy {
    /// Add to `result` (of a call held to this policy, on a server set up as `server`) the
    /// note that says why it had no network and who can change that, when it ran without
    /// network and failed to resolve a host name: the operator (the server's policy is off),
    /// the caller (it asked for none, or created its session without), or the profile.
    pub(crate) fn note_if_offline(
        &self,
        server: &EngineConfig,
        result: &mut crate::ExecutionResult,
        what: Offline<'_>,
    ) {
        if self.network.is_some() || !result.failed_to_resolve_a_name() {
            return;
        }
        let profile = self.profile.as_str();
        let profile_off = server
            .profiles
            .all
            .get(profile)
            .is_some_and(|p| p.network == crate::ProfileNetwork::Off);
        let (this, again) = match what {
            Offline::Run { .. } => ("This run".to_owned(), "call again"),
            Offline::Session { id, .. } => (format!("Session {id}"), "create a new session"),
        };
        let lead = match what {
            Offline::Run { .. } => "This server".to_owned(),
            Offline::Session { id, .. } => format!("Session {id} has no network: this server"),
        };
        let note = if server.network == crate::NetworkPolicy::Off {
            format!(
                "{lead} runs code without network (its network policy is `off`, the default), so host names do not resolve: the operator can allow it with `--network on` or `--network allow:HOST[,HOST...]` (`[network] mode` in the config file); check_environment shows the policy"
            )
        } else if profile_off {
            format!(
                "{this} has no network because its profile `{profile}` has none, so host names do not resolve: {again} under a profile with network (check_environment lists the profiles you may use)"
            )
        } else if let Offline::Run { asked: Some(false) } = what {
            format!(
                "{this} had no network because the call asked for none (`network: false`), so host names do not resolve: {again} without it to use the server's network policy"
            )
        } else if let Offline::Session {
            created_with_network: false,
            ..
        } = what
        {
            format!(
                "{this} has no network because it was created without (`network: false` at create_session), so host names do not resolve: {again} without it to use the server's network policy"
            )
        } else {
            format!(
                "{this} had no network, so host names do not resolve; check_environment shows the server's network policy"
            )
        };
        result.notes.push(note);
    }

    /// The wall-time limit of the call.
    pub(crate) fn timeout(&self) -> Duration {
        self.shape.limits.wall_time
    }

    /// Decide the policy of a call of `kind` by `tenant`, asking for `asked`, on a server
    /// set up as `server` (see the module documentation for the rules).
    ///
    /// # Errors
    /// A [`Refusal`]: the call asks for more than its profile (or the server) allows, for
    /// something its kind cannot change, or for a malformed value.
    pub(crate) fn decide(
        server: &EngineConfig,
        kind: CallKind<'_>,
        tenant: &Tenant,
        asked: &Asked<'_>,
    ) -> Result<CallPolicy, Refusal> {
        if kind == CallKind::Build {
            return Ok(CallPolicy {
                profile: String::new(),
                shape: server_shape(server, server.install_timeout),
                network: None,
                imports: None,
                notes: Vec::new(),
                inferred: Vec::new(),
                secrets: Vec::new(),
            });
        }
        if let CallKind::Cell(session) = kind {
            not_in_a_cell(session, asked).map_err(Refusal::server)?;
        }
        let profile = profile_for(server, kind, tenant, asked.profile)?;
        let refused = Refusal::profile(&profile.name);
        check_module_names(asked.allowed_imports).map_err(Refusal::server)?;
        let mut notes = Vec::new();
        let timeout = match kind {
            CallKind::Run | CallKind::Cell(_) | CallKind::Command(_) => {
                let timeout = server_timeout(server, asked.timeout_seconds, &mut notes)
                    .map_err(Refusal::server)?;
                profile_timeout(profile, asked.timeout_seconds, timeout).map_err(&refused)?
            }
            CallKind::Interpreter(_) | CallKind::SessionStart => server.max_timeout,
            CallKind::Compile => COMPILE_TIMEOUT,
            CallKind::SessionInstall(_) | CallKind::Build => server.install_timeout,
        };
        if matches!(
            kind,
            CallKind::Run
                | CallKind::Cell(_)
                | CallKind::SessionStart
                | CallKind::SessionInstall(_)
        ) {
            let packages = profile.refused_packages(asked.requirements);
            if !packages.is_empty() {
                return Err(refused(profile.packages_refused(&packages)));
            }
        }
        let imports = match kind {
            CallKind::Run | CallKind::Compile => profile
                .imports_for(asked.allowed_imports)
                .map_err(&refused)?,
            CallKind::Cell(_) | CallKind::Interpreter(_) | CallKind::SessionStart => {
                profile.allowed_imports.clone()
            }
            // No Python of the caller's runs: a shell, or uv.
            CallKind::Command(_) | CallKind::SessionInstall(_) | CallKind::Build => None,
        };
        if let CallKind::Command(session) = kind
            && !profile.subprocesses
        {
            // A shell is a subprocess, and starts more: the profile denies them.
            return Err(refused(EngineError::invalid(
                format!(
                    "run_command cannot be used in session {}: its profile `{}` denies subprocesses",
                    session.id, profile.name
                ),
                "do the work in Python with execute_python in the session, or create the session under a profile that allows subprocesses (check_environment lists them)",
            )));
        }
        let mut limits = match kind {
            CallKind::Run
            | CallKind::Cell(_)
            | CallKind::Command(_)
            | CallKind::Interpreter(_)
            | CallKind::SessionStart => profile_limits(server, profile, timeout),
            CallKind::Compile => compile_limits(server),
            CallKind::SessionInstall(_) | CallKind::Build => server_limits(server, timeout),
        };
        if matches!(
            kind,
            CallKind::Cell(_) | CallKind::Command(_) | CallKind::Interpreter(_)
        ) {
            // RLIMIT_CPU counts a process's whole life: for an interpreter that lives across
            // calls it would be a budget for the session, not a limit per call. Wall time per
            // call bounds the CPU instead; a command sees the session as its interpreter does.
            limits.cpu_time = None;
        }
        if kind == CallKind::Run
            && let Some(asked) = asked.memory_limit_bytes
        {
            limits.memory_bytes = Some(narrowed_memory(profile, limits.memory_bytes, asked)?);
        }
        let network = match kind {
            CallKind::Run => profile_network(
                server,
                profile,
                asked.network,
                asked.allowed_domains,
                "call",
            )
            .map_err(&refused)?,
            CallKind::SessionStart => profile_network(
                server,
                profile,
                asked.network,
                asked.allowed_domains,
                "session",
            )
            .map_err(&refused)?,
            CallKind::Cell(session) => {
                cell_network(server, session, asked.network, &mut notes)
                    .map_err(Refusal::server)?;
                session_names(server, session)
            }
            CallKind::Command(session) | CallKind::Interpreter(session) => {
                session_names(server, session)
            }
            CallKind::Compile | CallKind::SessionInstall(_) | CallKind::Build => None,
        };
        // Secrets: a one-shot run's own; any other kind runs no code that could use them (a
        // session's are for a later change), so asking there is refused, not ignored.
        let secrets = match kind {
            CallKind::Run => crate::secrets::decide(
                &server.secrets,
                &tenant.name,
                profile,
                asked.secrets,
                network.is_some(),
            )
            .map_err(&refused)?,
            _ if !asked.secrets.is_empty() => {
                return Err(Refusal::server(EngineError::invalid(
                    "Secrets can be asked for by a one-shot run only (not yet by a session or its calls)",
                    "run the code that needs the secret with execute_python without session_id, passing `secrets`",
                )));
            }
            _ => Vec::new(),
        };
        if let (CallKind::Cell(session), Some(asked)) = (kind, asked.python_version)
            && !session.python_version.starts_with(asked.trim())
        {
            notes.push(format!(
                "python_version `{asked}` is ignored: session {} runs Python {}",
                session.id, session.python_version
            ));
        }
        let inferred = match kind {
            CallKind::Run | CallKind::Cell(_) if server.infer_dependencies => {
                let present = kind.session().map_or(&[][..], |s| &s.packages[..]);
                crate::infer::infer(
                    asked.script,
                    asked.requirements,
                    present,
                    |package, module| {
                        profile
                            .refused_packages(std::slice::from_ref(package))
                            .is_empty()
                            && imports
                                .as_ref()
                                .is_none_or(|allowed| crate::import_allowed(module, allowed))
                    },
                )
            }
            _ => Vec::new(),
        };
        notes.extend(inferred.iter().map(crate::infer::Inferred::note));
        let (deny_exec, writable_work) = match kind {
            // The compile and uv steps run no code of the caller's, in sandboxes of their own.
            CallKind::Compile | CallKind::SessionInstall(_) | CallKind::Build => (false, true),
            _ => (!profile.subprocesses, profile.writable_work),
        };
        Ok(CallPolicy {
            profile: profile.name.clone(),
            shape: RunShape {
                limits,
                deny_exec,
                writable_work,
            },
            network,
            imports,
            notes,
            inferred: inferred
                .into_iter()
                .map(|added| added.requirement)
                .collect(),
            secrets,
        })
    }
}

/// The profile a call runs under: the one it names (or its tenant's default), which the
/// operator must have allowed for the tenant; a session's calls, the session's (one removed
/// since: refused, fail closed).
fn profile_for<'a>(
    server: &'a EngineConfig,
    kind: CallKind<'_>,
    tenant: &Tenant,
    named: Option<&str>,
) -> Result<&'a Profile, Refusal> {
    if let Some(session) = kind.session() {
        return server.profiles.all.get(&session.profile).ok_or_else(|| {
            Refusal::server(
                EngineError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "The session's profile `{}` is no longer on this server",
                        session.profile
                    ),
                )
                .with_hint("create a new session; or the operator restores the profile"),
            )
        });
    }
    server
        .profiles
        .for_tenant(&tenant.name, named)
        .map_err(|error| Refusal {
            error,
            profile: Some(named.unwrap_or_default().to_owned()),
        })
}

/// A session's cell cannot change what its interpreter lives under.
fn not_in_a_cell(session: &SessionFacts, asked: &Asked<'_>) -> Result<(), EngineError> {
    let id = &session.id;
    if asked.profile.is_some() || asked.memory_limit_bytes.is_some() {
        return Err(EngineError::invalid(
            "`profile` and `memory_limit` apply to one-shot runs, not to a session's cells",
            "drop them with session_id (a session keeps the limits it was created with), or run without session_id",
        ));
    }
    if !asked.allowed_domains.is_empty() {
        return Err(EngineError::invalid(
            format!(
                "allowed_domains cannot be used with a session: session {id}'s network policy was fixed when it was created"
            ),
            "drop allowed_domains here, or run the code as a one-shot call (without session_id) to narrow the network",
        ));
    }
    if asked.allowed_imports.is_some() {
        return Err(EngineError::invalid(
            format!(
                "allowed_imports cannot be used with a session yet: session {id}'s interpreter already holds what earlier cells imported"
            ),
            "drop allowed_imports here, or run the code as a one-shot call (without session_id) under an import policy",
        ));
    }
    Ok(())
}

/// Each name of `allowed_imports` is a module name as Python writes it.
fn check_module_names(allowed_imports: Option<&[String]>) -> Result<(), EngineError> {
    for name in allowed_imports.into_iter().flatten() {
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
    Ok(())
}

/// The time a call asked for, held to the server: whole seconds (a fraction is rounded up,
/// with a note), at most the server's maximum (clamped, with a note); the server's default
/// when it asked for none.
///
/// # Errors
/// `invalid`: less than a second, or not a number.
pub(crate) fn server_timeout(
    server: &EngineConfig,
    requested: Option<f64>,
    notes: &mut Vec<String>,
) -> Result<Duration, EngineError> {
    let max = server.max_timeout.as_secs().max(1);
    let Some(requested) = requested else {
        return Ok(server.default_timeout.min(server.max_timeout));
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

/// The time a call gets under `profile`: `timeout` (the call's, already held to the server's
/// maximum), or the profile's limit when that is shorter.
///
/// # Errors
/// `invalid` with a hint when the caller asked (`asked`) for more than the profile allows: a
/// call may narrow its profile's limits, never widen them.
fn profile_timeout(
    profile: &Profile,
    asked: Option<f64>,
    timeout: Duration,
) -> Result<Duration, EngineError> {
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
    Ok(timeout.min(Duration::from_secs(max)))
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

/// A call's `memory_limit`, checked against the profile's (`max`).
fn narrowed_memory(profile: &Profile, max: Option<u64>, asked: u64) -> Result<u64, Refusal> {
    let refused = Refusal::profile(&profile.name);
    if asked < MIN_MEMORY_LIMIT {
        return Err(refused(EngineError::invalid(
            format!(
                "memory_limit {} MiB is too small to start Python",
                asked / MIB
            ),
            format!("ask for at least {} MiB", MIN_MEMORY_LIMIT / MIB),
        )));
    }
    if let Some(max) = max
        && asked > max
    {
        return Err(refused(EngineError::invalid(
            format!(
                "memory_limit {} MiB is above the profile `{}`'s limit of {} MiB",
                asked / MIB,
                profile.name,
                max / MIB
            ),
            format!(
                "ask for at most {} MiB (e.g. \"{}m\"), or leave memory_limit out for the profile's; a call may narrow its profile's limits, never widen them",
                max / MIB,
                max / MIB
            ),
        )));
    }
    Ok(asked)
}

/// The server's limits for a sandbox of `timeout`.
pub(crate) fn server_limits(server: &EngineConfig, timeout: Duration) -> Limits {
    Limits {
        wall_time: timeout,
        cpu_time: server.cpu_time,
        memory_bytes: server.memory_bytes,
        max_processes: server.max_processes,
        max_output_bytes: server.max_output_bytes,
        scratch_bytes: server.scratch_bytes,
        file_size_bytes: server.file_size_bytes,
        open_files: server.open_files,
        cpu_millicores: server.cpu_millicores,
    }
}

/// The limits of validation's compile check (see [`CallKind::Compile`]): also the check of a
/// one-shot run's imports against its import policy, the same compile.
pub(crate) fn compile_limits(server: &EngineConfig) -> Limits {
    server_limits(server, COMPILE_TIMEOUT)
}

/// The shape of a sandbox held to nothing but the server's settings (as a pooled sandbox
/// and a fork server are started).
pub(crate) fn server_shape(server: &EngineConfig, timeout: Duration) -> RunShape {
    RunShape {
        limits: server_limits(server, timeout),
        deny_exec: false,
        writable_work: true,
    }
}

/// The smaller of two bounds (`None`: unbounded).
fn tighter(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// The server's limits for a sandbox of `timeout`, narrowed by `profile`'s bounds (never
/// widened).
fn profile_limits(server: &EngineConfig, profile: &Profile, timeout: Duration) -> Limits {
    let mut limits = server_limits(server, timeout);
    let bounds = &profile.limits;
    if let Some(max) = bounds.timeout_seconds {
        limits.wall_time = limits.wall_time.min(Duration::from_secs(max));
    }
    limits.memory_bytes = tighter(limits.memory_bytes, bounds.memory_bytes);
    limits.cpu_time =
        tighter(limits.cpu_time.map(|t| t.as_secs()), bounds.cpu_seconds).map(Duration::from_secs);
    limits.max_processes = tighter(limits.max_processes, bounds.processes);
    if let Some(max) = bounds.output_bytes {
        limits.max_output_bytes = limits.max_output_bytes.min(max);
    }
    limits
}

/// The names a run gets from the server alone: its policy, narrowed by the call (`network:
/// false` declines it, `allowed_domains` asks for a subset); asking for more is refused with
/// the reason. `None`: no network. `what` names the asker (`call`, `session`, `profile`).
fn server_network(
    server: &EngineConfig,
    asked: Option<bool>,
    allowed_domains: &[String],
    what: &str,
) -> Result<Option<Names>, EngineError> {
    let policy = &server.network;
    if asked == Some(false) {
        if !allowed_domains.is_empty() {
            return Err(EngineError::invalid(
                format!("This {what} set `network: false` and also `allowed_domains`"),
                "omit `network` (or set it to true) to use `allowed_domains`, or drop `allowed_domains`",
            ));
        }
        return Ok(None);
    }
    let Some(names) = policy.names() else {
        if asked == Some(true) || !allowed_domains.is_empty() {
            return Err(EngineError::invalid(
                format!(
                    "This {what} asked for network access, but this server does not allow network for runs"
                ),
                "run without network (omit `network` and `allowed_domains`), or ask the operator to start snakebox with `--network on` or `--network allow:NAME`",
            ));
        }
        return Ok(None);
    };
    if allowed_domains.is_empty() {
        return Ok(Some(names));
    }
    let mut asked_names = Vec::new();
    for name in allowed_domains {
        let name = name.trim().trim_end_matches('.').to_ascii_lowercase();
        crate::network::check_pattern(&name).map_err(|reason| {
            EngineError::invalid(
                format!("allowed_domains: {reason}"),
                "list host names such as `api.example.com` or patterns such as `*.example.com`",
            )
        })?;
        if !crate::network::covers(&names, &name) {
            return Err(EngineError::invalid(
                format!(
                    "This {what} asked for `{name}` in allowed_domains, which this server's network policy ({}) does not allow",
                    policy.describe()
                ),
                "a call may only narrow the server's policy: ask for names it allows, or ask the operator to add the name",
            ));
        }
        asked_names.push(name);
    }
    Ok(Some(Names::Only(asked_names)))
}

/// Where a run (`what`: `call` or `session`) under `profile` may connect: the profile's
/// network, narrowed by the call's `network` and `allowed_domains`, never widened.
fn profile_network(
    server: &EngineConfig,
    profile: &Profile,
    asked: Option<bool>,
    allowed_domains: &[String],
    what: &str,
) -> Result<Option<Names>, EngineError> {
    let name = &profile.name;
    match &profile.network {
        ProfileNetwork::Server => server_network(server, asked, allowed_domains, what),
        ProfileNetwork::Off => {
            if asked == Some(true) || !allowed_domains.is_empty() {
                return Err(EngineError::invalid(
                    format!(
                        "This {what} asked for network access, but the profile `{name}` allows no network"
                    ),
                    "run without network (omit `network` and `allowed_domains`), or name a profile with network (check_environment lists the profiles)",
                ));
            }
            Ok(None)
        }
        ProfileNetwork::Allow(names) => {
            let only = Names::Only(names.clone());
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
                server_network(server, Some(false), allowed_domains, what)
            } else if allowed_domains.is_empty() {
                server_network(server, Some(true), names, "profile")
            } else {
                server_network(server, Some(true), allowed_domains, what)
            }
        }
    }
}

/// Whether a session's code has network now: it was created with network and the server
/// (as started now: the policy may have changed across a restart) still allows it.
pub(crate) fn session_has_network(server: &EngineConfig, session: &SessionFacts) -> bool {
    session.network && server.network.allows_network()
}

/// The names a session's code may reach now: none without network; the names it was
/// narrowed to at creation that the server (as started now) still allows; or the server's
/// whole policy.
pub(crate) fn session_names(server: &EngineConfig, session: &SessionFacts) -> Option<Names> {
    if !session_has_network(server, session) {
        return None;
    }
    let names = server.network.names()?;
    if session.network_names.is_empty() {
        return Some(names);
    }
    Some(Names::Only(
        session
            .network_names
            .iter()
            .filter(|name| crate::network::covers(&names, name))
            .cloned()
            .collect(),
    ))
}

/// A cell's `network` against its session's: asking for more than the server allows is
/// refused with the reason; a session's network is fixed at creation (its interpreter lives
/// in one network namespace), so a call cannot change it either way.
fn cell_network(
    server: &EngineConfig,
    session: &SessionFacts,
    asked: Option<bool>,
    notes: &mut Vec<String>,
) -> Result<(), EngineError> {
    let has = session_has_network(server, session);
    let id = &session.id;
    match asked {
        Some(true) if !server.network.allows_network() => Err(EngineError::invalid(
            "This call asked for network access, but this server does not allow network for runs",
            "run without network (omit `network`), or ask the operator to start snakebox with `--network on`",
        )),
        Some(true) if !has => Err(EngineError::invalid(
            format!(
                "This call asked for network access, but session {id} was created without network"
            ),
            "a session's network is fixed when it is created: create a new session with `network: true`",
        )),
        Some(false) if has => Err(EngineError::invalid(
            format!(
                "This call asked to run without network, but session {id} was created with network"
            ),
            "a session's network is fixed when it is created: omit `network` here, or create a session with `network: false`",
        )),
        _ => {
            if session.network && !has {
                notes.push(format!(
                    "session {id} was created with network, but this server does not allow network now: its code runs without"
                ));
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests;
