//! What runs in a session's sandbox: the live interpreter (started on the first call, kept
//! between calls, stopped when a call times out, runs out of memory, is cancelled or kills
//! it) and the calls made to it (`execute_python` with a `session_id`: input files in,
//! value, names, exception, figures and artifacts out, like a one-shot run), and
//! `run_command`, a short-lived sandbox with the same view of the session.
//!
//! Kept apart from the lifecycle in [`super::manager`]: this is the per-call path. What each
//! call is held to (cell, command, the interpreter's start) is decided by
//! [`CallPolicy::decide`], as for every kind of call; the sandbox's [`Policy`] is built from
//! that decision by [`crate::run::sandbox_policy`].

use crate::Caller;
use crate::history::{RunKind, RunStart};
use crate::session::SessionRow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use snakebox_env::Interpreter;
use snakebox_sandbox::{
    ExchangeEnd, Identity, LiveSandbox, Mount, OutputChunk, Policy, SandboxCommand,
};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use super::SessionService;
use super::manager::{Manager, SessionPaths, SlotState};
use super::workspace::file_error;
use super::{
    InstallState, RUNNER_NAME, SANDBOX_INPUT_DIR, SANDBOX_WORK_DIR, SESSION_RUNNER, io_error,
    make_dir, no_session, now_secs, packages_of,
};
use crate::policy::{Asked, CallKind, CallPolicy, SessionFacts};
use crate::result::{ExecutionResult, Status};
use crate::{EngineError, ErrorKind};
use crate::{ExecuteRequest, ids};

impl SessionService {
    /// Run code in a session's live interpreter (started first when there is none).
    /// Refused while the server stops; cut short by the stop, it is `cancelled` and says so.
    pub(crate) async fn execute_in_session(
        &self,
        caller: &Caller,
        session_id: &str,
        request: ExecuteRequest,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> ExecutionResult {
        // The session's row, read once: for the run's record (its profile) and the call.
        let row = self
            .session_manager()
            .and_then(|manager| manager.row(caller, session_id));
        let start = RunStart {
            kind: RunKind::SessionCell,
            session_id: Some(session_id.to_owned()),
            script: request.script.clone(),
            dependencies: request.dependencies.clone(),
            profile: row.as_ref().ok().map(SessionRow::profile_name),
        };
        self.calls
            .tracked(
                caller,
                start,
                &cancel,
                |id, error| refused(id, session_id, error),
                |id, token| {
                    let output = self.calls.live_tee(&id, output);
                    self.execute_in_session_admitted(
                        caller, id, session_id, row, request, token, output,
                    )
                },
            )
            .await
    }

    /// The cell once admitted, in stages, as a one-shot run's: its plan (checks and
    /// policy), its dependencies, its workspace's baseline, its interpreter, the exchange,
    /// its result. A stage that refuses answers with a record that says why.
    #[expect(
        clippy::too_many_arguments,
        reason = "the public call's arguments plus its id and the session's row, passed through as they are"
    )]
    async fn execute_in_session_admitted(
        &self,
        caller: &Caller,
        execution_id: String,
        session_id: &str,
        row: Result<SessionRow, EngineError>,
        request: ExecuteRequest,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> ExecutionResult {
        let fail = |error| not_run(&execution_id, session_id, None, error);
        let manager = match self.session_manager() {
            Ok(manager) => manager,
            Err(error) => return fail(error),
        };
        let row = match row {
            Ok(row) => row,
            Err(error) => return fail(error),
        };
        // From here every result names the session's profile, as a one-shot run's does.
        let profile_name = row.profile_name();
        let fail = |error| not_run(&execution_id, session_id, Some(&profile_name), error);
        let tenant = self.calls.tenant(caller);
        let CellPlan {
            policy,
            inputs,
            requirements,
        } = match self.plan_cell(&row, &tenant, &request) {
            Ok(plan) => plan,
            Err(refusal) => return refused_by(fail(refusal.error), refusal.profile),
        };
        let mut notes = policy.notes.clone();
        let setup_started = std::time::Instant::now();
        if let Err((error, install_error)) = self
            .install_dependencies(caller, session_id, &requirements)
            .await
        {
            let mut result = fail(error);
            result.error = install_error.or(result.error);
            return result;
        }
        let interpreter = match self.session_interpreter(&row) {
            Ok(interpreter) => interpreter.clone(),
            Err(error) => return fail(error),
        };
        let slot = manager.slot(&row);
        let doomed = doomed_of(&slot);
        let mut state = slot.state.lock().await;
        if state.deleted || doomed.is_cancelled() {
            return fail(no_session(session_id));
        }
        let (work, baseline) = match self
            .cell_baseline(caller, manager, &row, &mut state, inputs)
            .await
        {
            Ok(prepared) => prepared,
            Err(error) => return fail(error),
        };
        let run_slot = match self.calls.sandbox_slot(caller, &cancel).await {
            Ok(slot) => slot,
            Err(error) => return fail(error),
        };
        slot.last_used.store(now_secs(), Ordering::Relaxed);
        let fresh = match self
            .ensure_interpreter(caller, manager, &row, &interpreter, &tenant, &mut state)
            .await
        {
            Ok(fresh) => fresh,
            Err(error) => return fail(error),
        };
        if fresh && let Some(reason) = state.lost.take() {
            notes.push(format!(
                "A new interpreter was started for this session because {reason}: variables, imports and functions from earlier calls are gone; files in the workspace and installed packages remain"
            ));
        }
        let setup_ms = ids::millis(setup_started.elapsed());

        // The call, cancelled by the client or by a delete/reset of the session.
        let (call, watcher) = call_token(&doomed, cancel);
        let exchange = exchange_cell(
            &mut state,
            &request.script,
            policy.timeout(),
            run_slot.cpu(),
            call,
            output,
        )
        .await;
        watcher.abort();

        let mut result = ExecutionResult::new(execution_id.clone(), Status::Ok);
        result.session_id = Some(session_id.to_owned());
        result.profile = Some(policy.profile.clone());
        result.fresh_interpreter = fresh;
        result.python_version = Some(row.python_version.clone());
        result.resolved_dependencies = packages_now(manager, &row, !requirements.is_empty());
        result.requested_dependencies = requirements;
        result.environment_reused = true;
        result.timeout_seconds = policy.timeout().as_secs();
        result.setup_ms = setup_ms;
        result.notes = notes;
        result.network_log = crate::network::take_log_of(state.proxy.as_ref());
        let answer = match exchange {
            Ok(exchange) => record_exchange(&mut result, &mut state, exchange, &policy).await,
            Err(error) => {
                result.status = Status::SetupFailed;
                result.error = Some(error.into());
                return result;
            }
        };
        // Value, names, exception and figures from the record; files the call created or
        // changed in the workspace as artifacts (also after a timeout or a crash), exactly as
        // for a one-shot run; the session's size and use recorded.
        let (rich, known) = self
            .finish_cell(
                caller,
                manager,
                &row.id,
                &execution_id,
                work,
                baseline,
                &answer,
            )
            .await;
        state.known_files = known;
        drop(state);
        rich.apply(&mut result);
        policy.note_if_offline(&self.config, &mut result, offline(&row));
        result.notes.extend(manager.disk_note(&row.owner));
        result
    }

    /// The cell's plan: the checks of every execution (the script parsed once), then its
    /// policy: its session's profile, limits, network and imports (a cell cannot change
    /// them: refused, not ignored), its own time, its dependencies held to the profile.
    fn plan_cell(
        &self,
        row: &SessionRow,
        tenant: &crate::Tenant,
        request: &ExecuteRequest,
    ) -> Result<CellPlan, crate::policy::Refusal> {
        let checked =
            self.planner
                .check_request(request)
                .map_err(|error| crate::policy::Refusal {
                    error,
                    profile: None,
                })?;
        let policy = CallPolicy::decide(
            &self.config,
            CallKind::Cell(&session_facts(row)),
            tenant,
            &Asked::of(request, &checked.requirements),
        )?;
        Ok(CellPlan {
            inputs: checked.inputs,
            requirements: checked
                .requirements
                .iter()
                .chain(&policy.inferred)
                .map(ToString::to_string)
                .collect(),
            policy,
        })
    }

    /// Install a cell's dependencies (argument or PEP 723 block) into its session first.
    /// A failed install: its error, and the install's own account of it.
    async fn install_dependencies(
        &self,
        caller: &Caller,
        session_id: &str,
        requirements: &[String],
    ) -> Result<(), (EngineError, Option<crate::result::ErrorInfo>)> {
        if requirements.is_empty() {
            return Ok(());
        }
        match self
            .install_packages(caller, session_id, requirements.to_vec(), None, None)
            .await
        {
            Ok(status) if status.state == InstallState::Succeeded => Ok(()),
            Ok(status) => Err((
                EngineError::new(ErrorKind::Failed, "Installing the dependencies failed"),
                status.error,
            )),
            Err(error) => Err((error, None)),
        }
    }

    /// The session's disk checked, the input files written, then what the workspace holds
    /// before the call (only what the call creates or changes becomes an artifact): its
    /// working directory and that baseline. Without input files, and when nothing but the
    /// session's cells wrote the workspace since, that is what the last cell's collection saw
    /// (see `SlotState::known_files`): no walk.
    async fn cell_baseline(
        &self,
        caller: &Caller,
        manager: &Manager,
        row: &SessionRow,
        state: &mut SlotState,
        inputs: Vec<crate::files::DecodedFile>,
    ) -> Result<(PathBuf, crate::artifacts::Baseline), EngineError> {
        manager.check_disk(&row.owner)?;
        let work = manager.paths(row)?.work;
        let known = state.known_files.take();
        let baseline = match known {
            Some(known) if inputs.is_empty() => known,
            _ => {
                let owner = self
                    .session_sandbox()
                    .ok()
                    .and_then(|sandbox| sandbox.host_ids(Identity::Untrusted));
                let work = work.clone();
                self.calls
                    .on_host(caller, "write the input files", move || {
                        write_inputs(&work, &inputs, owner)
                            .map(|()| crate::artifacts::Baseline::snapshot(&work))
                    })
                    .await??
            }
        };
        Ok((work, baseline))
    }

    /// The session's interpreter: the one still running, or a new one (`true`: started
    /// now; `state.lost` says what an earlier one lost, when it did).
    async fn ensure_interpreter(
        &self,
        caller: &Caller,
        manager: &Manager,
        row: &SessionRow,
        interpreter: &Interpreter,
        tenant: &crate::Tenant,
        state: &mut SlotState,
    ) -> Result<bool, EngineError> {
        if state
            .interpreter
            .as_mut()
            .is_some_and(LiveSandbox::is_alive)
        {
            return Ok(false);
        }
        if state.interpreter.is_some() {
            state.interpreter = None;
            if state.cells_in_interpreter > 0 {
                state.lost = Some("the interpreter exited between calls".into());
            }
        }
        // A start, with the stops that make room for it, is the server's work for this
        // tenant: the fork of a sandbox and the teardown of another, much of it in no
        // cgroup the tenant's CPU share weighs. It holds one of the tenant's part of the
        // host-work slots, so one tenant churning through more sessions than may run at
        // once starts them a few at a time, not every one of its calls at once beside
        // another tenant's run (issue 32, item 1).
        let host = self.calls.host.hold(caller).await?;
        manager.make_room(&row.id, &row.owner).await;
        self.ensure_session_proxy(manager, row, &mut state.proxy)?;
        // Writing its files and forking its sandbox block this thread for milliseconds:
        // off the runtime worker's queue, as for every start of one tenant's churn.
        let started =
            crate::off_the_runtime(|| self.start_interpreter(manager, row, interpreter, tenant));
        drop(host);
        state.interpreter = Some(started?);
        state.cells_in_interpreter = 0;
        Ok(true)
    }

    /// After a cell, in one blocking task (one hand-over to a blocking thread and back): the
    /// runner's record, the cell's artifacts, what the workspace holds now (the next cell's
    /// baseline; `None` when it could not be taken), and the session's measure and use
    /// written to its row.
    #[expect(
        clippy::too_many_arguments,
        reason = "what the cell's end needs, each passed once"
    )]
    async fn finish_cell(
        &self,
        caller: &Caller,
        manager: &Arc<Manager>,
        session_id: &str,
        execution_id: &str,
        work: PathBuf,
        baseline: crate::artifacts::Baseline,
        answer: &[u8],
    ) -> (crate::runner::Rich, Option<crate::artifacts::Baseline>) {
        let (mut rich, images) = crate::runner::Rich::read(answer);
        let store = self.artifacts.clone();
        let manager = Arc::clone(manager);
        let (caller, execution_id, session_id) = (
            caller.clone(),
            execution_id.to_owned(),
            session_id.to_owned(),
        );
        let who = caller.clone();
        let finished = self
            .calls
            .on_host(&who, "collect the cell's files", move || {
                let collected =
                    store.collect_and_fingerprint(&caller, &execution_id, &work, &baseline, images);
                manager.measure(&session_id, true);
                collected
            })
            .await;
        match finished {
            Ok((collection, known)) => {
                rich.collected(collection);
                (rich, Some(known))
            }
            Err(err) => {
                rich.note(format!("the run's files could not be collected: {err}"));
                (rich, None)
            }
        }
    }

    /// The sandbox policy of a session's sandboxes (its interpreter and its commands) over
    /// its workspace, held to `shape` (see [`crate::run::sandbox_policy`]); and where the
    /// runner is inside it.
    pub(super) fn session_policy(
        &self,
        network: crate::run::RunNetwork,
        paths: &SessionPaths,
        interpreter: &Interpreter,
        shape: &crate::run::RunShape,
    ) -> (Policy, PathBuf) {
        let work = self.sandboxes.path_inside(&paths.work, SANDBOX_WORK_DIR);
        let tmp = self.sandboxes.path_inside(&paths.tmp, "/tmp");
        let runner = self
            .sandboxes
            .path_inside(&paths.input, SANDBOX_INPUT_DIR)
            .join(RUNNER_NAME);
        let mut mounts = vec![
            Mount {
                host: paths.venv.clone(),
                dest: paths.venv.clone(),
                writable: false,
            },
            Mount {
                host: interpreter.prefix.clone(),
                dest: interpreter.prefix.clone(),
                writable: false,
            },
        ];
        if let Some(bin) = interpreter.executable.parent()
            && !bin.starts_with(&interpreter.prefix)
        {
            mounts.push(Mount {
                host: bin.to_path_buf(),
                dest: bin.to_path_buf(),
                writable: false,
            });
        }
        mounts.push(Mount {
            host: paths.input.clone(),
            dest: PathBuf::from(SANDBOX_INPUT_DIR),
            writable: false,
        });
        // Read-only under a profile that says so: the server still writes it (inputs,
        // uploads, installs go elsewhere), the session's code cannot.
        mounts.push(Mount {
            host: paths.work.clone(),
            dest: PathBuf::from(SANDBOX_WORK_DIR),
            writable: shape.writable_work,
        });
        let view = crate::run::View {
            mounts,
            env: crate::run::run_environment(&paths.venv, &work, &tmp),
            cwd: work,
            identity: Identity::Untrusted,
        };
        (
            crate::run::sandbox_policy(view, &shape.limits, network),
            runner,
        )
    }

    /// Start the session's interpreter, under the policy of its kind (see
    /// [`CallKind::Interpreter`]): its session's profile's limits, exec policy, `/work` and
    /// imports, for the server's longest call.
    pub(super) fn start_interpreter(
        &self,
        manager: &Manager,
        row: &SessionRow,
        interpreter: &Interpreter,
        tenant: &crate::Tenant,
    ) -> Result<LiveSandbox, EngineError> {
        let sandbox = self.session_sandbox()?;
        let paths = manager.paths(row)?;
        let runner_path = paths.input.join(RUNNER_NAME);
        let decided = CallPolicy::decide(
            &self.config,
            CallKind::Interpreter(&session_facts(row)),
            tenant,
            &Asked::default(),
        )
        .map_err(|refusal| refusal.error)?;
        let shape = &decided.shape;
        let deny_path = paths.input.join(crate::run::EXEC_DENY_NAME);
        let policy_path = paths.input.join(crate::runner::IMPORT_POLICY_FILE);
        // The profile's exec-deny program and import policy, beside the runner (read-only
        // to the session), the same files a one-shot run gets.
        let program = if shape.deny_exec {
            Some(snakebox_sandbox::exec_deny_program().map_err(|err| {
                EngineError::internal(
                    format!(
                        "Failed to prepare the session's exec-deny program: {}",
                        crate::describe(&err)
                    ),
                    "create the session under a profile that allows subprocesses, or report this to the operator",
                )
            })?)
        } else {
            None
        };
        (|| -> std::io::Result<()> {
            use std::os::unix::fs::PermissionsExt;
            make_dir(&paths.input, 0o755, None)?;
            make_dir(&paths.tmp, 0o700, sandbox.host_ids(Identity::Untrusted))?;
            fs_err::write(&runner_path, SESSION_RUNNER)?;
            fs_err::set_permissions(&runner_path, std::fs::Permissions::from_mode(0o644))?;
            // The one-shot runner: the session runner imports its execution core.
            let core = paths.input.join(crate::runner::FILE_NAME);
            fs_err::write(&core, crate::runner::SOURCE)?;
            fs_err::set_permissions(&core, std::fs::Permissions::from_mode(0o644))?;
            match &program {
                Some(program) => {
                    fs_err::write(&deny_path, program)?;
                    fs_err::set_permissions(&deny_path, std::fs::Permissions::from_mode(0o444))?;
                }
                None => remove_if_present(&deny_path)?,
            }
            match &decided.imports {
                Some(allowed) => {
                    let policy = serde_json::json!({ "allowed": allowed });
                    fs_err::write(&policy_path, policy.to_string())?;
                    fs_err::set_permissions(&policy_path, std::fs::Permissions::from_mode(0o644))
                }
                None => remove_if_present(&policy_path),
            }
        })()
        .map_err(|err| io_error("write the session runner", &err))?;
        let network = self.sandboxes.run_network(decided.network.is_some());
        let (policy, runner) = self.session_policy(network, &paths, interpreter, shape);
        let mut args: Vec<std::ffi::OsString> = vec!["-s".into()];
        if shape.deny_exec {
            // As a one-shot run: the environment's .pth code runs only after the program
            // (`--site`), so none of it runs with exec allowed.
            args.push("-S".into());
        }
        args.push(runner.clone().into_os_string());
        if shape.deny_exec {
            args.push("--deny-exec".into());
            args.push(
                runner
                    .with_file_name(crate::run::EXEC_DENY_NAME)
                    .into_os_string(),
            );
            args.push("--site".into());
        }
        if network == crate::run::RunNetwork::Proxy {
            args.extend(crate::run::proxy_args().into_iter().map(Into::into));
        }
        let command = SandboxCommand {
            program: paths.venv.join("bin").join("python"),
            args,
            control_channel: true,
            init: true,
        };
        sandbox
            .spawn(&policy, &command)
            .map_err(|err| EngineError::context("Failed to start the session's interpreter", &err))
    }

    /// Run a shell command in a sandbox over the session's workspace and environment (a
    /// separate short-lived sandbox with the same view and limits as the interpreter's).
    /// Refused while the server stops; cut short by the stop, it is `cancelled` and says so.
    pub(crate) async fn run_command(
        &self,
        caller: &Caller,
        session_id: &str,
        command: &str,
        timeout_seconds: Option<f64>,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> ExecutionResult {
        let start = RunStart {
            kind: RunKind::Command,
            session_id: Some(session_id.to_owned()),
            script: command.to_owned(),
            dependencies: Vec::new(),
            profile: self.profile_of_session(caller, session_id),
        };
        self.calls
            .tracked(
                caller,
                start,
                &cancel,
                |id, error| refused(id, session_id, error),
                |id, token| {
                    let output = self.calls.live_tee(&id, output);
                    self.run_command_admitted(
                        caller,
                        id,
                        session_id,
                        command,
                        timeout_seconds,
                        token,
                        output,
                    )
                },
            )
            .await
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "the public call's arguments plus its id, passed through as they are"
    )]
    async fn run_command_admitted(
        &self,
        caller: &Caller,
        execution_id: String,
        session_id: &str,
        command: &str,
        timeout_seconds: Option<f64>,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> ExecutionResult {
        let fail = |error| not_run(&execution_id, session_id, None, error);
        let manager = match self.session_manager() {
            Ok(manager) => manager,
            Err(error) => return fail(error),
        };
        let row = match manager.row(caller, session_id) {
            Ok(row) => row,
            Err(error) => return fail(error),
        };
        // From here every result names the session's profile, as a one-shot run's does.
        let profile_name = row.profile_name();
        let fail = |error| not_run(&execution_id, session_id, Some(&profile_name), error);
        if command.trim().is_empty() || command.contains('\0') || command.len() > 64 * 1024 {
            return fail(EngineError::invalid(
                "The command must be non-empty text without NUL characters, at most 64 KiB",
                "for example \"ls -la\" or \"python -m pip list\"",
            ));
        }
        // The session's interpreter's view and limits; its own time, held to its session's
        // profile as a cell's is.
        let policy = match CallPolicy::decide(
            &self.config,
            CallKind::Command(&session_facts(&row)),
            &self.calls.tenant(caller),
            &Asked {
                timeout_seconds,
                ..Asked::default()
            },
        ) {
            Ok(policy) => policy,
            Err(refusal) => return refused_by(fail(refusal.error), refusal.profile),
        };
        let interpreter = match self.session_interpreter(&row) {
            Ok(interpreter) => interpreter.clone(),
            Err(error) => return fail(error),
        };
        let sandbox = match self.session_sandbox() {
            Ok(sandbox) => Arc::clone(sandbox),
            Err(error) => return fail(error),
        };
        let slot = manager.slot(&row);
        let doomed = doomed_of(&slot);
        let mut state = slot.state.lock().await;
        if state.deleted || doomed.is_cancelled() {
            return fail(no_session(session_id));
        }
        if let Err(error) = self.ensure_session_proxy(manager, &row, &mut state.proxy) {
            return fail(error);
        }
        if let Err(error) = manager.check_disk(&row.owner) {
            return fail(error);
        }
        // The command may write the workspace: the next cell's baseline is taken afresh.
        state.known_files = None;
        let run_slot = match self.calls.sandbox_slot(caller, &cancel).await {
            Ok(slot) => slot,
            Err(error) => return fail(error),
        };
        slot.last_used.store(now_secs(), Ordering::Relaxed);
        let paths = match manager.paths(&row) {
            Ok(paths) => paths,
            Err(error) => return fail(error),
        };
        let network = self.sandboxes.run_network(policy.network.is_some());
        let (mut sandbox_policy, _) =
            self.session_policy(network, &paths, &interpreter, &policy.shape);
        let mut shell = SandboxCommand {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), command.into()],
            control_channel: false,
            init: false,
        };
        if network == crate::run::RunNetwork::Proxy {
            // The shell has no runner: an isolated interpreter starts the same bridge first.
            shell = snakebox_sandbox::bridged_command(
                &paths.venv.join("bin").join("python"),
                &PathBuf::from(SANDBOX_INPUT_DIR).join(snakebox_sandbox::SOCKET_NAME),
                &shell,
            );
            sandbox_policy.env.extend(snakebox_sandbox::run_proxy_env());
        }
        sandbox_policy.cpu = run_slot.cpu().cloned();
        let (call, watcher) = call_token(&doomed, cancel);
        let outcome = sandbox.run(&sandbox_policy, &shell, call, output).await;
        watcher.abort();
        let network_log = crate::network::take_log_of(state.proxy.as_ref());
        drop(state);
        manager.used(&self.calls, caller, &row.id, false).await;
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(err) => return fail(err.into()),
        };
        let (status, error) = crate::run::classify(
            &outcome,
            crate::run::Ran::Command,
            &policy.shape.limits,
            policy.timeout(),
        );
        let mut result = ExecutionResult::new(execution_id.clone(), status);
        result.session_id = Some(session_id.to_owned());
        result.profile = Some(policy.profile.clone());
        result.record_outcome(outcome);
        result.timeout_seconds = policy.timeout().as_secs();
        result.python_version = Some(row.python_version.clone());
        result.resolved_dependencies = packages_of(&row);
        result.environment_reused = true;
        result.error = error;
        result.notes.clone_from(&policy.notes);
        result.network_log = network_log;
        policy.note_if_offline(&self.config, &mut result, offline(&row));
        result.notes.extend(manager.disk_note(&row.owner));
        result
    }

    /// The name of the profile of `session_id` (as the caller may see it), for the run's
    /// history and audit line; `None` when there is no such session.
    fn profile_of_session(&self, caller: &Caller, session_id: &str) -> Option<String> {
        let row = self.session_manager().ok()?.row(caller, session_id).ok()?;
        Some(row.profile_name())
    }

    /// Start the session's proxy when it has network through one and has none running.
    fn ensure_session_proxy(
        &self,
        manager: &Manager,
        row: &SessionRow,
        proxy: &mut Option<snakebox_sandbox::RunProxy>,
    ) -> Result<(), EngineError> {
        let network = self.sandboxes.run_network(self.session_network(row));
        if network != crate::run::RunNetwork::Proxy || proxy.is_some() {
            return Ok(());
        }
        let Some(names) = self.session_names(row) else {
            return Ok(());
        };
        let paths = manager.paths(row)?;
        make_dir(&paths.input, 0o755, None)
            .map_err(|err| io_error("create the session's input directory", &err))?;
        *proxy = Some(self.proxies.start_run_proxy(&paths.input, names)?);
        Ok(())
    }
}

/// The token that cancels a session's running calls when it is deleted or reset.
fn doomed_of(slot: &super::manager::Slot) -> CancellationToken {
    slot.doomed
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// A call's token, cancelled by the client (`cancel`) or by a delete or reset of the session
/// (`doomed`); and the watcher to abort once the call is over.
fn call_token(
    doomed: &CancellationToken,
    cancel: CancellationToken,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let call = doomed.child_token();
    let watcher = {
        let call = call.clone();
        tokio::spawn(async move {
            cancel.cancelled().await;
            call.cancel();
        })
    };
    (call, watcher)
}

/// The session's packages after a call: the row read at the start is current unless the
/// call `installed` something.
fn packages_now(manager: &Manager, row: &SessionRow, installed: bool) -> Vec<crate::Package> {
    if !installed {
        return packages_of(row);
    }
    manager
        .store
        .get(&row.id)
        .ok()
        .flatten()
        .map(|r| packages_of(&r))
        .unwrap_or_default()
}

/// A cell's plan: its policy, its input files, its dependencies (requirement strings).
struct CellPlan {
    policy: CallPolicy,
    inputs: Vec<crate::files::DecodedFile>,
    requirements: Vec<String>,
}

/// Send `script` to the session's live interpreter as cell number `state.cells + 1` and
/// wait for its answer (its end marker), for at most `timeout`; the cell counted. The
/// interpreter weighs on the CPU as the call's slot (`cpu`) says for this call only (a new
/// one's start included); between calls it waits at the background weight.
async fn exchange_cell(
    state: &mut SlotState,
    script: &str,
    timeout: Duration,
    cpu: Option<&snakebox_sandbox::CpuShare>,
    call: CancellationToken,
    output: Option<UnboundedSender<OutputChunk>>,
) -> Result<snakebox_sandbox::Exchange, EngineError> {
    let cell = state.cells + 1;
    let marker = format!("\x1esnakebox-end-{}\x1e", ids::execution_id());
    let request_line = serde_json::json!({
        "code": script,
        "marker": marker,
        "cell": cell,
    })
    .to_string()
        + "\n";
    let Some(live) = state.interpreter.as_mut() else {
        return Err(EngineError::new(
            ErrorKind::Internal,
            "The session's interpreter could not be started",
        ));
    };
    let weighed = cpu.map(|share| live.attach_cpu(share));
    let exchange = live
        .exchange(
            request_line.as_bytes(),
            marker.as_bytes(),
            timeout,
            call,
            output,
        )
        .await;
    drop(weighed);
    state.cells = cell;
    state.cells_in_interpreter += 1;
    match exchange {
        Ok(exchange) => Ok(exchange),
        Err(err) => {
            state.stop("the interpreter failed").await;
            Err(err.into())
        }
    }
}

/// The cell's exchange on its result: output, status and message (the run's own limits
/// named, see [`crate::run::describe`]), exit code; an end other than an answer stops the
/// interpreter, and says why to the next call. The runner's record, for the rest.
async fn record_exchange(
    result: &mut ExecutionResult,
    state: &mut SlotState,
    exchange: snakebox_sandbox::Exchange,
    policy: &CallPolicy,
) -> Vec<u8> {
    result.duration_ms = ids::millis(exchange.duration);
    result.stdout_truncated = exchange.stdout.truncated;
    result.stderr_truncated = exchange.stderr.truncated;
    result.stdout = exchange.stdout.text;
    result.stderr = exchange.stderr.text;
    let code = record_exit_code(&exchange.answer);
    let ending =
        crate::run::Ending::of_exchange(&exchange.end, code, exchange.exit_code, exchange.signal);
    let (status, error) = crate::run::describe(
        ending,
        crate::run::Ran::Cell,
        policy.shape.limits.memory_bytes,
        policy.timeout(),
    );
    result.status = status;
    result.error = error;
    match exchange.end {
        ExchangeEnd::Answered => result.exit_code = Some(code),
        ExchangeEnd::TimedOut => {
            state.stop("the previous call timed out").await;
            result.timed_out = true;
        }
        ExchangeEnd::Cancelled => state.stop("the previous call was cancelled").await,
        ExchangeEnd::MemoryLimit => state.stop("the previous call ran out of memory").await,
        ExchangeEnd::Exited => {
            state
                .stop("the interpreter exited during the previous call")
                .await;
            result.exit_code = exchange.exit_code;
            result.signal = exchange.signal;
        }
    }
    exchange.answer
}

/// The exit code a cell's record reports (`exit()`, an exception); 1 when the record is
/// unreadable. Forgeable by the cell's code, and by earlier cells of the same session that
/// tamper with the runner's private references (SECURITY.md, S-04): either way only this
/// session's own results change.
pub(super) fn record_exit_code(answer: &[u8]) -> i32 {
    serde_json::from_slice::<serde_json::Value>(answer)
        .ok()
        .map_or(Some(1), |record| {
            record
                .get("exit_code")
                .and_then(serde_json::Value::as_i64)
                .and_then(|c| i32::try_from(c).ok())
        })
        .unwrap_or(0)
}
/// Write a call's input files (checked by [`crate::files::decode`]) into the workspace,
/// owned by the sandbox user, through the confined walk of the file tools.
pub(super) fn write_inputs(
    work: &Path,
    inputs: &[crate::files::DecodedFile],
    owner: Option<(u32, u32)>,
) -> Result<(), EngineError> {
    for input in inputs {
        let path = input.path.to_string();
        snakebox_fs::write(work, &input.path, &input.bytes, owner).map_err(|err| {
            let mut error = file_error(err);
            error.message = format!(
                "Input file `{path}` could not be written: {}",
                error.message
            );
            error
        })?;
    }
    Ok(())
}

/// Remove a file left by an earlier interpreter of the session, if there is one.
fn remove_if_present(path: &Path) -> std::io::Result<()> {
    match fs_err::remove_file(path) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => Err(err),
        _ => Ok(()),
    }
}

/// What a session brings to the policy of a call made in it.
/// What a session's call ran without, for [`CallPolicy::note_if_offline`](crate::policy::CallPolicy::note_if_offline).
fn offline(row: &SessionRow) -> crate::policy::Offline<'_> {
    crate::policy::Offline::Session {
        id: &row.id,
        created_with_network: row.network,
    }
}

pub(super) fn session_facts(row: &SessionRow) -> SessionFacts {
    SessionFacts {
        id: row.id.clone(),
        profile: row.profile_name(),
        network: row.network,
        network_names: row.network_names.clone(),
        python_version: row.python_version.clone(),
        packages: row.packages.iter().map(|(name, _)| name.clone()).collect(),
    }
}

/// A call's result refused by policy: when the refusal is its profile's (`profile`), a
/// `policy_refused` event says so, as for a one-shot run.
fn refused_by(mut result: ExecutionResult, profile: Option<String>) -> ExecutionResult {
    if let Some(profile) = profile {
        crate::profiles::refused(&mut result, &profile);
    }
    result
}

/// The record of a session call made while the server stops.
fn refused(execution_id: String, session_id: &str, error: EngineError) -> ExecutionResult {
    let mut result = ExecutionResult::not_run(execution_id, error);
    result.session_id = Some(session_id.to_owned());
    result
}

/// The result of a session call that did not run: its session and, once the session's row
/// is read, its profile (as a one-shot run's result names it).
fn not_run(
    execution_id: &str,
    session_id: &str,
    profile: Option<&str>,
    error: EngineError,
) -> ExecutionResult {
    let mut result = ExecutionResult::not_run(execution_id.to_owned(), error);
    result.session_id = Some(session_id.to_owned());
    result.profile = profile.map(str::to_owned);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_gives_the_exit_code() {
        assert_eq!(record_exit_code(br#"{"value":null,"exit_code":0}"#), 0);
        assert_eq!(record_exit_code(br#"{"exception":{},"exit_code":1}"#), 1);
        assert_eq!(record_exit_code(br#"{"exit_code":3}"#), 3);
        assert_eq!(record_exit_code(b"not json"), 1);
    }
}
