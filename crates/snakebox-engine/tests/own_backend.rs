//! The backend seam is open: a backend written here, outside the sandbox crate, with handles
//! and a staging of its own, runs the engine's one-shot calls and session cells. Nothing of
//! the engine or the sandbox crate names it; it is handed to `Sandbox::with_backend`.
//!
//! Its handles wrap what the `none` backend starts (this test is about the seam, not about
//! isolation), counting what the engine asks of them; its staging writes down what is staged
//! in and out, as a backend whose sandboxes run elsewhere would copy it.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use snakebox_engine::{Caller, CreateSession, Engine, EngineConfig, ExecuteRequest, Status};
use snakebox_sandbox::{
    Backend, BackendKind, BackendReport, Exchange, LiveHandle, LiveSandbox, Mount, Outcome,
    OutputChunk, PendingHandle, PendingRun, Policy, RunFuture, Sandbox, SandboxCommand,
    SandboxConfig, SandboxError, SandboxFuture, Staging,
};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

/// What the backend's handles and staging were asked to do, in order.
type Log = Arc<Mutex<Vec<String>>>;

fn note(log: &Log, line: impl Into<String>) {
    log.lock().unwrap().push(line.into());
}

#[derive(Debug)]
struct Relay {
    inner: Sandbox,
    log: Log,
}

#[derive(Debug)]
struct RelayLive {
    inner: LiveSandbox,
    log: Log,
}

impl LiveHandle for RelayLive {
    fn is_alive(&mut self) -> bool {
        self.inner.is_alive()
    }

    fn kill(&mut self) -> SandboxFuture<'_, ()> {
        note(&self.log, "live kill");
        Box::pin(self.inner.kill())
    }

    fn exchange<'a>(
        &'a mut self,
        request: &'a [u8],
        marker: &'a [u8],
        timeout: Duration,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> SandboxFuture<'a, Result<Exchange, SandboxError>> {
        note(&self.log, "live exchange");
        Box::pin(
            self.inner
                .exchange(request, marker, timeout, cancel, output),
        )
    }
}

#[derive(Debug)]
struct RelayPending {
    inner: PendingRun,
    log: Log,
}

impl PendingHandle for RelayPending {
    fn is_alive(&mut self) -> bool {
        self.inner.is_alive()
    }

    fn age(&self) -> Duration {
        self.inner.age()
    }

    fn discard(self: Box<Self>) -> SandboxFuture<'static, ()> {
        note(&self.log, "pending discard");
        Box::pin(self.inner.discard())
    }

    fn run<'a>(
        self: Box<Self>,
        request: &'a [u8],
        wall_time: Duration,
        cancel: CancellationToken,
        output: Option<UnboundedSender<OutputChunk>>,
    ) -> SandboxFuture<'a, Result<Outcome, SandboxError>> {
        note(&self.log, "pending run");
        Box::pin(self.inner.run(request, wall_time, cancel, output))
    }
}

/// Writes down which writable mounts it would copy, and when.
#[derive(Debug)]
struct NotingStaging {
    log: Log,
}

fn writable(mounts: &[Mount]) -> usize {
    mounts.iter().filter(|m| m.writable).count()
}

impl Staging for NotingStaging {
    fn stage_in(&self, mounts: &[Mount]) -> Result<(), SandboxError> {
        note(&self.log, format!("stage in {}", writable(mounts)));
        Ok(())
    }

    fn stage_out(&self, mounts: &[Mount]) -> Result<(), SandboxError> {
        note(&self.log, format!("stage out {}", writable(mounts)));
        Ok(())
    }
}

impl Backend for Relay {
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
        note(&self.log, "run");
        Box::pin(self.inner.run(policy, command, cancel, output))
    }

    fn spawn(
        &self,
        policy: &Policy,
        command: &SandboxCommand,
    ) -> Result<LiveSandbox, SandboxError> {
        note(&self.log, "spawn");
        let inner = self.inner.spawn(policy, command)?;
        Ok(LiveSandbox::new(Box::new(RelayLive {
            inner,
            log: Arc::clone(&self.log),
        })))
    }

    fn prestart(
        &self,
        policy: &Policy,
        command: &SandboxCommand,
    ) -> Result<PendingRun, SandboxError> {
        note(&self.log, "prestart");
        let inner = self.inner.prestart(policy, command)?;
        Ok(PendingRun::new(Box::new(RelayPending {
            inner,
            log: Arc::clone(&self.log),
        })))
    }

    fn path_inside(&self, host: &Path, dest: &Path) -> PathBuf {
        self.inner.path_inside(host, dest)
    }

    fn staging(&self) -> Arc<dyn Staging> {
        Arc::new(NotingStaging {
            log: Arc::clone(&self.log),
        })
    }
}

async fn engine_with(data: &Path, warm_pool: usize, warm_cache: bool) -> (Arc<Engine>, Log) {
    let inner = Sandbox::new(SandboxConfig {
        backend: BackendKind::None,
        bwrap_path: None,
        scratch_root: data.join("scratch"),
        docker_runtime: None,
    })
    .unwrap();
    let log = Log::default();
    let backend = Relay {
        inner,
        log: Arc::clone(&log),
    };
    let mut config = EngineConfig::new(data.to_path_buf(), BackendKind::None);
    config.warm_pool = warm_pool;
    config.fork_server = false;
    config.warm_cache = warm_cache;
    let engine = Engine::with_sandbox(config, Sandbox::with_backend(Box::new(backend))).await;
    (Arc::new(engine), log)
}

fn request(script: &str, session_id: Option<String>) -> ExecuteRequest {
    ExecuteRequest {
        session_id,
        script: script.into(),
        dependencies: vec![],
        timeout_seconds: Some(20.0),
        python_version: None,
        files: vec![],
        network: None,
        allowed_domains: vec![],
        allowed_imports: None,
        profile: None,
        memory_limit_bytes: None,
        secrets: Vec::new(),
    }
}

fn taken(log: &Log) -> Vec<String> {
    std::mem::take(&mut *log.lock().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_of_its_own_runs_a_one_shot_call_and_a_session_cell() {
    let data = tempfile::tempdir().unwrap();
    let (engine, log) = engine_with(data.path(), 0, false).await;
    let caller = Caller::local();

    // A one-shot call: one run, its files staged in before and out after.
    let result = engine
        .execute(
            &caller,
            request("open('made.txt', 'w').write('x'); print(6 * 7)", None),
            CancellationToken::new(),
            None,
        )
        .await;
    assert_eq!(result.status, Status::Ok, "{result:?}");
    assert_eq!(result.stdout, "42\n");
    assert_eq!(result.artifacts.len(), 1, "{result:?}");
    let one_shot = taken(&log);
    assert!(
        one_shot.ends_with(&["stage in 1".into(), "run".into(), "stage out 1".into()]),
        "{one_shot:?}"
    );

    // A session: its interpreter is the backend's live handle; each cell an exchange, with
    // the workspace staged around it.
    let session = engine
        .create_session(
            &caller,
            CreateSession {
                python_version: None,
                dependencies: vec![],
                name: None,
                network: None,
                allowed_domains: vec![],
                profile: None,
            },
        )
        .await
        .unwrap();
    let id = session.session_id;
    for (script, printed) in [("x = 20", ""), ("print(x + 1)", "21\n")] {
        let cell = engine
            .execute(
                &caller,
                request(script, Some(id.clone())),
                CancellationToken::new(),
                None,
            )
            .await;
        assert_eq!(cell.status, Status::Ok, "{cell:?}");
        assert_eq!(cell.stdout, printed);
    }
    let cells = taken(&log);
    let spawned = cells.iter().position(|l| l == "spawn").expect("a spawn");
    assert_eq!(
        cells[..spawned].last().map(String::as_str),
        Some("stage in 1"),
        "{cells:?}"
    );
    let cell = ["stage in 1", "live exchange", "stage out 1"];
    assert_eq!(cells[spawned + 1..], [cell, cell].concat(), "{cells:?}");
    engine.delete_session(&caller, &id).await.unwrap();
    assert!(
        taken(&log).iter().any(|l| l == "live kill"),
        "the session's interpreter was not killed through its handle"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_of_its_own_serves_the_warm_pool() {
    let data = tempfile::tempdir().unwrap();
    let (engine, log) = engine_with(data.path(), 1, true).await;
    let pool = tokio::spawn(Arc::clone(&engine).run_warm_pool());
    let mut ready = false;
    for _ in 0..600 {
        if engine.report().warm_pool.ready_default > 0 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        ready,
        "the pool never filled: {:?}",
        engine.report().warm_pool
    );

    let result = engine
        .execute(
            &Caller::local(),
            request("print('warm')", None),
            CancellationToken::new(),
            None,
        )
        .await;
    assert_eq!(result.status, Status::Ok, "{result:?}");
    assert_eq!(result.stdout, "warm\n");
    assert_eq!(engine.report().warm_pool.served, 1);

    engine.stop_warm_pool().await;
    pool.abort();
    let _ = pool.await;
    // The run was served by a pre-started handle (the pool refilled meanwhile); whatever
    // started a sandbox staged its files in, and whatever ran staged them out: the script,
    // written after the start, again when the request went.
    let all = taken(&log);
    let count = |what: &str| all.iter().filter(|l| l.as_str() == what).count();
    let staged = |what: &str| all.iter().filter(|l| l.starts_with(what)).count();
    assert_eq!(count("pending run"), 1, "{all:?}");
    assert!(count("prestart") >= 1, "{all:?}");
    assert_eq!(
        staged("stage in"),
        count("prestart") + count("pending run") + count("run"),
        "{all:?}"
    );
    assert_eq!(
        staged("stage out"),
        count("pending run") + count("run"),
        "{all:?}"
    );
}
