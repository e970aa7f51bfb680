//! The engine through the sandbox seam: a recording [`Backend`] that writes down every sandbox
//! the engine asks for and then runs it without isolation (the `none` backend does the work),
//! so what the engine decides — policies, commands, identities, limits — is checked directly,
//! with real uv and real interpreters behind it.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use snakebox_engine::{Engine, EngineConfig, ExecuteRequest, Status};
use snakebox_sandbox::{
    Backend, BackendKind, BackendReport, LiveSandbox, OutputChunk, PendingRun, Policy, RunFuture,
    Sandbox, SandboxCommand, SandboxConfig, SandboxError,
};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

/// One sandbox the engine asked for.
#[derive(Debug, Clone)]
struct Call {
    kind: &'static str,
    policy: Policy,
    command: SandboxCommand,
}

#[derive(Debug)]
struct Recording {
    inner: Sandbox,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Recording {
    fn record(&self, kind: &'static str, policy: &Policy, command: &SandboxCommand) {
        self.calls.lock().unwrap().push(Call {
            kind,
            policy: policy.clone(),
            command: command.clone(),
        });
    }
}

impl Backend for Recording {
    fn kind(&self) -> BackendKind {
        BackendKind::None
    }

    fn report(&self) -> BackendReport {
        self.inner.report()
    }

    fn run<'a>(
        &'a self,
        policy: &'a Policy,
        command: &'a SandboxCommand,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> RunFuture<'a> {
        self.record("run", policy, command);
        Box::pin(self.inner.run(policy, command, cancel, output))
    }

    fn spawn(
        &self,
        policy: &Policy,
        command: &SandboxCommand,
    ) -> Result<LiveSandbox, SandboxError> {
        self.record("spawn", policy, command);
        self.inner.spawn(policy, command)
    }

    fn prestart(
        &self,
        policy: &Policy,
        command: &SandboxCommand,
    ) -> Result<PendingRun, SandboxError> {
        self.record("prestart", policy, command);
        self.inner.prestart(policy, command)
    }

    fn path_inside(&self, host: &Path, dest: &Path) -> PathBuf {
        self.inner.path_inside(host, dest)
    }
}

async fn engine(data: &Path) -> (Engine, Arc<Mutex<Vec<Call>>>) {
    let inner = Sandbox::new(SandboxConfig {
        backend: BackendKind::None,
        bwrap_path: None,
        scratch_root: data.join("scratch"),
    })
    .unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let backend = Recording {
        inner,
        calls: Arc::clone(&calls),
    };
    let mut config = EngineConfig::new(data.to_path_buf(), BackendKind::None);
    config.warm_pool = 0;
    config.fork_server = false;
    config.warm_cache = false;
    let engine = Engine::with_sandbox(config, Sandbox::with_backend(Box::new(backend))).await;
    (engine, calls)
}

fn request(script: &str) -> ExecuteRequest {
    ExecuteRequest {
        script: script.into(),
        dependencies: vec![],
        timeout_seconds: Some(20),
        python_version: None,
        files: vec![],
        network: None,
    }
}

#[tokio::test]
async fn a_run_is_one_sandbox_with_the_engines_policy() {
    let data = tempfile::tempdir().unwrap();
    let (engine, calls) = engine(data.path()).await;
    let result = engine
        .execute(request("print('hi')"), CancellationToken::new(), None)
        .await;
    assert_eq!(result.status, Status::Ok, "{result:?}");
    assert_eq!(result.stdout, "hi\n");
    let calls = calls.lock().unwrap().clone();
    // The environment was built first (uv's sandboxes), then the script ran in one sandbox.
    let (last, before) = calls.split_last().unwrap();
    assert!(!before.is_empty(), "no environment build was asked for");
    assert!(before.iter().all(|c| c.kind == "run"));
    assert_eq!(last.kind, "run");
    let policy = &last.policy;
    assert!(!policy.network, "a run has no network unless asked for");
    assert!(last.command.control_channel);
    assert!(
        last.command
            .args
            .iter()
            .any(|a| a.to_string_lossy().ends_with("runner.py"))
    );
    // The run's limits are the engine's, with the call's wall time.
    assert_eq!(policy.limits.wall_time.as_secs(), 20);
    // The run's working directory is writable, and it is the cwd (a host path here: the
    // backend says where things are seen, not the engine).
    let work = policy
        .mounts
        .iter()
        .find(|m| m.writable)
        .expect("a writable working directory");
    assert_eq!(policy.cwd, work.host);
    // Everything else it sees is read-only.
    assert_eq!(policy.mounts.iter().filter(|m| m.writable).count(), 1);
}

#[tokio::test]
async fn refused_requests_never_reach_the_backend() {
    let data = tempfile::tempdir().unwrap();
    let (engine, calls) = engine(data.path()).await;
    let mut asks_network = request("print('hi')");
    asks_network.network = Some(true);
    let refused = engine
        .execute(asks_network, CancellationToken::new(), None)
        .await;
    assert_eq!(refused.status, Status::InvalidRequest, "{refused:?}");
    let mut bad_dependency = request("print('hi')");
    bad_dependency.dependencies = vec!["numpy; rm -rf /".into()];
    let refused = engine
        .execute(bad_dependency, CancellationToken::new(), None)
        .await;
    assert_eq!(refused.status, Status::InvalidRequest, "{refused:?}");
    assert!(
        calls.lock().unwrap().is_empty(),
        "{:?}",
        calls.lock().unwrap()
    );
}
