//! One-shot executions: plan (metadata, interpreter), prepare (cached environment), run (a
//! fresh sandbox), and turn the outcome into an [`ExecutionResult`].

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use snakebox_env::{Environment, Interpreter};
use snakebox_sandbox::{
    ForkRun, ForkServerSpec, Limits, Mount, OutputChunk, Policy, SandboxCommand, Termination,
};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::Engine;
use crate::ids;
use crate::result::{ErrorInfo, ExecutionResult, Package, Status};

/// Where the run's read-only inputs (the script) appear inside the sandbox.
const SANDBOX_INPUT_DIR: &str = "/snakebox";
/// The run's writable working directory inside the sandbox.
const SANDBOX_WORK_DIR: &str = "/work";
/// File name of the script in the input directory.
const SCRIPT_NAME: &str = "script.py";

/// One request to run a script.
#[derive(Debug, Clone, Default)]
pub struct ExecuteRequest {
    /// Python source, possibly with a PEP 723 `# /// script` block.
    pub script: String,
    /// Extra requirements (PEP 508); they win over the script's on a name clash.
    pub dependencies: Vec<String>,
    /// Wall-time limit in seconds; `None` for the server's default.
    pub timeout_seconds: Option<i64>,
    /// Python version request for this call (`3.12`, `3.11.7`, `>=3.10`).
    pub python_version: Option<String>,
    /// Files to place in the working directory before the script runs.
    pub files: Vec<crate::files::InputFile>,
    /// Ask for (`true`) or decline (`false`) network access; `None` follows the server. Asking
    /// for it on a server that does not allow network is refused with an explanation.
    pub network: Option<bool>,
}

/// What planning decided: everything needed to prepare and run.
struct Plan<'a> {
    interpreter: &'a Interpreter,
    requirements: Vec<pep508_rs::Requirement>,
    timeout: Duration,
    notes: Vec<String>,
    inputs: Vec<crate::files::DecodedFile>,
    network: bool,
}

impl Engine {
    /// Run one script in a fresh sandbox. Always returns a record: failures before the script
    /// runs are reported with status `invalid_request` or `setup_failed` and a hint; a call
    /// made while the server stops is refused (`setup_failed`), one cut short by the stop is
    /// `cancelled` and says so.
    pub async fn execute(
        &self,
        caller: &crate::Caller,
        request: ExecuteRequest,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> ExecutionResult {
        self.tracked(
            &cancel,
            |error| ExecutionResult::not_run(ids::execution_id(), Status::SetupFailed, error),
            |token| self.execute_admitted(caller, request, token, output),
        )
        .await
    }

    async fn execute_admitted(
        &self,
        caller: &crate::Caller,
        request: ExecuteRequest,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> ExecutionResult {
        let execution_id = ids::execution_id();
        let plan = match self.plan(&request) {
            Ok(plan) => plan,
            Err((status, error)) => return ExecutionResult::not_run(execution_id, status, error),
        };
        let requested: Vec<String> = plan.requirements.iter().map(ToString::to_string).collect();
        let timeout_seconds = plan.timeout.as_secs();
        let with_plan = |mut result: ExecutionResult| {
            result.python_version = Some(plan.interpreter.version.to_string());
            result.requested_dependencies.clone_from(&requested);
            result.timeout_seconds = timeout_seconds;
            result.notes.clone_from(&plan.notes);
            result
        };

        let sandbox = match &self.sandbox {
            Ok(sandbox) => sandbox,
            Err(missing) => {
                return with_plan(ExecutionResult::not_run(
                    execution_id,
                    Status::SetupFailed,
                    missing.into(),
                ));
            }
        };
        let setup_started = Instant::now();
        // A cancel (the caller's, or the server stopping) ends the setup too: dropping it
        // kills its sandboxes and uv processes and removes its build directory.
        let prepared = tokio::select! {
            prepared = self.environment(plan.interpreter, &plan.requirements) => prepared,
            () = cancel.cancelled() => {
                return with_plan(ExecutionResult::not_run(
                    execution_id,
                    Status::Cancelled,
                    ErrorInfo {
                        message: "The call was cancelled while its environment was being prepared"
                            .into(),
                        hint: None,
                    },
                ));
            }
        };
        let environment = match prepared {
            Ok(environment) => environment,
            Err(error) => {
                return with_plan(ExecutionResult::not_run(
                    execution_id,
                    Status::SetupFailed,
                    error,
                ));
            }
        };
        let setup_ms = ids::millis(setup_started.elapsed());

        // Wait for a run slot only after setup: installs do not hold back quick runs.
        let _slot = match self.sandbox_slot().await {
            Ok(slot) => slot,
            Err(error) => {
                return with_plan(ExecutionResult::not_run(
                    execution_id,
                    Status::SetupFailed,
                    error,
                ));
            }
        };
        let network_is_default = plan.network == self.config.network;
        // The default environment and network setting (the pool learns the default from its
        // first use when cache warming did not build it).
        let is_default = plan.requirements.is_empty()
            && network_is_default
            && self
                .pick_interpreter(None, None)
                .is_ok_and(|default| default.executable == plan.interpreter.executable);
        // Forked from the fork server of this environment when there is one; else a
        // pre-started sandbox of the warm pool when one matches; else a cold start.
        let (forking, warm) = match self.pool.claim(&environment, plan.network, is_default) {
            crate::pool::Claim::Fork(forking) => (Some(forking), None),
            crate::pool::Claim::Warm(warm) => (None, Some(*warm)),
            crate::pool::Claim::Cold => (None, None),
        };
        let (run_dir, pending) = match warm {
            Some(warm) => (
                warm.run_dir
                    .write_script(&request.script)
                    .map(|()| warm.run_dir),
                Some(warm.pending),
            ),
            None => (
                match &forking {
                    Some(forking) => RunDir::for_fork(
                        &forking.server,
                        &self.config.data_dir,
                        &execution_id,
                        Some(&request.script),
                        self.config.scratch_bytes,
                    ),
                    None => RunDir::for_run(
                        sandbox,
                        &self.config.data_dir,
                        &execution_id,
                        Some(&request.script),
                        self.config.scratch_bytes,
                    ),
                },
                None,
            ),
        };
        let run_dir = match run_dir {
            Ok(dir) => dir,
            Err(err) => {
                return with_plan(ExecutionResult::not_run(
                    execution_id,
                    Status::SetupFailed,
                    ErrorInfo {
                        message: format!("Failed to prepare the run directory: {err}"),
                        hint: Some("check that the data directory is writable".into()),
                    },
                ));
            }
        };
        let baseline = match crate::files::write(&run_dir.work, &plan.inputs, run_dir.owner()) {
            Ok(()) => crate::artifacts::Baseline::snapshot(&run_dir.work),
            Err(err) => {
                return with_plan(ExecutionResult::not_run(
                    execution_id,
                    Status::SetupFailed,
                    ErrorInfo {
                        message: format!("Failed to write the input files: {}", err.with_cause()),
                        hint: Some("check that the data directory is writable".into()),
                    },
                ));
            }
        };
        let mut outcome = None;
        if let Some(forking) = &forking {
            let forked = forking
                .server
                .run(
                    &self.fork_run(&run_dir, plan.timeout),
                    cancel.clone(),
                    output.clone(),
                )
                .await;
            match forked {
                // No user code ran: a cold start serves the run instead.
                Err(err) if err.retry_elsewhere() => {
                    tracing::warn!(error = %crate::describe(&err), "fork server; running cold");
                }
                forked => outcome = Some(forked),
            }
        }
        let outcome = match (outcome, pending) {
            (Some(outcome), _) => outcome,
            (None, Some(pending)) => {
                pending
                    .run(crate::pool::GO, plan.timeout, cancel, output)
                    .await
            }
            (None, None) => {
                let (policy, command) =
                    self.sandbox_call(&environment, &run_dir, plan.timeout, plan.network, false);
                sandbox.run(&policy, &command, cancel, output).await
            }
        };
        let control = outcome
            .as_ref()
            .map(|o| o.control.as_slice())
            .unwrap_or_default();
        let collected = self
            .collect_rich(caller, &execution_id, &run_dir.work, baseline, control)
            .await;
        // The run is over and its files are collected: unmounting and removing the run
        // directory need not hold up the reply.
        tokio::task::spawn_blocking(move || drop(run_dir));

        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(err) => {
                return with_plan(ExecutionResult::not_run(
                    execution_id,
                    Status::SetupFailed,
                    ErrorInfo {
                        message: crate::describe(&err),
                        hint: err.hint(),
                    },
                ));
            }
        };
        let (status, error) = classify(&outcome, &self.config, plan.timeout);
        let mut result = ExecutionResult::new(execution_id, status);
        result.record_outcome(outcome);
        result.setup_ms = setup_ms;
        result.resolved_dependencies = environment
            .packages
            .iter()
            .map(|p| Package {
                name: p.name.clone(),
                version: p.version.clone(),
            })
            .collect();
        result.environment_reused = environment.reused;
        result.error = error;
        let mut result = with_plan(result);
        collected.apply(&mut result);
        result
    }

    /// Check the request and decide interpreter, requirements and timeout.
    fn plan(&self, request: &ExecuteRequest) -> Result<Plan<'_>, (Status, ErrorInfo)> {
        let invalid = |message: String, hint: &str| {
            (
                Status::InvalidRequest,
                ErrorInfo {
                    message,
                    hint: Some(hint.to_string()),
                },
            )
        };
        if request.script.len() > self.config.max_script_bytes {
            return Err(invalid(
                format!(
                    "The script is {} bytes, more than the limit of {} bytes",
                    request.script.len(),
                    self.config.max_script_bytes
                ),
                "send a shorter script; put large data in files the script reads or downloads",
            ));
        }
        if request.script.contains('\0') {
            return Err(invalid(
                "The script contains a NUL character".into(),
                "send the script as plain UTF-8 text",
            ));
        }
        let inputs = crate::files::decode(&request.files)
            .map_err(|error| (Status::InvalidRequest, error))?;
        let mut notes = Vec::new();
        let timeout = self.effective_timeout(request.timeout_seconds, &mut notes)?;
        if request.network == Some(true) && !self.config.network {
            return Err(invalid(
                "This call asked for network access, but this server does not allow network for runs".into(),
                "run without network (the default), or ask the operator to start snakebox with `--network on`",
            ));
        }
        let network = self.config.network && request.network != Some(false);
        let block = snakebox_script::parse(&request.script).map_err(|err| {
            (
                Status::InvalidRequest,
                ErrorInfo {
                    message: crate::describe(&err),
                    hint: err.hint(),
                },
            )
        })?;
        let metadata = block.as_ref().map(|b| &b.metadata);
        let requirements = snakebox_script::merge_dependencies(metadata, &request.dependencies)
            .map_err(|err| {
                (
                    Status::InvalidRequest,
                    ErrorInfo {
                        message: crate::describe(&err),
                        hint: err.hint(),
                    },
                )
            })?;
        let requires_python = metadata.and_then(|m| m.requires_python.as_ref());
        let interpreter = self
            .pick_interpreter(request.python_version.as_deref(), requires_python)
            .map_err(|error| (Status::SetupFailed, error))?;
        Ok(Plan {
            interpreter,
            requirements,
            timeout,
            notes,
            inputs,
            network,
        })
    }

    pub(crate) fn effective_timeout(
        &self,
        requested: Option<i64>,
        notes: &mut Vec<String>,
    ) -> Result<Duration, (Status, ErrorInfo)> {
        let max = self.config.max_timeout.as_secs().max(1);
        let Some(seconds) = requested else {
            return Ok(self.config.default_timeout.min(self.config.max_timeout));
        };
        let Ok(seconds) = u64::try_from(seconds) else {
            return Err((
                Status::InvalidRequest,
                ErrorInfo {
                    message: format!("timeout_seconds must be at least 1, got `{seconds}`"),
                    hint: Some(format!(
                        "pass a whole number of seconds between 1 and {max}"
                    )),
                },
            ));
        };
        if seconds == 0 {
            return Err((
                Status::InvalidRequest,
                ErrorInfo {
                    message: "timeout_seconds must be at least 1, got `0`".into(),
                    hint: Some(format!(
                        "pass a whole number of seconds between 1 and {max}"
                    )),
                },
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

    /// Choose the interpreter: the call's request, else the script's `requires-python`
    /// (preferring the server default when it satisfies it), else the server default.
    pub(crate) fn pick_interpreter(
        &self,
        explicit: Option<&str>,
        requires_python: Option<&pep440_rs::VersionSpecifiers>,
    ) -> Result<&Interpreter, ErrorInfo> {
        let env_error = |err: snakebox_env::EnvError| ErrorInfo {
            message: crate::describe(&err),
            hint: err.hint(),
        };
        let default_request = self.config.python_version.as_deref().unwrap_or("3");
        if let Some(request) = explicit {
            let interpreter = self.interpreters.find(request).map_err(env_error)?;
            if let Some(spec) = requires_python
                && !spec.contains(&interpreter.version)
            {
                return Err(ErrorInfo {
                        message: format!(
                            "Python {} (from python_version `{request}`) does not satisfy the script's requires-python `{spec}`",
                            interpreter.version
                        ),
                        hint: Some(
                            "drop python_version to let the script's requires-python choose, or change one of them".into(),
                        ),
                    });
            }
            return Ok(interpreter);
        }
        if let Some(spec) = requires_python {
            if let Ok(default) = self.interpreters.find(default_request)
                && spec.contains(&default.version)
            {
                return Ok(default);
            }
            let candidates = self.interpreters.satisfying(spec);
            return candidates
                .into_iter()
                .max_by(|a, b| a.version.cmp(&b.version))
                .ok_or_else(|| ErrorInfo {
                    message: format!(
                        "No available Python satisfies the script's requires-python `{spec}`; available: {}",
                        self.available_versions()
                    ),
                    hint: Some(
                        "change requires-python, or install a matching interpreter (pyenv, uv python install, or the system package manager)".into(),
                    ),
                });
        }
        self.interpreters.find(default_request).map_err(env_error)
    }

    pub(crate) fn available_versions(&self) -> String {
        let versions: Vec<String> = self
            .interpreters
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

    async fn environment(
        &self,
        interpreter: &Interpreter,
        requirements: &[pep508_rs::Requirement],
    ) -> Result<Environment, ErrorInfo> {
        let cache = self.cache.as_ref().map_err(ErrorInfo::from)?;
        // A build runs uv's install sandboxes: it holds a slot of the concurrency cap, released
        // before the run takes its own (never both at once).
        let _slot = self.sandbox_slot().await?;
        cache
            .ensure(interpreter, requirements)
            .await
            .map_err(|err| ErrorInfo {
                message: crate::describe(&err),
                hint: err.hint(),
            })
    }

    /// The sandbox policy and command of one run. Paths differ by backend: the native sandbox
    /// sees fixed paths (`/snakebox/script.py`, `/work`); `none` runs on the host's paths.
    /// `pooled`: the runner waits for the warm pool's request before it reads the script.
    pub(crate) fn sandbox_call(
        &self,
        environment: &Environment,
        run_dir: &RunDir,
        timeout: Duration,
        network: bool,
        pooled: bool,
    ) -> (Policy, SandboxCommand) {
        let script = self
            .path_inside(&run_dir.input, SANDBOX_INPUT_DIR)
            .join(SCRIPT_NAME);
        let work = self.path_inside(&run_dir.work, SANDBOX_WORK_DIR);
        let tmp = self.path_inside(&run_dir.tmp, "/tmp");
        let mut mounts = environment.mounts();
        mounts.extend(run_mounts(run_dir));
        let env = run_environment(&environment.root, &work, &tmp);
        let policy = Policy {
            mounts,
            network,
            env,
            cwd: work,
            limits: self.limits(timeout),
            identity: run_dir.identity(),
        };
        // The runner executes the script and reports on the control channel (fd 3).
        let mut args: Vec<std::ffi::OsString> = vec!["-s".into()];
        args.extend(runner_argv(&script).into_iter().map(Into::into));
        if pooled {
            args.push("--wait".into());
        }
        let command = SandboxCommand {
            program: environment.python.clone(),
            args,
            control_channel: true,
        };
        (policy, command)
    }

    /// The fork server's sandbox for `environment`: what a native run of it sees, except the
    /// run's own directories (each forked run binds those) and the network (never).
    pub(crate) fn fork_server_spec(&self, environment: &Environment) -> ForkServerSpec {
        let work = PathBuf::from(SANDBOX_WORK_DIR);
        ForkServerSpec {
            policy: Policy {
                mounts: environment.mounts(),
                network: false,
                env: run_environment(&environment.root, &work, Path::new("/tmp")),
                cwd: work.clone(),
                limits: self.limits(self.config.max_timeout),
                identity: snakebox_sandbox::Identity::Untrusted,
            },
            python: environment.python.clone(),
            module_source: crate::runner::SOURCE.to_string(),
            runs_root: server_runs_dir(&self.config.data_dir),
            mount_points: vec![PathBuf::from(SANDBOX_INPUT_DIR), work],
            concurrent_runs: self.config.max_concurrent_runs,
        }
    }

    /// One run for the fork server: the same mounts, argv and limits as a native cold run.
    fn fork_run(&self, run_dir: &RunDir, timeout: Duration) -> ForkRun {
        ForkRun {
            mounts: run_mounts(run_dir),
            limits: self.limits(timeout),
            argv: runner_argv(&PathBuf::from(SANDBOX_INPUT_DIR).join(SCRIPT_NAME)),
            cwd: PathBuf::from(SANDBOX_WORK_DIR),
        }
    }

    /// Where a sandbox command sees `host`, which its policy mounts (or its backend provides)
    /// at `dest` (see [`snakebox_sandbox::Backend::path_inside`]).
    pub(crate) fn path_inside(&self, host: &Path, dest: &str) -> PathBuf {
        match &self.sandbox {
            Ok(sandbox) => sandbox.path_inside(host, Path::new(dest)),
            Err(_) => host.to_path_buf(),
        }
    }

    pub(crate) fn limits(&self, timeout: Duration) -> Limits {
        Limits {
            wall_time: timeout,
            cpu_time: self.config.cpu_time,
            memory_bytes: self.config.memory_bytes,
            max_processes: self.config.max_processes,
            max_output_bytes: self.config.max_output_bytes,
            scratch_bytes: self.config.scratch_bytes,
            file_size_bytes: self.config.file_size_bytes,
            open_files: self.config.open_files,
            cpu_millicores: self.config.cpu_millicores,
        }
    }
}

/// The run's own directories, as the native sandbox mounts them: the inputs read-only at
/// `/snakebox`, the working directory at `/work`.
fn run_mounts(run_dir: &RunDir) -> Vec<Mount> {
    vec![
        Mount {
            host: run_dir.input.clone(),
            dest: PathBuf::from(SANDBOX_INPUT_DIR),
            writable: false,
        },
        Mount {
            host: run_dir.work.clone(),
            dest: PathBuf::from(SANDBOX_WORK_DIR),
            writable: true,
        },
    ]
}

/// The runner's arguments (after the interpreter's options) for `script`: the runner beside
/// it, the script, the control descriptor.
fn runner_argv(script: &Path) -> Vec<String> {
    let runner = script.with_file_name(crate::runner::FILE_NAME);
    vec![
        runner.to_string_lossy().into_owned(),
        script.to_string_lossy().into_owned(),
        crate::runner::CONTROL_FD.to_string(),
    ]
}

/// The complete environment of a run (one-shot or session) using the virtual environment at
/// `venv`: nothing is inherited from the server.
pub(crate) fn run_environment(venv: &Path, work: &Path, tmp: &Path) -> Vec<(String, String)> {
    let env_bin = venv.join("bin");
    vec![
        (
            "PATH".into(),
            format!("{}:/usr/local/bin:/usr/bin:/bin", env_bin.display()),
        ),
        ("VIRTUAL_ENV".into(), venv.display().to_string()),
        ("HOME".into(), work.display().to_string()),
        ("TMPDIR".into(), tmp.display().to_string()),
        ("LANG".into(), "C.UTF-8".into()),
        ("LC_ALL".into(), "C.UTF-8".into()),
        ("PYTHONUNBUFFERED".into(), "1".into()),
        ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
        ("PYTHONIOENCODING".into(), "utf-8".into()),
        ("MPLBACKEND".into(), "Agg".into()),
    ]
}

/// Map the sandbox's outcome to a status, with an explanation for the limits.
pub(crate) fn classify(
    outcome: &snakebox_sandbox::Outcome,
    config: &crate::EngineConfig,
    timeout: Duration,
) -> (Status, Option<ErrorInfo>) {
    match outcome.termination {
        Termination::TimedOut => (
            Status::Timeout,
            Some(ErrorInfo {
                message: format!(
                    "The script ran longer than its timeout of {} s and was stopped; output printed before that is kept",
                    timeout.as_secs()
                ),
                hint: Some(
                    "raise timeout_seconds (up to the server's --max-timeout) or make the script faster".into(),
                ),
            }),
        ),
        Termination::Cancelled => (
            Status::Cancelled,
            Some(ErrorInfo {
                message: "The run was cancelled by the client; output printed before that is kept"
                    .into(),
                hint: None,
            }),
        ),
        Termination::MemoryLimit => (
            Status::MemoryLimit,
            Some(ErrorInfo {
                message: format!(
                    "The script exceeded its memory limit of {} and was stopped",
                    config
                        .memory_bytes
                        .map_or_else(|| "(unset)".to_string(), human_bytes)
                ),
                hint: Some(
                    "process the data in smaller pieces, or ask the operator to raise --memory-limit".into(),
                ),
            }),
        ),
        Termination::CpuLimit => (
            Status::CpuLimit,
            Some(ErrorInfo {
                message: "The script used up its CPU-time limit and was stopped".into(),
                hint: Some("make the script do less work, or ask the operator to raise --cpu-limit".into()),
            }),
        ),
        Termination::Exited if outcome.exit_code == Some(0) => (Status::Ok, None),
        Termination::Exited => match outcome.signal {
            // A death by a signal we did not send is a crash the caller must be able to see.
            Some(signal) => (
                Status::Error,
                Some(ErrorInfo {
                    message: format!(
                        "The script was killed by {}",
                        crate::result::signal_name(signal)
                    ),
                    hint: Some(match signal {
                        6 => "the process aborted (abort(), a failed C assertion or a fatal error in native code)".into(),
                        11 | 7 => "a crash in native code (an extension module, ctypes) or a stack overflow".into(),
                        25 => "a file grew past the per-file size limit".into(),
                        31 => "a system call the sandbox forbids was attempted".into(),
                        _ => "check stderr for what the process was doing".into(),
                    }),
                }),
            ),
            None => (Status::Error, None),
        },
    }
}

/// `1073741824` → `1 GiB`.
pub(crate) fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes;
    let mut unit = 0;
    while value >= 1024 && value.is_multiple_of(1024) && unit < UNITS.len() - 1 {
        value /= 1024;
        unit += 1;
    }
    format!("{value} {}", UNITS[unit])
}

/// The host side of one run: `input/` (the script, read-only inside), `work/` (the writable
/// working directory) and `tmp/` (used by the `none` backend). Removed when dropped.
pub(crate) struct RunDir {
    root: PathBuf,
    pub(crate) input: PathBuf,
    pub(crate) work: PathBuf,
    pub(crate) tmp: PathBuf,
    /// The size cap on `work`, when one is in force.
    scratch: Option<snakebox_sandbox::ScratchDir>,
    /// Whose host uid the run's sandbox runs as (none: the sandbox's default).
    runs_as: Option<RunsAs>,
}

/// The host uid a run directory is made for.
enum RunsAs {
    /// A uid of the run's own, released after the directory is removed.
    Leased(snakebox_sandbox::IdentityLease),
    /// Another's, held elsewhere: a forked run has its fork server's.
    Borrowed(snakebox_sandbox::Identity, Option<(u32, u32)>),
}

impl RunsAs {
    fn identity(&self) -> snakebox_sandbox::Identity {
        match self {
            RunsAs::Leased(lease) => lease.identity(),
            RunsAs::Borrowed(identity, _) => *identity,
        }
    }

    fn host_ids(&self) -> Option<(u32, u32)> {
        match self {
            RunsAs::Leased(lease) => lease.host_ids(),
            RunsAs::Borrowed(_, ids) => *ids,
        }
    }
}

impl RunDir {
    /// `owner` is the host uid/gid the sandbox runs as, when it differs from ours: it gets the
    /// writable directories. Without `script` (a warm-pool run directory), the script is
    /// written later by [`RunDir::write_script`].
    pub(crate) fn create(
        data_dir: &Path,
        id: &str,
        script: Option<&str>,
        owner: Option<(u32, u32)>,
    ) -> std::io::Result<RunDir> {
        use std::os::unix::fs::PermissionsExt;
        let root = server_runs_dir(data_dir).join(id);
        let dir = RunDir {
            input: root.join("input"),
            work: root.join("work"),
            tmp: root.join("tmp"),
            root,
            scratch: None,
            runs_as: None,
        };
        for path in [&dir.input, &dir.work, &dir.tmp] {
            fs_err::create_dir_all(path)?;
        }
        fs_err::write(
            dir.input.join(crate::runner::FILE_NAME),
            crate::runner::SOURCE,
        )?;
        // The sandboxed user is unprivileged: it may read the inputs and write the working
        // directory, nothing else of ours. (The run directory itself is private to the server
        // user; only the sandbox's bind mounts expose these.)
        fs_err::set_permissions(&dir.root, std::fs::Permissions::from_mode(0o711))?;
        fs_err::set_permissions(&dir.input, std::fs::Permissions::from_mode(0o755))?;
        fs_err::set_permissions(
            dir.input.join(crate::runner::FILE_NAME),
            std::fs::Permissions::from_mode(0o644),
        )?;
        if let Some(script) = script {
            dir.write_script(script)?;
        }
        for writable in [&dir.work, &dir.tmp] {
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(writable, Some(uid), Some(gid))?;
            }
            fs_err::set_permissions(writable, std::fs::Permissions::from_mode(0o700))?;
        }
        Ok(dir)
    }

    /// Write the script into the input directory (read-only inside the sandbox).
    pub(crate) fn write_script(&self, script: &str) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let path = self.input.join(SCRIPT_NAME);
        fs_err::write(&path, script)?;
        fs_err::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
    }

    /// Create the run directory of one run of user code under a host uid of its own (see
    /// [`snakebox_sandbox::Sandbox::lease_identity`]), with its working directory capped at
    /// `scratch_bytes` when set.
    pub(crate) fn for_run(
        sandbox: &snakebox_sandbox::Sandbox,
        data_dir: &Path,
        id: &str,
        script: Option<&str>,
        scratch_bytes: Option<u64>,
    ) -> std::io::Result<RunDir> {
        let runs_as = RunsAs::Leased(sandbox.lease_identity());
        RunDir::for_uid(runs_as, data_dir, id, script, scratch_bytes)
    }

    /// Create the run directory of one run forked by `server`: it runs as the fork server's
    /// host uid (see [`snakebox_sandbox::ForkServer`]), which owns its writable directories.
    pub(crate) fn for_fork(
        server: &snakebox_sandbox::ForkServer,
        data_dir: &Path,
        id: &str,
        script: Option<&str>,
        scratch_bytes: Option<u64>,
    ) -> std::io::Result<RunDir> {
        let runs_as = RunsAs::Borrowed(server.identity(), server.host_ids());
        RunDir::for_uid(runs_as, data_dir, id, script, scratch_bytes)
    }

    fn for_uid(
        runs_as: RunsAs,
        data_dir: &Path,
        id: &str,
        script: Option<&str>,
        scratch_bytes: Option<u64>,
    ) -> std::io::Result<RunDir> {
        let owner = runs_as.host_ids();
        let mut dir = RunDir::create(data_dir, id, script, owner)?;
        dir.runs_as = Some(runs_as);
        if let Some(size) = scratch_bytes {
            dir.cap_work(size, owner).map_err(std::io::Error::other)?;
        }
        Ok(dir)
    }

    /// The identity the run's sandbox must use.
    pub(crate) fn identity(&self) -> snakebox_sandbox::Identity {
        self.runs_as
            .as_ref()
            .map_or(snakebox_sandbox::Identity::Untrusted, RunsAs::identity)
    }

    /// The host uid/gid that owns the run's writable directories, when not ours.
    pub(crate) fn owner(&self) -> Option<(u32, u32)> {
        self.runs_as.as_ref().and_then(RunsAs::host_ids)
    }

    /// Cap the working directory at `size_bytes` (a tmpfs owned by `owner`), so a run cannot
    /// fill the host disk through it. Without the privilege to mount, it stays a plain
    /// directory; `check_environment` reports whether the cap is enforced.
    pub(crate) fn cap_work(
        &mut self,
        size_bytes: u64,
        owner: Option<(u32, u32)>,
    ) -> Result<(), snakebox_sandbox::SpawnError> {
        self.scratch = Some(snakebox_sandbox::ScratchDir::cap(
            &self.work, size_bytes, owner,
        )?);
        Ok(())
    }
}

/// Where run directories live: `<data>/runs/<server pid>/<execution id>`.
pub(crate) fn runs_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("runs")
}

/// This server's run directories: `<data>/runs/<server pid>`.
pub(crate) fn server_runs_dir(data_dir: &Path) -> PathBuf {
    runs_dir(data_dir).join(std::process::id().to_string())
}

/// Whether another live server (a process other than this one) uses `data_dir`: each keeps
/// `<data>/runs/<its pid>/` while it runs.
pub(crate) fn other_live_servers(data_dir: &Path) -> bool {
    fs_err::read_dir(runs_dir(data_dir))
        .into_iter()
        .flatten()
        .flatten()
        .any(|entry| {
            entry
                .file_name()
                .to_str()
                .and_then(|name| name.parse::<u32>().ok())
                .is_some_and(|pid| {
                    pid != std::process::id() && Path::new(&format!("/proc/{pid}")).exists()
                })
        })
}

/// Remove the run directories of servers that are gone (killed before they could clean up),
/// releasing any scratch mount left in them. Directories of live servers sharing the data
/// directory are left alone.
pub(crate) fn remove_stale_run_dirs(data_dir: &Path) {
    let Ok(entries) = fs_err::read_dir(runs_dir(data_dir)) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if let Ok(runs) = fs_err::read_dir(entry.path()) {
            for run in runs.filter_map(Result::ok) {
                snakebox_sandbox::release_stale_scratch(&run.path().join("work"));
            }
        }
        // The fork server's shared mount of the whole directory, if it had one.
        snakebox_sandbox::unmount_runs_root(&entry.path());
        if let Err(err) = crate::tree::remove(&entry.path()) {
            tracing::warn!(%err, "could not remove a stale run directory");
        }
    }
}

/// Remove this server's run directories (at shutdown, after its runs ended): what a run left
/// (a scratch mount, files) and the fork server's mount of the whole directory.
pub(crate) fn remove_own_run_dirs(data_dir: &Path) {
    let dir = server_runs_dir(data_dir);
    if let Ok(runs) = fs_err::read_dir(&dir) {
        for run in runs.filter_map(Result::ok) {
            snakebox_sandbox::release_stale_scratch(&run.path().join("work"));
        }
    }
    snakebox_sandbox::unmount_runs_root(&dir);
    if dir.exists()
        && let Err(err) = crate::tree::remove(&dir)
    {
        tracing::warn!(%err, "could not remove this server's run directories");
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        // Unmount the scratch tmpfs first: its mount point cannot be removed while mounted.
        drop(self.scratch.take());
        if let Err(err) = crate::tree::remove(&self.root) {
            tracing::warn!(%err, "could not remove a run directory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::human_bytes;

    #[test]
    fn human_bytes_uses_whole_units() {
        assert_eq!(human_bytes(1024 * 1024 * 1024), "1 GiB");
        assert_eq!(human_bytes(1536), "1536 B");
        assert_eq!(human_bytes(512 * 1024 * 1024), "512 MiB");
    }
}
