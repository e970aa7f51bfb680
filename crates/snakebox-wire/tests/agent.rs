//! Issue 35, the wire itself: real `snakebox agent` routers on loopback sockets (in this
//! process, each over its own engine on the `none` backend), called by a front's
//! [`Routed`] engine through the MCP face, and by hand with good and bad tokens. Nothing is
//! simulated but the processes: every call crosses a real HTTP connection. The end-to-end
//! test with real processes is tests/e2e/test_agents.py.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use snakebox_engine::{Caller, EngineApi, EngineHandle, ExecuteRequest, RunQuery};
use snakebox_server::SnakeboxServer;
use snakebox_test::{McpClient, TestEngine};
use snakebox_wire::{AgentCheck, FrontKey, RemoteEngine, Routed, StaticDirectory, protocol};
use tokio_util::sync::CancellationToken;

/// One agent: its engine and its URL.
struct Agent {
    test: TestEngine,
    url: String,
    name: String,
}

/// A key pair in a temporary directory: the front's key and the public key's path.
fn keypair() -> (tempfile::TempDir, Arc<FrontKey>) {
    let dir = tempfile::tempdir().unwrap();
    let (private, _) = snakebox_wire::write_keypair(&dir.path().join("keys")).unwrap();
    let key = Arc::new(FrontKey::load(&private).unwrap());
    (dir, key)
}

fn public_key(dir: &tempfile::TempDir) -> std::path::PathBuf {
    dir.path().join("keys").join(snakebox_wire::PUBLIC_KEY_FILE)
}

async fn start_agent(name: &str, public: &Path) -> Agent {
    let test = TestEngine::new().await;
    let check = AgentCheck::load(public, name).unwrap();
    let router =
        snakebox_wire::agent::router(EngineHandle::from(Arc::clone(test.engine())), check, None);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(snakebox_wire::agent::serve(
        listener,
        router,
        CancellationToken::new(),
    ));
    Agent {
        test,
        url,
        name: name.into(),
    }
}

/// A front's engine API over `agents`, with a fresh directory (as a front just started).
fn front(agents: &[&Agent], key: &Arc<FrontKey>, host: &TestEngine) -> EngineHandle {
    let handle = EngineHandle::from(Arc::clone(host.engine()));
    let remotes = agents
        .iter()
        .map(|agent| {
            RemoteEngine::new(
                &agent.name,
                &agent.url,
                Arc::clone(key),
                Arc::clone(handle.host()),
            )
            .unwrap()
        })
        .collect();
    let directory = StaticDirectory::new(remotes).unwrap();
    let routed = Routed::new(Arc::new(directory), Arc::clone(handle.host()));
    handle.with_api(Arc::new(routed))
}

async fn mcp_as(front: &EngineHandle, tenant: &str) -> McpClient {
    McpClient::connect_to(SnakeboxServer::for_caller(
        front.clone(),
        Caller::tenant(tenant).unwrap(),
    ))
    .await
}

/// A raw POST to an agent: its status and JSON body.
async fn post(url: &str, route: &str, token: Option<&str>, body: &Value) -> (u16, Value) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let mut request =
        hyper::Request::post(format!("{url}{route}")).header("content-type", "application/json");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let request = request
        .body(Full::new(Bytes::from(serde_json::to_vec(body).unwrap())))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let value = text
        .lines()
        .last()
        .and_then(|line| serde_json::from_str(line).ok())
        .unwrap_or(Value::String(text));
    (status, value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_runs_one_shots_and_sessions_on_its_agents_each_tenant_its_own() {
    let (dir, key) = keypair();
    let a = start_agent("agent-a", &public_key(&dir)).await;
    let b = start_agent("agent-b", &public_key(&dir)).await;
    let host = TestEngine::new().await;
    let front_engine = front(&[&a, &b], &key, &host);
    let alice = mcp_as(&front_engine, "alice").await;

    // One-shot runs take turns over the agents.
    for _ in 0..4 {
        let run = alice
            .call("execute_python", json!({"script": "print(6 * 7)"}))
            .await;
        assert!(!run.is_error, "{}", run.text);
        assert_eq!(run.str("stdout"), "42\n");
    }
    let alice_caller = Caller::tenant("alice").unwrap();
    for agent in [&a, &b] {
        let runs = agent
            .test
            .engine()
            .list_runs(
                &alice_caller,
                RunQuery {
                    limit: 10,
                    ..RunQuery::default()
                },
            )
            .await;
        assert_eq!(
            runs.len(),
            2,
            "{} ran {} of the four",
            agent.name,
            runs.len()
        );
    }

    // A session's cells land on the agent that made it: its state persists.
    let session = alice.call("create_session", json!({})).await;
    assert!(!session.is_error, "{}", session.text);
    let id = session.str("session_id").to_owned();
    for _ in 0..3 {
        alice
            .call(
                "execute_python",
                json!({"script": "x = globals().get('x', 0) + 1", "session_id": id}),
            )
            .await;
    }
    let cell = alice
        .call(
            "execute_python",
            json!({"script": "print(x)", "session_id": id}),
        )
        .await;
    assert_eq!(cell.str("stdout"), "3\n", "{}", cell.text);
    let written = alice
        .call(
            "write_file",
            json!({"session_id": id, "path": "in.txt", "content": "hi"}),
        )
        .await;
    assert!(!written.is_error, "{}", written.text);
    let command = alice
        .call(
            "run_command",
            json!({"session_id": id, "command": "cat in.txt"}),
        )
        .await;
    assert_eq!(command.str("stdout"), "hi", "{}", command.text);

    // A front restarted (a fresh directory) still finds the session, on its agent.
    let restarted = front(&[&a, &b], &key, &host);
    let alice_again = mcp_as(&restarted, "alice").await;
    let cell = alice_again
        .call(
            "execute_python",
            json!({"script": "print(x)", "session_id": id}),
        )
        .await;
    assert_eq!(cell.str("stdout"), "3\n", "{}", cell.text);

    // Another tenant sees none of it, through either front.
    let bob = mcp_as(&restarted, "bob").await;
    let listed = bob.call("list_sessions", json!({})).await;
    assert_eq!(listed.structured["sessions"], json!([]), "{}", listed.text);
    let stolen = bob
        .call(
            "execute_python",
            json!({"script": "print(x)", "session_id": id}),
        )
        .await;
    assert!(stolen.is_error, "{}", stolen.text);
    assert_eq!(
        stolen.structured["error"]["kind"], "not_found",
        "{}",
        stolen.text
    );
    let listed = alice_again.call("list_sessions", json!({})).await;
    assert_eq!(listed.structured["sessions"][0]["session_id"], id.as_str());

    // The session's other calls, each over its own route: files, packages (an install's
    // answer is a streamed one), validation, the report, reset and delete.
    let listed = alice_again
        .call("list_files", json!({"session_id": id, "depth": 1}))
        .await;
    assert!(listed.text.contains("in.txt"), "{}", listed.text);
    let read = alice_again
        .call("read_file", json!({"session_id": id, "path": "in.txt"}))
        .await;
    assert_eq!(read.str("content"), "hi", "{}", read.text);
    let nothing = alice_again
        .call(
            "install_packages",
            json!({"session_id": id, "packages": []}),
        )
        .await;
    assert!(nothing.is_error, "{}", nothing.text);
    assert!(
        nothing.text.contains("No packages given"),
        "{}",
        nothing.text
    );
    let packages = alice_again
        .call("list_packages", json!({"session_id": id}))
        .await;
    assert_eq!(packages.str("session_id"), id, "{}", packages.text);
    let checked = alice_again
        .call("validate_script", json!({"script": "print('hi'"}))
        .await;
    assert_eq!(checked.structured["valid"], false, "{}", checked.text);
    let report = alice_again.call("check_environment", json!({})).await;
    assert_eq!(
        report.structured["tenant"]["name"], "alice",
        "{}",
        report.text
    );
    let reset = alice_again
        .call("reset_session", json!({"session_id": id}))
        .await;
    assert!(!reset.is_error, "{}", reset.text);
    let cell = alice_again
        .call(
            "execute_python",
            json!({"script": "print('x' in globals())", "session_id": id}),
        )
        .await;
    assert_eq!(cell.str("stdout"), "False\n", "{}", cell.text);

    // Runs and artifacts are found on whichever agent has them.
    let run = alice
        .call(
            "execute_python",
            json!({"script": "open('out.txt', 'w').write('saved')"}),
        )
        .await;
    let uri = run.structured["artifacts"][0]["uri"]
        .as_str()
        .unwrap()
        .to_owned();
    let contents = alice.read_resource(&uri).await.unwrap();
    assert_eq!(serde_json::to_value(&contents).unwrap()[0]["text"], "saved");
    let closed = alice
        .call("delete_session", json!({"session_id": id}))
        .await;
    assert!(!closed.is_error, "{}", closed.text);
    let gone = alice
        .call("execute_python", json!({"script": "1", "session_id": id}))
        .await;
    assert_eq!(
        gone.structured["error"]["kind"], "not_found",
        "{}",
        gone.text
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_refuses_every_call_without_a_valid_token_and_runs_nothing() {
    let (dir, key) = keypair();
    let (other_dir, other_key) = keypair();
    let _ = other_dir;
    let a = start_agent("agent-a", &public_key(&dir)).await;
    let execute = serde_json::to_value(ExecuteRequest {
        script: "print('ran')".into(),
        ..ExecuteRequest::default()
    })
    .unwrap();
    let now = SystemTime::now();
    let minute = Duration::from_secs(60);
    let cases: Vec<(&str, Option<String>)> = vec![
        ("no token", None),
        ("not a token", Some("sbx_not-a-jwt".into())),
        (
            "expired",
            Some(
                key.sign(
                    "agent-a",
                    "alice",
                    None,
                    minute,
                    now - Duration::from_secs(180),
                )
                .unwrap(),
            ),
        ),
        (
            "for another agent",
            Some(key.sign("agent-b", "alice", None, minute, now).unwrap()),
        ),
        (
            "signed by another key",
            Some(
                other_key
                    .sign("agent-a", "alice", None, minute, now)
                    .unwrap(),
            ),
        ),
        (
            "for a session, not a one-shot run",
            Some(
                key.sign("agent-a", "alice", Some("s-1"), minute, now)
                    .unwrap(),
            ),
        ),
    ];
    for (what, token) in &cases {
        let (status, body) = post(&a.url, protocol::EXECUTE, token.as_deref(), &execute).await;
        assert_eq!(status, 401, "{what}: {body}");
        assert_eq!(body["error"], "unauthorized", "{what}: {body}");
        assert!(
            !body["hint"].as_str().unwrap_or("").is_empty(),
            "{what}: {body}"
        );
    }
    // A replayed token: accepted once, refused the second time.
    let token = key.sign("agent-a", "alice", None, minute, now).unwrap();
    let (status, _) = post(&a.url, protocol::LIST_SESSIONS, Some(&token), &json!(null)).await;
    assert_eq!(status, 200);
    let (status, body) = post(&a.url, protocol::LIST_SESSIONS, Some(&token), &json!(null)).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("used before"),
        "{body}"
    );

    // Nothing ran; and the agent is alive: a good token runs.
    let alice = Caller::tenant("alice").unwrap();
    let runs = a
        .test
        .engine()
        .list_runs(
            &alice,
            RunQuery {
                limit: 10,
                ..RunQuery::default()
            },
        )
        .await;
    assert!(runs.is_empty(), "{runs:?}");
    let token = key.sign("agent-a", "alice", None, minute, now).unwrap();
    let (status, body) = post(&a.url, protocol::EXECUTE, Some(&token), &execute).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["stdout"], "ran\n", "{body}");
    // The probes need no token.
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let health = client
        .get(format!("{}/healthz", a.url).parse().unwrap())
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_streams_its_output_and_stops_when_the_front_goes_away() {
    let (dir, key) = keypair();
    let a = start_agent("agent-a", &public_key(&dir)).await;
    let host = TestEngine::new().await;
    let remote = RemoteEngine::new(
        "agent-a",
        &a.url,
        Arc::clone(&key),
        Arc::clone(EngineHandle::from(Arc::clone(host.engine())).host()),
    )
    .unwrap();
    let alice = Caller::tenant("alice").unwrap();

    // Output arrives while the run goes, before its result.
    let (sink, mut chunks) = tokio::sync::mpsc::unbounded_channel();
    let request = ExecuteRequest {
        script: "import time\nprint('first', flush=True)\ntime.sleep(0.5)\nprint('second')".into(),
        ..ExecuteRequest::default()
    };
    let result = remote
        .execute(&alice, request, CancellationToken::new(), Some(sink))
        .await;
    assert_eq!(result.stdout, "first\nsecond\n", "{result:?}");
    let mut streamed = String::new();
    while let Ok(chunk) = chunks.try_recv() {
        streamed.push_str(&chunk.text);
    }
    assert_eq!(streamed, "first\nsecond\n");

    // A cancelled call closes its connection: the agent stops the run.
    let cancel = CancellationToken::new();
    let request = ExecuteRequest {
        script: "import time\ntime.sleep(30)".into(),
        ..ExecuteRequest::default()
    };
    let started = std::time::Instant::now();
    let stopper = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(800)).await;
        stopper.cancel();
    });
    let result = remote.execute(&alice, request, cancel, None).await;
    assert_eq!(result.status.as_str(), "cancelled", "{result:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // On the agent, the run ended cancelled, well before its 30 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let runs = a
            .test
            .engine()
            .list_runs(
                &alice,
                RunQuery {
                    limit: 10,
                    ..RunQuery::default()
                },
            )
            .await;
        let last = runs.first().map(|run| run.status.clone());
        if last.as_deref() == Some("cancelled") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the agent's run: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_front_cancels_its_calls_on_the_agents_and_reports_their_readiness() {
    use snakebox_engine::{EngineHost, StopReason};
    let (dir, key) = keypair();
    let a = start_agent("agent-a", &public_key(&dir)).await;
    let host = TestEngine::new().await;
    let local = EngineHandle::from(Arc::clone(host.engine()));
    let remote = RemoteEngine::new(
        "agent-a",
        &a.url,
        Arc::clone(&key),
        Arc::clone(local.host()),
    )
    .unwrap();
    // An agent that is not there: the front is ready while one agent is, and says which is not.
    let gone = RemoteEngine::new(
        "agent-gone",
        "http://127.0.0.1:9",
        Arc::clone(&key),
        Arc::clone(local.host()),
    )
    .unwrap();
    // And one this front names otherwise than it was started: every call would be refused.
    let misnamed = RemoteEngine::new(
        "agent-z",
        &a.url,
        Arc::clone(&key),
        Arc::clone(local.host()),
    )
    .unwrap();
    let directory = StaticDirectory::new(vec![remote, gone, misnamed]).unwrap();
    let routed = Arc::new(Routed::new(Arc::new(directory), Arc::clone(local.host())));
    routed.watch_readiness().await;
    let report = EngineHost::report(routed.as_ref());
    assert!(report.ready, "{:?}", report.problems);
    assert_eq!(report.problems.len(), 2, "{:?}", report.problems);
    assert!(
        report.problems[0].contains("agent-gone"),
        "{:?}",
        report.problems
    );
    assert!(
        report.problems[1].contains("named `agent-a`")
            && report.problems[1].contains("--agents agent-a="),
        "{:?}",
        report.problems
    );

    let alice = Caller::tenant("alice").unwrap();
    let running = tokio::spawn({
        let (routed, alice) = (Arc::clone(&routed), alice.clone());
        async move {
            let request = ExecuteRequest {
                script: "import time\ntime.sleep(30)".into(),
                ..ExecuteRequest::default()
            };
            routed
                .execute(&alice, request, CancellationToken::new(), None)
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    routed.begin_shutdown(StopReason::Requested);
    assert_eq!(routed.wait_idle(Duration::from_secs(10)).await, 0);
    let result = running.await.unwrap();
    assert_eq!(result.status.as_str(), "cancelled", "{result:?}");
    let refused = routed
        .execute(
            &alice,
            ExecuteRequest {
                script: "print(1)".into(),
                ..ExecuteRequest::default()
            },
            CancellationToken::new(),
            None,
        )
        .await;
    let error = refused.error.expect("refused");
    assert!(error.message.contains("stopping"), "{error:?}");
}
