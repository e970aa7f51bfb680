//! The engine through the sandbox seam: a recording [`Backend`] that writes down every sandbox
//! the engine asks for and then runs it without isolation (the `none` backend does the work),
//! so what the engine decides — policies, commands, identities, limits — is checked directly,
//! with real uv and real interpreters behind it.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use snakebox_engine::{Caller, CreateSession, Engine, EngineConfig, ExecuteRequest, Status};
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
    engine_with(data, |_| {}).await
}

async fn engine_with(
    data: &Path,
    adjust: impl FnOnce(&mut EngineConfig),
) -> (Engine, Arc<Mutex<Vec<Call>>>) {
    let inner = Sandbox::new(SandboxConfig {
        backend: BackendKind::None,
        bwrap_path: None,
        scratch_root: data.join("scratch"),
        docker_runtime: None,
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
    adjust(&mut config);
    let engine = Engine::with_sandbox(config, Sandbox::with_backend(Box::new(backend))).await;
    (engine, calls)
}

fn request(script: &str) -> ExecuteRequest {
    ExecuteRequest {
        session_id: None,
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

#[tokio::test]
async fn a_run_is_one_sandbox_with_the_engines_policy() {
    let data = tempfile::tempdir().unwrap();
    let (engine, calls) = engine(data.path()).await;
    let result = engine
        .execute(
            &Caller::local(),
            request("print('hi')"),
            CancellationToken::new(),
            None,
        )
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
        .execute(
            &Caller::local(),
            asks_network,
            CancellationToken::new(),
            None,
        )
        .await;
    assert_eq!(refused.status, Status::InvalidRequest, "{refused:?}");
    let mut bad_dependency = request("print('hi')");
    bad_dependency.dependencies = vec!["numpy; rm -rf /".into()];
    let refused = engine
        .execute(
            &Caller::local(),
            bad_dependency,
            CancellationToken::new(),
            None,
        )
        .await;
    assert_eq!(refused.status, Status::InvalidRequest, "{refused:?}");
    assert!(
        calls.lock().unwrap().is_empty(),
        "{:?}",
        calls.lock().unwrap()
    );
}

#[tokio::test]
async fn one_caller_never_sees_anothers_sessions_or_artifacts() {
    let data = tempfile::tempdir().unwrap();
    let (engine, _) = engine(data.path()).await;
    let a = Caller::tenant("team-a").unwrap();
    let b = Caller::tenant("team-b").unwrap();

    // An artifact of A's.
    let run = engine
        .execute(
            &a,
            request("open('out.txt', 'w').write('made by a')"),
            CancellationToken::new(),
            None,
        )
        .await;
    assert_eq!(run.status, Status::Ok, "{run:?}");
    assert_eq!(run.execution_id.len(), 32, "128-bit ids");
    let uri = run.artifacts[0].uri.clone();
    assert_eq!(
        engine.read_artifact(&a, &uri).await.unwrap().data,
        b"made by a"
    );
    let not_found =
        |err: snakebox_engine::EngineError| err.kind == snakebox_engine::ErrorKind::NotFound;
    assert!(not_found(engine.read_artifact(&b, &uri).await.unwrap_err()));
    // A's run in the runs table: A sees it (it may still be queued for the writer), B never.
    let mut runs = Vec::new();
    for _ in 0..100 {
        runs = engine
            .list_runs(
                &a,
                snakebox_engine::RunQuery {
                    limit: 10,
                    ..Default::default()
                },
            )
            .await;
        if runs.first().is_some_and(|r| r.status == "ok") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].execution_id, run.execution_id);
    assert_eq!(runs[0].status, "ok");
    assert_eq!(runs[0].kind, snakebox_engine::RunKind::Execute);
    assert!(runs[0].script.contains("made by a"));
    assert!(
        engine
            .list_runs(
                &b,
                snakebox_engine::RunQuery {
                    limit: 10,
                    ..Default::default()
                }
            )
            .await
            .is_empty()
    );
    assert!(not_found(
        engine.run_record(&b, &run.execution_id).await.unwrap_err()
    ));
    assert_eq!(
        engine
            .run_record(&a, &run.execution_id)
            .await
            .unwrap()
            .status,
        "ok"
    );
    assert!(engine.list_artifacts(&b, 100).await.is_empty());
    assert_eq!(engine.list_artifacts(&a, 100).await.len(), 1);

    // A session of A's.
    let session = engine
        .create_session(
            &a,
            CreateSession {
                python_version: None,
                dependencies: vec![],
                name: Some("a's".into()),
                network: None,
                allowed_domains: vec![],
                profile: None,
            },
        )
        .await
        .unwrap();
    let id = session.session_id.clone();
    assert!(id.len() == 34 && id.starts_with("s-"), "128-bit ids: {id}");
    let listed = |list: snakebox_engine::SessionList| {
        list.sessions
            .into_iter()
            .map(|s| s.session_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        listed(engine.list_sessions(&a).await.unwrap()),
        vec![id.clone()]
    );
    assert!(listed(engine.list_sessions(&b).await.unwrap()).is_empty());
    // B gets exactly what an id that never existed gets.
    let never = "s-00000000000000000000000000000000";
    let message = |err: snakebox_engine::EngineError, id: &str| {
        (err.kind, err.message.replace(id, "ID"), err.hint)
    };
    let b_delete = engine.delete_session(&b, &id).await.unwrap_err();
    let never_delete = engine.delete_session(&b, never).await.unwrap_err();
    assert_eq!(b_delete.kind, snakebox_engine::ErrorKind::NotFound);
    assert_eq!(message(b_delete, &id), message(never_delete, never));
    assert!(engine.read_file(&b, &id, "x.txt").await.is_err());
    assert!(engine.reset_session(&b, &id).await.is_err());
    // A's session is untouched by all that.
    assert_eq!(
        listed(engine.list_sessions(&a).await.unwrap()),
        vec![id.clone()]
    );
    engine.delete_session(&a, &id).await.unwrap();
    assert!(listed(engine.list_sessions(&a).await.unwrap()).is_empty());
}

// See: issue 12 (3): `--max-sessions` was not enforced under concurrent creates (30 created
// with a cap of 10): the count was checked before the session was built and the row inserted
// afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_never_exceed_max_sessions() {
    let data = tempfile::tempdir().unwrap();
    let (engine, _) = engine_with(data.path(), |config| config.sessions.max_sessions = 3).await;
    let engine = Arc::new(engine);
    let caller = Caller::local();
    // (Spawned all at once, on several threads.)
    let creates: Vec<_> = (0..12)
        .map(|i| {
            let engine = Arc::clone(&engine);
            let caller = caller.clone();
            tokio::spawn(async move {
                engine
                    .create_session(
                        &caller,
                        CreateSession {
                            python_version: None,
                            dependencies: vec![],
                            name: Some(format!("s{i}")),
                            network: None,
                            allowed_domains: vec![],
                            profile: None,
                        },
                    )
                    .await
            })
        })
        .collect();
    let mut created = 0;
    let mut refused = Vec::new();
    for create in creates {
        match create.await.unwrap() {
            Ok(_) => created += 1,
            Err(err) => refused.push(err.message),
        }
    }
    assert_eq!(created, 3, "{refused:?}");
    assert!(
        refused
            .iter()
            .all(|m| m.contains("the most this server allows")),
        "{refused:?}"
    );
    assert_eq!(
        engine.list_sessions(&caller).await.unwrap().sessions.len(),
        3
    );
}

// See: issue 12 (5): a server killed during `create_session` left a session directory with no
// record: never listed, never removed, not counted in disk use.
#[tokio::test]
async fn a_start_removes_session_files_that_were_never_recorded() {
    let data = tempfile::tempdir().unwrap();
    let caller = Caller::local();
    let kept = {
        let (engine, _) = engine(data.path()).await;
        engine
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
            .unwrap()
            .session_id
    };
    // The session is in its tenant's share of the sessions' disk.
    let share = fs_err::read_dir(data.path().join("sessions-v1/shares"))
        .unwrap()
        .flatten()
        .map(|entry| entry.path())
        .find(|dir| dir.join(&kept).is_dir())
        .expect("the session's directory in its tenant's share");
    let orphan = share.join("s-0123456789abcdef0123456789abcdef");
    fs_err::create_dir_all(orphan.join("work/deep/er")).unwrap();
    fs_err::write(orphan.join("work/deep/er/f.txt"), "left behind").unwrap();
    let (engine, _) = engine(data.path()).await;
    assert!(
        !orphan.exists(),
        "the unrecorded session's files are still there"
    );
    assert!(
        share.join(&kept).is_dir(),
        "a recorded session's files were removed"
    );
    let listed = engine.list_sessions(&caller).await.unwrap().sessions;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].session_id, kept);
}
