//! One-shot executions: plan (see [`crate::plan`]), prepare the cached environment, launch
//! (forked from the environment's fork server, a pre-started sandbox of the warm pool, or
//! cold), collect, and turn the outcome into an [`ExecutionResult`].

use std::time::{Duration, Instant};

use snakebox_env::{Environment, Interpreter};
use snakebox_sandbox::OutputChunk;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::history::{RunKind, RunStart};
use crate::ids;
use crate::plan::ExecuteRequest;
use crate::result::{ExecutionResult, Package};
use crate::run::{RunDir, classify};
use crate::{Engine, EngineError, ErrorKind};

/// What planning decided: everything needed to prepare and run.
struct Plan {
    interpreter: Interpreter,
    requirements: Vec<pep508_rs::Requirement>,
    timeout: Duration,
    notes: Vec<String>,
    inputs: Vec<crate::files::DecodedFile>,
    /// The names the run may reach (`None`: no network).
    network: Option<snakebox_sandbox::Names>,
    /// Its profile's name and what that changes in the sandbox.
    profile: String,
    shape: crate::run::RunShape,
    /// The import policy (the call's narrowing of the profile's, or the profile's).
    imports: Option<Vec<String>>,
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
        if let Some(session_id) = request.session_id.clone() {
            return self
                .execute_in_session(caller, &session_id, request, cancel, output)
                .await;
        }
        let start = RunStart {
            kind: RunKind::Execute,
            session_id: None,
            script: request.script.clone(),
            dependencies: request.dependencies.clone(),
            profile: Some(
                request
                    .profile
                    .clone()
                    .unwrap_or_else(|| self.config.profiles.default_for(caller).to_owned()),
            ),
        };
        self.tracked(
            caller,
            start,
            &cancel,
            ExecutionResult::not_run,
            |id, token| {
                let output = self.live_tee(&id, output);
                self.execute_admitted(caller, id, request, token, output)
            },
        )
        .await
    }

    async fn execute_admitted(
        &self,
        caller: &crate::Caller,
        execution_id: String,
        request: ExecuteRequest,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> ExecutionResult {
        // With `python_downloads = "automatic"`, a version this host lacks is fetched first
        // (a malformed script is left to the plan to report).
        let requires_python = snakebox_script::parse(&request.script)
            .ok()
            .flatten()
            .and_then(|block| block.metadata.requires_python);
        let provided = tokio::select! {
            provided = self.provide_python(request.python_version.as_deref(), requires_python.as_ref()) => provided,
            () = cancel.cancelled() => Err(EngineError::new(
                ErrorKind::Cancelled,
                "The call was cancelled while its Python was being downloaded",
            )),
        };
        if let Err(error) = provided {
            return ExecutionResult::not_run(execution_id, error);
        }
        let plan = match self.plan(caller, &request) {
            Ok(plan) => plan,
            Err((error, profile)) => {
                let mut result = ExecutionResult::not_run(execution_id, error);
                if let Some(profile) = profile {
                    crate::profiles::refused(&mut result, &profile);
                }
                return result;
            }
        };
        let requested: Vec<String> = plan.requirements.iter().map(ToString::to_string).collect();
        let timeout_seconds = plan.timeout.as_secs();
        let with_plan = |mut result: ExecutionResult| {
            result.python_version = Some(plan.interpreter.version.to_string());
            result.requested_dependencies.clone_from(&requested);
            result.timeout_seconds = timeout_seconds;
            result.notes.clone_from(&plan.notes);
            result.profile = Some(plan.profile.clone());
            result
        };

        let sandbox = match &self.sandbox {
            Ok(sandbox) => sandbox,
            Err(missing) => {
                return with_plan(ExecutionResult::not_run(execution_id, missing.clone()));
            }
        };
        let setup_started = Instant::now();
        // A cancel (the caller's, or the server stopping) ends the setup too: dropping it
        // kills its sandboxes and uv processes and removes its build directory.
        let prepared = tokio::select! {
            prepared = self.environment(caller, &plan.interpreter, &plan.requirements) => prepared,
            () = cancel.cancelled() => {
                return with_plan(ExecutionResult::not_run(
                    execution_id,
                    EngineError::new(
                        ErrorKind::Cancelled,
                        "The call was cancelled while its environment was being prepared",
                    ),
                ));
            }
        };
        let environment = match prepared {
            Ok(environment) => environment,
            Err(error) => return with_plan(ExecutionResult::not_run(execution_id, error)),
        };
        // A new environment published before its bytecode: compiled once this call ends.
        let _compile_after = self.compile_after(&environment);
        let setup_ms = ids::millis(setup_started.elapsed());
        // The import policy, checked before the run: each import of the script's own code
        // outside it is refused with its line (the runner guards the dynamic ones too).
        if let Some(allowed) = &plan.imports {
            match self
                .imports_outside(caller, &plan.interpreter, &request.script, allowed)
                .await
            {
                Ok(blocked) if blocked.is_empty() => {}
                Ok(blocked) => {
                    let listed: Vec<String> = blocked
                        .iter()
                        .map(|(module, line)| format!("`{module}` (line {line})"))
                        .collect();
                    // Whose policy it is: the call's `allowed_imports`, or its profile's alone.
                    let (whose, hint) = if request.allowed_imports.is_some() {
                        (
                            "allowed_imports does".to_owned(),
                            "remove those imports, or add them to allowed_imports (validate_script lists every import with its line; check_environment lists what each profile allows)".to_owned(),
                        )
                    } else {
                        (
                            format!("the profile `{}`'s import policy does", plan.profile),
                            "remove those imports, or name a profile whose import policy allows them with `profile` (check_environment lists what each profile allows; validate_script lists every import with its line)".to_owned(),
                        )
                    };
                    let mut result = with_plan(ExecutionResult::not_run(
                        execution_id,
                        EngineError::new(
                            ErrorKind::Invalid,
                            format!(
                                "The script imports what {whose} not allow: {}",
                                listed.join(", ")
                            ),
                        )
                        .with_hint(hint),
                    ));
                    result.events = blocked
                        .iter()
                        .map(|(module, line)| {
                            crate::events::import_blocked(module, u32::try_from(*line).ok())
                        })
                        .collect();
                    return result;
                }
                Err(error) => return with_plan(ExecutionResult::not_run(execution_id, error)),
            }
        }

        // Wait for a run slot only after setup: installs do not hold back quick runs. Its CPU
        // share goes to whichever sandbox runs the script (forked, pooled or cold).
        let slot = match self.sandbox_slot(caller, &cancel).await {
            Ok(slot) => slot,
            Err(error) => return with_plan(ExecutionResult::not_run(execution_id, error)),
        };
        let network_is_default = plan.network == self.config.network.names();
        let has_network = plan.network.is_some();
        // The default environment and network setting (the pool learns the default from its
        // first use when cache warming did not build it).
        let is_default = plan.requirements.is_empty()
            && network_is_default
            && self
                .pick_interpreter(None, None)
                .is_ok_and(|default| default.executable == plan.interpreter.executable);
        // Forked from the fork server of this environment when there is one; else a
        // pre-started sandbox of the warm pool when one matches; else a cold start.
        // A call that narrows the server's network policy may fork (a fork server holds no
        // network: each forked run gets its own proxy, started below with the call's names)
        // but takes no pooled sandbox: that one's proxy was started with the whole policy
        // before its environment's import-time code ran, and narrowing it afterwards could
        // not take back a connection that code opened.
        let narrowed = has_network && !network_is_default;
        // A pooled sandbox was started with the server's own shape (limits, exec, a writable
        // /work) and its environment's site code already ran: a run whose profile changes any
        // of that forks or starts cold.
        let reshaped = plan.shape != self.server_shape(plan.timeout);
        let claim = self.pool.claim(
            caller,
            &environment,
            has_network,
            is_default,
            narrowed || reshaped,
        );
        let (forking, warm) = match claim {
            crate::pool::Claim::Fork(forking) => (Some(forking), None),
            crate::pool::Claim::Warm(warm) => (None, Some(*warm)),
            crate::pool::Claim::Cold => (None, None),
        };
        let mut proxy = None;
        let (run_dir, pending) = match warm {
            Some(warm) => {
                proxy = warm.proxy;
                (
                    warm.run_dir
                        .write_script(&request.script)
                        .map(|()| warm.run_dir),
                    Some(warm.pending),
                )
            }
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
                    EngineError::internal(
                        format!("Failed to prepare the run directory: {err}"),
                        "check that the data directory is writable",
                    ),
                ));
            }
        };
        if plan.shape.deny_exec
            && let Err(err) = snakebox_sandbox::exec_deny_program()
                .map_err(|err| std::io::Error::other(crate::describe(&err)))
                .and_then(|program| run_dir.write_exec_deny(&program))
        {
            return with_plan(ExecutionResult::not_run(
                execution_id,
                EngineError::internal(
                    format!("Failed to prepare the run's exec-deny program: {err}"),
                    "check that the data directory is writable; or run under a profile that allows subprocesses",
                ),
            ));
        }
        if let Some(allowed) = &plan.imports
            && let Err(err) = run_dir.write_import_policy(allowed)
        {
            return with_plan(ExecutionResult::not_run(
                execution_id,
                EngineError::internal(
                    format!("Failed to write the run's import policy: {err}"),
                    "check that the data directory is writable",
                ),
            ));
        }
        let network = self.run_network(has_network);
        if let (crate::run::RunNetwork::Proxy, None, Some(names)) =
            (network, &proxy, plan.network.clone())
        {
            match self.start_run_proxy(&run_dir.input, names) {
                Ok(started) => proxy = Some(started),
                Err(error) => return with_plan(ExecutionResult::not_run(execution_id, error)),
            }
        }
        let baseline = match crate::files::write(&run_dir.work, &plan.inputs, run_dir.owner()) {
            Ok(()) => crate::artifacts::Baseline::snapshot(&run_dir.work),
            Err(err) => {
                return with_plan(ExecutionResult::not_run(
                    execution_id,
                    EngineError::context("Failed to write the input files", &err)
                        .with_hint("check that the data directory is writable"),
                ));
            }
        };
        let mut outcome = None;
        if let Some(forking) = &forking {
            let forked = forking
                .server
                .run(
                    &self.fork_run(
                        &run_dir,
                        &plan.shape,
                        network == crate::run::RunNetwork::Proxy,
                        forking.learns,
                        slot.cpu().cloned(),
                    ),
                    cancel.clone(),
                    output.clone(),
                )
                .await;
            match forked {
                // No user code ran: a cold start serves the run instead.
                Err(err) if err.retry_elsewhere() => {
                    tracing::warn!(error = %crate::describe(&err), "fork server; running cold");
                    if let Err(source) = run_dir.write_runner() {
                        outcome = Some(Err(snakebox_sandbox::SpawnError::Path {
                            path: run_dir.input.clone(),
                            source,
                        }
                        .into()));
                    }
                }
                forked => outcome = Some(forked),
            }
        }
        let outcome = match (outcome, pending) {
            (Some(outcome), _) => outcome,
            (None, Some(pending)) => {
                let _cpu = slot.cpu().map(|share| pending.attach_cpu(share));
                pending
                    .run(crate::pool::GO, plan.timeout, cancel, output)
                    .await
            }
            (None, None) => {
                let (mut policy, command) =
                    self.sandbox_call(&environment, &run_dir, &plan.shape, network, false);
                policy.cpu = slot.cpu().cloned();
                sandbox.run(&policy, &command, cancel, output).await
            }
        };
        let control = outcome
            .as_ref()
            .map(|o| o.control.as_slice())
            .unwrap_or_default();
        let mut collected = self
            .collect_rich(caller, &execution_id, &run_dir.work, baseline, control)
            .await;
        if let Some(forking) = &forking {
            self.pool.learn(forking, &collected.take_imported());
        }
        // The run is over: its proxy goes (its connections are closed, its socket removed)
        // and its log is the run's.
        let network_log = proxy
            .as_ref()
            .map(crate::network::log_of)
            .unwrap_or_default();
        drop(proxy);
        // The run is over and its files are collected: unmounting and removing the run
        // directory need not hold up the reply.
        tokio::task::spawn_blocking(move || drop(run_dir));

        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(err) => return with_plan(ExecutionResult::not_run(execution_id, err.into())),
        };
        let (status, error) = classify(&outcome, &plan.shape.limits, plan.timeout);
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
        result.network_log = network_log;
        result.error = error;
        let mut result = with_plan(result);
        collected.apply(&mut result);
        result
    }

    /// Check the request and decide interpreter, requirements, timeout, network and what its
    /// profile holds it to. An error of the profile's (a refusal of policy) comes with the
    /// profile's name.
    fn plan(
        &self,
        caller: &crate::Caller,
        request: &ExecuteRequest,
    ) -> Result<Plan, (EngineError, Option<String>)> {
        let profile = self
            .config
            .profiles
            .for_caller(caller, request.profile.as_deref())
            .map_err(|error| (error, Some(request.profile.clone().unwrap_or_default())))?;
        let refused = |error: EngineError| (error, Some(profile.name.clone()));
        let checked = self.check_request(request).map_err(|error| (error, None))?;
        let decided = self.held_to(profile, request, &checked).map_err(refused)?;
        let interpreter = self
            .pick_interpreter(
                request.python_version.as_deref(),
                checked.requires_python.as_ref(),
            )
            .map_err(|error| (error, None))?;
        Ok(Plan {
            interpreter,
            requirements: checked.requirements,
            timeout: decided.shape.limits.wall_time,
            notes: checked.notes,
            inputs: checked.inputs,
            network: decided.network,
            profile: profile.name.clone(),
            shape: decided.shape,
            imports: decided.imports,
        })
    }

    async fn environment(
        &self,
        caller: &crate::Caller,
        interpreter: &Interpreter,
        requirements: &[pep508_rs::Requirement],
    ) -> Result<Environment, EngineError> {
        let cache = self.cache.as_ref().map_err(Clone::clone)?;
        // A build runs uv's install sandboxes: it holds a slot of the concurrency cap, released
        // before the run takes its own (never both at once), in the caller's name, and its
        // sandboxes weigh on the CPU as the slot's share says. (A cancel drops this whole
        // future: the caller's select.)
        let slot = self.share(caller).slot().await?;
        Ok(cache
            .ensure_weighed(interpreter, requirements, slot.cpu())
            .await?)
    }
}
