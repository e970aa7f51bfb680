//! One-shot executions: plan (see [`crate::plan`]), prepare the cached environment, launch
//! (forked from the environment's fork server, a pre-started sandbox of the warm pool, or
//! cold), collect, and turn the outcome into an [`ExecutionResult`].

use std::sync::Arc;
use std::time::Instant;

use snakebox_env::{Environment, Interpreter};
use snakebox_sandbox::OutputChunk;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::environments::Environments;
use crate::history::{RunKind, RunStart};
use crate::ids;
use crate::lifecycle::Calls;
use crate::network::Proxies;
use crate::plan::ExecuteRequest;
use crate::plan::Planner;
use crate::policy::{Asked, CallKind, CallPolicy};
use crate::pool::WarmPool;
use crate::result::{ExecutionResult, Package};
use crate::run::Sandboxes;
use crate::run::{Ran, RunDir, classify};
use crate::validate::Validator;
use crate::{EngineConfig, EngineError, ErrorKind, Unavailable};

/// What planning decided: everything needed to prepare and run.
struct Plan {
    interpreter: Interpreter,
    requirements: Vec<pep508_rs::Requirement>,
    inputs: Vec<crate::files::DecodedFile>,
    /// Its profile, limits, network, exec policy, writable `/work`, imports and notes.
    policy: CallPolicy,
}

impl Plan {
    /// What the plan decided, on the call's record (whatever stage answered).
    fn stamp(&self, mut result: ExecutionResult) -> ExecutionResult {
        result.python_version = Some(self.interpreter.version.to_string());
        result.requested_dependencies = self.requirements.iter().map(ToString::to_string).collect();
        result.timeout_seconds = self.policy.timeout().as_secs();
        result.notes.clone_from(&self.policy.notes);
        result.profile = Some(self.policy.profile.clone());
        result
    }
}

/// Where a run goes (see [`OneShot::launch_path`]): a fork server, a pooled sandbox, or
/// neither (a cold start).
struct LaunchPath {
    forking: Option<std::sync::Arc<crate::pool::Forking>>,
    warm: Option<crate::pool::Warm>,
}

/// What a launched run left: its outcome, its collected files and its network log.
struct Launched {
    outcome: snakebox_sandbox::Outcome,
    collected: crate::runner::Rich,
    network_log: Vec<crate::NetworkLogEntry>,
}

/// One-shot runs as a service: what a run in a fresh sandbox needs, and no more: admission,
/// the plan, the environment, the import check, the warm pool to claim from, what each
/// sandbox is, the proxies, and the artifact store its files are collected into.
pub(crate) struct OneShot {
    pub(crate) config: Arc<EngineConfig>,
    pub(crate) sandbox: Result<Arc<snakebox_sandbox::Sandbox>, Unavailable>,
    pub(crate) calls: Arc<Calls>,
    pub(crate) planner: Arc<Planner>,
    pub(crate) proxies: Arc<Proxies>,
    pub(crate) sandboxes: Arc<Sandboxes>,
    pub(crate) pool: Arc<WarmPool>,
    pub(crate) environments: Arc<Environments>,
    pub(crate) compiler: Arc<crate::compile::Compiler>,
    pub(crate) validator: Arc<Validator>,
    pub(crate) artifacts: crate::artifacts::ArtifactStore,
    pub(crate) secrets: Arc<crate::secrets::Secrets>,
}

impl OneShot {
    /// Run one script in a fresh sandbox. Always returns a record: failures before the script
    /// runs are reported with status `invalid_request` or `setup_failed` and a hint; a call
    /// made while the server stops is refused (`setup_failed`), one cut short by the stop is
    /// `cancelled` and says so.
    pub(crate) async fn execute(
        &self,
        caller: &crate::Caller,
        request: ExecuteRequest,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> ExecutionResult {
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
        self.calls
            .tracked(
                caller,
                start,
                &cancel,
                ExecutionResult::not_run,
                |id, token| {
                    let output = self.calls.live_tee(&id, output);
                    self.execute_admitted(caller, id, request, token, output)
                },
            )
            .await
    }

    /// The call once admitted, in stages: its plan, its environment, its import policy, its
    /// launch, its result. A stage that refuses answers with a record that says why.
    async fn execute_admitted(
        &self,
        caller: &crate::Caller,
        execution_id: String,
        request: ExecuteRequest,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> ExecutionResult {
        let plan = match self.plan_call(caller, &request, &cancel).await {
            Ok(plan) => plan,
            Err((error, profile)) => {
                let mut result = ExecutionResult::not_run(execution_id, error);
                if let Some(profile) = profile {
                    crate::profiles::refused(&mut result, &profile);
                }
                return result;
            }
        };
        let setup_started = Instant::now();
        let environment = match self.prepare(caller, &plan, &cancel).await {
            Ok(environment) => environment,
            Err(error) => return plan.stamp(ExecutionResult::not_run(execution_id, error)),
        };
        // A new environment published before its bytecode: compiled once this call ends.
        let _compile_after = self.compiler.compile_after(&environment);
        let setup_ms = ids::millis(setup_started.elapsed());
        if let Some(refused) = self
            .imports_refused(caller, &plan, &request, &execution_id)
            .await
        {
            return plan.stamp(refused);
        }
        let launched = match self
            .launch(
                caller,
                &execution_id,
                &request,
                &plan,
                &environment,
                cancel,
                output,
            )
            .await
        {
            Ok(launched) => launched,
            Err(error) => return plan.stamp(ExecutionResult::not_run(execution_id, error)),
        };
        let Launched {
            outcome,
            collected,
            network_log,
        } = launched;
        let (status, error) = classify(
            &outcome,
            Ran::Script,
            &plan.policy.shape.limits,
            plan.policy.timeout(),
        );
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
        let mut result = plan.stamp(result);
        collected.apply(&mut result);
        plan.policy.note_if_offline(
            &self.config,
            &mut result,
            crate::policy::Offline::Run {
                asked: request.network,
            },
        );
        result
    }

    /// The call's plan: its checks (the script parsed once), its policy (decided before
    /// anything is downloaded: a refused call costs nothing), its Python (downloaded first
    /// with `python_downloads = "automatic"`). An error of the profile's (a refusal of
    /// policy) comes with the profile's name.
    async fn plan_call(
        &self,
        caller: &crate::Caller,
        request: &ExecuteRequest,
        cancel: &CancellationToken,
    ) -> Result<Plan, (EngineError, Option<String>)> {
        let checked = self
            .planner
            .check_request(request)
            .map_err(|error| (error, None))?;
        let policy = CallPolicy::decide(
            &self.config,
            CallKind::Run,
            &self.calls.tenant(caller),
            &Asked::of(request, &checked.requirements),
        )
        .map_err(|refusal| (refusal.error, refusal.profile))?;
        let provided = tokio::select! {
            provided = self.planner.provide_python(request.python_version.as_deref(), checked.requires_python.as_ref()) => provided,
            () = cancel.cancelled() => Err(EngineError::new(
                ErrorKind::Cancelled,
                "The call was cancelled while its Python was being downloaded",
            )),
        };
        provided.map_err(|error| (error, None))?;
        let interpreter = self
            .planner
            .pick_interpreter(
                request.python_version.as_deref(),
                checked.requires_python.as_ref(),
            )
            .map_err(|error| (error, None))?;
        let mut requirements = checked.requirements;
        requirements.extend(policy.inferred.iter().cloned());
        Ok(Plan {
            interpreter,
            requirements,
            inputs: checked.inputs,
            policy,
        })
    }

    /// The call's environment, from the cache or built now. A cancel (the caller's, or the
    /// server stopping) ends the setup too: dropping it kills its sandboxes and uv processes
    /// and removes its build directory.
    async fn prepare(
        &self,
        caller: &crate::Caller,
        plan: &Plan,
        cancel: &CancellationToken,
    ) -> Result<Environment, EngineError> {
        if let Err(missing) = &self.sandbox {
            return Err(missing.clone());
        }
        tokio::select! {
            prepared = self.environments.environment(caller, &plan.interpreter, &plan.requirements) => prepared,
            () = cancel.cancelled() => Err(EngineError::new(
                ErrorKind::Cancelled,
                "The call was cancelled while its environment was being prepared",
            )),
        }
    }

    /// The import policy, checked before the run: each import of the script's own code
    /// outside it is refused with its line (the runner guards the dynamic ones too). The
    /// refusal, when there is one.
    async fn imports_refused(
        &self,
        caller: &crate::Caller,
        plan: &Plan,
        request: &ExecuteRequest,
        execution_id: &str,
    ) -> Option<ExecutionResult> {
        let allowed = plan.policy.imports.as_ref()?;
        let blocked = match self
            .validator
            .imports_outside(caller, &plan.interpreter, &request.script, allowed)
            .await
        {
            Ok(blocked) if blocked.is_empty() => return None,
            Ok(blocked) => blocked,
            Err(error) => return Some(ExecutionResult::not_run(execution_id.to_owned(), error)),
        };
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
                format!("the profile `{}`'s import policy does", plan.policy.profile),
                "remove those imports, or name a profile whose import policy allows them with `profile` (check_environment lists what each profile allows; validate_script lists every import with its line)".to_owned(),
            )
        };
        let mut result = ExecutionResult::not_run(
            execution_id.to_owned(),
            EngineError::new(
                ErrorKind::Invalid,
                format!(
                    "The script imports what {whose} not allow: {}",
                    listed.join(", ")
                ),
            )
            .with_hint(hint),
        );
        result.events = blocked
            .iter()
            .map(|(module, line)| crate::events::import_blocked(module, u32::try_from(*line).ok()))
            .collect();
        Some(result)
    }

    /// Run the planned call in its sandbox, once a slot is the caller's (taken only after
    /// setup: installs do not hold back quick runs; its CPU share goes to whichever sandbox
    /// runs the script): forked from the environment's fork server, a pre-started sandbox of
    /// the warm pool, or a cold start; then collect its files and its network log.
    #[expect(
        clippy::too_many_arguments,
        reason = "the call's parts, each passed once"
    )]
    async fn launch(
        &self,
        caller: &crate::Caller,
        execution_id: &str,
        request: &ExecuteRequest,
        plan: &Plan,
        environment: &Environment,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> Result<Launched, EngineError> {
        let sandbox = self.sandbox.as_ref().map_err(Clone::clone)?;
        let slot = self.calls.sandbox_slot(caller, &cancel).await?;
        let has_network = plan.policy.network.is_some();
        let launch = self.launch_path(plan, environment, caller);
        let mut proxy = None;
        let (run_dir, pending) = match launch.warm {
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
                match &launch.forking {
                    Some(forking) => RunDir::for_fork(
                        sandbox,
                        &forking.server,
                        &self.config.data_dir,
                        execution_id,
                        Some(&request.script),
                        self.config.scratch_bytes,
                    ),
                    None => RunDir::for_run(
                        sandbox,
                        &self.config.data_dir,
                        execution_id,
                        Some(&request.script),
                        self.config.scratch_bytes,
                    ),
                },
                None,
            ),
        };
        let run_dir = run_dir.map_err(|err| {
            EngineError::internal(
                format!("Failed to prepare the run directory: {err}"),
                "check that the data directory is writable",
            )
        })?;
        self.write_run_policy(&run_dir, plan)?;
        let network = self.sandboxes.run_network(has_network);
        if let (crate::run::RunNetwork::Proxy, None, Some(names)) =
            (network, &proxy, plan.policy.network.clone())
        {
            proxy = Some(self.proxies.start_run_proxy(&run_dir.input, names)?);
        }
        if !plan.policy.secrets.is_empty() {
            // The values go to the run's proxy, the placeholders into its input directory
            // (before the runner reads them: a pre-started one waits for its request).
            let Some(proxy) = &proxy else {
                return Err(EngineError::invalid(
                    "This server cannot give a run secrets: its runs share the host's network (the `none` backend), with no proxy to hold the values",
                    "run without `secrets`, or ask the operator to use an isolating backend",
                ));
            };
            let inside = self
                .sandboxes
                .path_inside(&run_dir.input, crate::run::SANDBOX_INPUT_DIR);
            proxy.grant(Some(self.secrets.grant(
                &run_dir.input,
                &inside,
                &plan.policy.secrets,
            )?));
        }
        let baseline = crate::files::write(&run_dir.work, &plan.inputs, run_dir.owner())
            .map(|()| crate::artifacts::Baseline::snapshot(&run_dir.work))
            .map_err(|err| {
                EngineError::context("Failed to write the input files", &err)
                    .with_hint("check that the data directory is writable")
            })?;
        let mut outcome = None;
        if let Some(forking) = &launch.forking {
            let forked = forking
                .server
                .run(
                    &self.sandboxes.fork_run(
                        &run_dir,
                        &plan.policy.shape,
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
                    .run(crate::pool::GO, plan.policy.timeout(), cancel, output)
                    .await
            }
            (None, None) => {
                let (mut policy, command) = self.sandboxes.sandbox_call(
                    environment,
                    &run_dir,
                    &plan.policy.shape,
                    network,
                    false,
                );
                policy.cpu = slot.cpu().cloned();
                sandbox.run(&policy, &command, cancel, output).await
            }
        };
        let control = outcome
            .as_ref()
            .map(|o| o.control.as_slice())
            .unwrap_or_default();
        let mut collected = crate::runner::collect_rich(
            &self.artifacts,
            caller,
            execution_id,
            &run_dir.work,
            baseline,
            control,
        )
        .await;
        if let Some(forking) = &launch.forking {
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
        Ok(Launched {
            outcome: outcome?,
            collected,
            network_log,
        })
    }

    /// Where the run goes: forked from the fork server of its environment when there is one;
    /// else a pre-started sandbox of the warm pool when one matches; else a cold start.
    fn launch_path(
        &self,
        plan: &Plan,
        environment: &Environment,
        caller: &crate::Caller,
    ) -> LaunchPath {
        let network_is_default = plan.policy.network == self.config.network.names();
        let has_network = plan.policy.network.is_some();
        // The default environment and network setting (the pool learns the default from its
        // first use when cache warming did not build it).
        let is_default = plan.requirements.is_empty()
            && network_is_default
            && self
                .planner
                .pick_interpreter(None, None)
                .is_ok_and(|default| default.executable == plan.interpreter.executable);
        // A call that narrows the server's network policy may fork (a fork server holds no
        // network: each forked run gets its own proxy, started with the call's names) but
        // takes no pooled sandbox: that one's proxy was started with the whole policy before
        // its environment's import-time code ran, and narrowing it afterwards could not take
        // back a connection that code opened.
        let narrowed = has_network && !network_is_default;
        // A pooled sandbox was started with the server's own shape (limits, exec, a writable
        // /work) and its environment's site code already ran: a run whose profile changes any
        // of that forks or starts cold.
        let reshaped =
            plan.policy.shape != crate::policy::server_shape(&self.config, plan.policy.timeout());
        match self.pool.claim(
            caller,
            environment,
            has_network,
            is_default,
            narrowed || reshaped,
        ) {
            crate::pool::Claim::Fork(forking) => LaunchPath {
                forking: Some(forking),
                warm: None,
            },
            crate::pool::Claim::Warm(warm) => LaunchPath {
                forking: None,
                warm: Some(*warm),
            },
            crate::pool::Claim::Cold => LaunchPath {
                forking: None,
                warm: None,
            },
        }
    }

    /// The profile's exec-deny program and import policy, into the run's directory.
    fn write_run_policy(&self, run_dir: &RunDir, plan: &Plan) -> Result<(), EngineError> {
        if plan.policy.shape.deny_exec {
            snakebox_sandbox::exec_deny_program()
                .map_err(|err| std::io::Error::other(crate::describe(&err)))
                .and_then(|program| run_dir.write_exec_deny(&program))
                .map_err(|err| {
                    EngineError::internal(
                        format!("Failed to prepare the run's exec-deny program: {err}"),
                        "check that the data directory is writable; or run under a profile that allows subprocesses",
                    )
                })?;
        }
        if let Some(allowed) = &plan.policy.imports {
            run_dir.write_import_policy(allowed).map_err(|err| {
                EngineError::internal(
                    format!("Failed to write the run's import policy: {err}"),
                    "check that the data directory is writable",
                )
            })?;
        }
        Ok(())
    }
}
