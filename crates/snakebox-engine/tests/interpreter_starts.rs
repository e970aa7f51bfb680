//! A session interpreter's start is the server's work for the tenant whose session it is
//! (issue 32, item 1): a tenant churning through more sessions than may run at once starts
//! them within its part of the host work, not all of its calls at once beside another
//! tenant's run. Proven through the sandbox seam: a backend whose `spawn` (the fork of an
//! interpreter's sandbox) is slow and counts how many run at once, with the `none` backend
//! doing the work behind it.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use snakebox_engine::{Caller, CreateSession, Engine, EngineConfig, ExecuteRequest, Status};
use snakebox_sandbox::{
    Backend, BackendKind, BackendReport, LiveSandbox, OutputChunk, PendingRun, Policy, RunFuture,
    Sandbox, SandboxCommand, SandboxConfig, SandboxError,
};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

/// How long each interpreter's fork takes here: long enough that starts asked for at once
/// overlap unless something keeps them apart.
const SLOW_START: Duration = Duration::from_millis(150);

/// The `none` backend, with slow interpreter starts, counted but for those of one session.
#[derive(Debug)]
struct SlowStarts {
    inner: Sandbox,
    now: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    /// The id of a session whose starts are not counted (another tenant's).
    uncounted: Arc<Mutex<String>>,
}

impl Backend for SlowStarts {
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
        Box::pin(self.inner.run(policy, command, cancel, output))
    }

    fn spawn(
        &self,
        policy: &Policy,
        command: &SandboxCommand,
    ) -> Result<LiveSandbox, SandboxError> {
        let uncounted = self.uncounted.lock().unwrap().clone();
        let counted = uncounted.is_empty() || !format!("{command:?}").contains(&uncounted);
        if counted {
            let at_once = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(at_once, Ordering::SeqCst);
        }
        std::thread::sleep(SLOW_START);
        let live = self.inner.spawn(policy, command);
        if counted {
            self.now.fetch_sub(1, Ordering::SeqCst);
        }
        live
    }

    fn prestart(
        &self,
        policy: &Policy,
        command: &SandboxCommand,
    ) -> Result<PendingRun, SandboxError> {
        self.inner.prestart(policy, command)
    }

    fn path_inside(&self, host: &Path, dest: &Path) -> PathBuf {
        self.inner.path_inside(host, dest)
    }
}

fn cell(session_id: &str) -> ExecuteRequest {
    ExecuteRequest {
        session_id: Some(session_id.into()),
        script: "x = 1\nprint(x)".into(),
        dependencies: vec![],
        timeout_seconds: Some(60.0),
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

/// The most host-work slots one tenant holds on this machine: a quarter of two per core, at
/// least one (`host_work.rs`).
fn tenants_part_of_the_host_work() -> usize {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get() * 2);
    (threads.max(2) / 4).max(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_tenants_interpreter_starts_stay_within_its_part_of_the_host_work() {
    let data = tempfile::tempdir().unwrap();
    let inner = Sandbox::new(SandboxConfig {
        backend: BackendKind::None,
        bwrap_path: None,
        scratch_root: data.path().join("scratch"),
        docker_runtime: None,
    })
    .unwrap();
    let most = Arc::new(AtomicUsize::new(0));
    let uncounted = Arc::new(Mutex::new(String::new()));
    let backend = SlowStarts {
        inner,
        now: Arc::new(AtomicUsize::new(0)),
        most: Arc::clone(&most),
        uncounted: Arc::clone(&uncounted),
    };
    let part = tenants_part_of_the_host_work();
    let sessions = part + 6;
    let mut config = EngineConfig::new(data.path().to_path_buf(), BackendKind::None);
    config.warm_pool = 0;
    config.fork_server = false;
    config.warm_cache = false;
    // Tenants share this server (per-tenant quotas, as over HTTP), with sandbox slots for
    // every session at once: only the host work's fair share may keep the starts apart.
    config.max_concurrent_runs = sessions * 2;
    config.tenants.max_concurrent_runs = Some(sessions * 2);
    config.sessions.max_sessions = sessions * 2;
    config.sessions.max_interpreters = sessions * 2;
    config.sessions.tenant_max_disk_bytes = Some(config.sessions.max_disk_bytes / 4);
    let engine =
        Arc::new(Engine::with_sandbox(config, Sandbox::with_backend(Box::new(backend))).await);
    let noisy = Caller::tenant("noisy").unwrap();
    let mut ids = Vec::new();
    for n in 0..sessions {
        let created = engine
            .create_session(
                &noisy,
                CreateSession {
                    python_version: None,
                    dependencies: vec![],
                    name: Some(format!("s{n}")),
                    network: None,
                    allowed_domains: vec![],
                    profile: None,
                },
            )
            .await
            .unwrap();
        ids.push(created.session_id);
    }
    let quiet = Caller::tenant("quiet").unwrap();
    let theirs = engine
        .create_session(
            &quiet,
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
    *uncounted.lock().unwrap() = theirs.session_id.clone();
    // Every session's first cell at once: each starts an interpreter.
    let cells: Vec<_> = ids
        .iter()
        .map(|id| {
            let (engine, noisy, request) = (Arc::clone(&engine), noisy.clone(), cell(id));
            tokio::spawn(async move {
                engine
                    .execute(&noisy, request, CancellationToken::new(), None)
                    .await
            })
        })
        .collect();
    // Another tenant's start meanwhile takes a host-work slot the flood does not hold: it
    // is done while most of the flood's starts still wait their turn.
    tokio::time::sleep(SLOW_START / 3).await;
    let result = engine
        .execute(
            &quiet,
            cell(&theirs.session_id),
            CancellationToken::new(),
            None,
        )
        .await;
    assert_eq!(result.status, Status::Ok, "{result:?}");
    let flood_done = cells.iter().filter(|cell| cell.is_finished()).count();
    assert!(
        flood_done + 2 < sessions,
        "the quiet tenant's start waited for the flood's: {flood_done} of {sessions} were done"
    );
    for cell in cells {
        let result = cell.await.unwrap();
        assert_eq!(result.status, Status::Ok, "{result:?}");
        assert!(result.fresh_interpreter, "{result:?}");
        assert_eq!(result.stdout.trim(), "1", "{result:?}");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        (1..=part).contains(&most),
        "{most} interpreters of one tenant started at once; its part of the host work is {part}"
    );
}
