//! A tool's answer is shaped as its caller's host work (issue 32, item 1): turning a listing of
//! thousands of entries or a megabyte of output into text and JSON costs in proportion to
//! what the caller asked for, so it runs on the engine's host-work threads in the caller's
//! name, counted against that tenant's part of them, not on the runtime's workers beside
//! every other tenant's requests.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use snakebox_engine::{
    Caller, Engine, EngineConfig, EngineError, EngineHandle, EngineHost, EnvironmentReport,
    StopReason,
};
use snakebox_server::SnakeboxServer;
use snakebox_test::TestEngine;
use snakebox_test::mcp::McpClient;

/// What the face asked of the host: (tenant, action, the thread the work ran on).
type Asked = Arc<Mutex<Vec<(String, String, String)>>>;

/// The engine's host, recording each piece of host work a face hands it.
struct Recording {
    engine: Arc<Engine>,
    asked: Asked,
}

#[async_trait::async_trait]
impl EngineHost for Recording {
    fn config(&self) -> &EngineConfig {
        EngineHost::config(self.engine.as_ref())
    }
    fn artifact_retention(&self) -> String {
        EngineHost::artifact_retention(self.engine.as_ref())
    }
    fn report(&self) -> EnvironmentReport {
        EngineHost::report(self.engine.as_ref())
    }
    fn publish_gauges(&self) {
        EngineHost::publish_gauges(self.engine.as_ref());
    }
    fn begin_shutdown(&self, reason: StopReason) {
        EngineHost::begin_shutdown(self.engine.as_ref(), reason);
    }
    async fn wait_idle(&self, deadline: Duration) -> usize {
        EngineHost::wait_idle(self.engine.as_ref(), deadline).await
    }
    async fn host_work(
        &self,
        caller: &Caller,
        action: &str,
        work: Box<dyn FnOnce() + Send>,
    ) -> Result<(), EngineError> {
        let asked = Arc::clone(&self.asked);
        let (tenant, action) = (caller.id().to_owned(), action.to_owned());
        let recorded = Box::new(move || {
            let thread = std::thread::current().name().unwrap_or("").to_owned();
            asked.lock().unwrap().push((tenant, action, thread));
            work();
        });
        EngineHost::host_work(self.engine.as_ref(), caller, "record", recorded).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_is_shaped_as_its_callers_host_work() {
    let test = TestEngine::new().await;
    let asked = Asked::default();
    let host = Recording {
        engine: Arc::clone(test.engine()),
        asked: Arc::clone(&asked),
    };
    let handle = EngineHandle::new(test.engine().clone(), Arc::new(host));
    let caller = Caller::tenant("acme").unwrap();
    let mcp = McpClient::connect_to(SnakeboxServer::for_caller(handle, caller)).await;

    let shaped = |asked: &Asked| asked.lock().unwrap().len();
    let run = mcp
        .call("execute_python", json!({"script": "print('hi')"}))
        .await;
    assert_eq!(run.str("stdout"), "hi\n", "{}", run.text);
    assert_eq!(shaped(&asked), 1, "a run's answer");

    let session = mcp.call("create_session", json!({})).await;
    assert!(!session.is_error, "{}", session.text);
    let id = session.str("session_id").to_owned();
    assert_eq!(shaped(&asked), 2, "a session's answer");
    let cell = mcp
        .call(
            "execute_python",
            json!({"script": "print(1)", "session_id": id}),
        )
        .await;
    assert_eq!(cell.str("stdout"), "1\n", "{}", cell.text);
    assert_eq!(shaped(&asked), 3, "a cell's answer");
    let listed = mcp.call("list_files", json!({"session_id": id})).await;
    assert!(!listed.is_error, "{}", listed.text);
    let sessions = mcp.call("list_sessions", json!({})).await;
    assert!(sessions.text.contains(&id), "{}", sessions.text);
    // An error is not shaped on the host: it is a line of text.
    let missing = mcp
        .call("list_files", json!({"session_id": "s-0000000000000000"}))
        .await;
    assert!(missing.is_error, "{}", missing.text);

    let asked = asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 5, "{asked:?}");
    for (tenant, action, thread) in &asked {
        assert_eq!(tenant, "acme", "in the caller's name: {asked:?}");
        assert_eq!(action, "shape the answer", "{asked:?}");
        assert!(
            thread.starts_with("snakebox-host-"),
            "on a host-work thread, not a runtime worker: {asked:?}"
        );
    }
    mcp.close().await;
}
